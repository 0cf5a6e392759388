"""Where each figure the README's prose quotes comes from (checked by figures_prose.py).

``TIES``: a quote of the prose, the artifacts it comes from and a function that computes the figures'
text from them. ``SHOWN``: sections that retell one recorded run and the artifact that holds its
text. ``UNTIED``: figures with no artifact to check, each with why; the README's debt, to shrink.
Quotes are written with the README's whitespace squashed to single spaces.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Tie:
    quote: str  # a piece of the README's prose (whitespace as one space) holding the figures
    artifacts: tuple[str, ...]  # paths from the repository root
    figures: Callable[..., list[str]]  # the loaded artifacts -> the figures' text, each must be in the quote


@dataclass(frozen=True)
class Untied:
    quote: str
    why: str


def load(path: str, root: Path = ROOT) -> dict:
    return json.loads((root / path).read_text(encoding="utf-8"))


# ---- ties: figures the prose takes from an artifact that no block shows in that form ---------------

def _q4_alternatives_range(r: dict) -> list[str]:
    """PyTorch's int4 and int8 kernels' time per product over this project's kernel, same shape and rows."""
    ours = r["results"]["hispec_q4_1"]
    ratios = [per[rows]["ms"] / ours[shape][rows]["ms"]
              for name in ("torch_int4pack", "torch_int8pack") for shape, per in r["results"][name].items()
              if "error" not in per for rows in per]
    return [f"{min(ratios):.0f}-{max(ratios):.0f}×"]


def _fp32_over_q4_bytes(r: dict) -> list[str]:
    b = r["memory_bound"]
    return [f"{b['fp32']['weight_bytes'] / b['q4']['weight_bytes']:.1f}×"]


def _q4_goals(r: dict) -> list[str]:
    import q4_goals

    return [f"{q4_goals.ratios(r)['q4_hispec_over_llamacpp_lookup']:.2f}×"]


def _lookup_lengths(r: dict) -> list[str]:
    import q4_goals

    return [f"{q4_goals.geomean_ratio(r, f'llamacpp_lookup:{n}', 'llamacpp'):.2f}×" for n in (2, 4, 10)]


def _q4_hispec_gain(r: dict) -> list[str]:
    import q4_goals

    return [f"{q4_goals.ratios(r)['q4_hispec_over_q4_ar']:.2f}×"]


Q4_PROFILES = ("assets/bench/q4_profile_avx512.json", "assets/bench/q4_profile_avx2.json")


def _step(p: dict, n: str, route: str) -> float:
    return p["tokens"][n][route]["step_ms_median"]


def _native_against_op_by_op(avx512: dict, avx2: dict) -> list[str]:
    return [f"{_step(avx512, '1', 'q4_native'):.1f} ms", f"{_step(avx512, '1', 'q4'):.1f} ms",
            f"{_step(avx2, '1', 'q4'):.1f} ms"]  # the AVX2 native step (unitless in the prose) is in the block


def _native_parts(p: dict) -> list[str]:
    one = p["tokens"]["1"]
    native = one["q4_native"]
    rest = native["step_ms_median"] - sum(native["native_phases_ms"].values())
    return [f"{native['step_ms_median']:.1f} ms", f"{rest:.1f} ms", f"{one['q4']['split_ms']['head']:.1f} ms"]


def _q4_bound(r: dict) -> list[str]:
    return [f"{r['memory_bound']['q4']['bound_ms']:.1f} ms"]


def _eight_over_one(p: dict) -> list[str]:
    q8, q1 = _step(p, "8", "q4_native"), _step(p, "1", "q4_native")
    f8, f1 = _step(p, "8", "fp32"), _step(p, "1", "fp32")
    return [f"{q8:.1f} ms", f"{q1:.1f} ms", f"{q8 / q1:.1f}×", f"{f1:.1f} ms", f"{f8 / f1:.2f}×"]


def _min_gain() -> list[str]:
    from hispec.engine.planning.policy import LOOKUP_MIN_GAIN, MIN_GAIN

    return [f"{MIN_GAIN:.2f}×", f"{LOOKUP_MIN_GAIN:.2f}×"]


def _policy_margins() -> list[str]:
    """docs/DESIGN.md's policy constants, as hispec/engine/planning/policy.py sets them."""
    from hispec.engine.planning.policy import LOOKUP_MIN_GAIN, MIN_GAIN, WORSE_THAN_PLAIN

    return [f"{WORSE_THAN_PLAIN:g}x", f"{MIN_GAIN:.2f}x", f"{LOOKUP_MIN_GAIN:.2f}x"]


def _x12_against_default(r: dict) -> list[str]:
    """The layers sweep: the range over the pairs with verifier 12, and the default pair (2, 4)."""
    from hispec.evaluation.sweep import summarise_sweep

    cells = summarise_sweep(r)["grids"]["layers"]["cells"]
    at12 = sorted(c["speedup_geomean"] for c in cells if c["verify_layer"] == 12)
    default = next(c["speedup_geomean"] for c in cells if (c["draft_layer"], c["verify_layer"]) == (2, 4))
    return [f"{at12[0]:.2f}–{at12[-1]:.2f}×", f"{default:.2f}×"]


def _teaching_lengths(r: dict) -> list[str]:
    """The lengths sweep's cell at the Teaching preset's lengths (draft_len 2, threshold 4) at exits (2, 4)."""
    from hispec.evaluation.sweep import summarise_sweep

    cells = summarise_sweep(r)["grids"]["lengths"]["cells"]
    return [f"{next(c for c in cells if (c['draft_len'], c['verify_threshold']) == (2, 4))['speedup_geomean']:.2f}×"]


def _paired(r1: dict, r2: dict) -> list[str]:
    """Layerskip at exit 2 against exit 4, prompt by prompt, at draft_len 1 and 2."""
    out = []
    for r in (r1, r2):
        tps = _by_prompt(r)
        a, b = tps["2/fixed"], tps["4/fixed"]
        out.append(f"{_geomean(a[k] / b[k] for k in a if k in b):.3f}×")
    return out


def _trained_agreement(manifest: dict) -> list[str]:
    agree = manifest["evaluation"]["agreement"]
    return [f"{agree['2']['trained']:.0%}"[:-1] + "–" + f"{agree['4']['trained']:.0%}"]


def _published_ranges(_data: dict) -> list[str]:
    """The published points' per-token acceptance and speedup, as the page's chart plots them."""
    from hispec.evaluation.published import load

    points = load(ROOT / "assets" / "published_points.json")
    xs, ys = [p["x"] for p in points], [p["y"] for p in points]
    return [f"{min(xs):.0%}"[:-1] + f"-{max(xs):.0%}", f"{min(ys):.2f}-{max(ys):.1f}×"]


def _per_prompt_range(r: dict) -> list[str]:
    """hispec/auto's per-prompt ratios to autoregressive: on the report split, on the summaries, and
    the geometric means over all prompts and over the summaries."""
    tps = _by_prompt(r)
    ratios = {k: v / tps["autoregressive"][k] for k, v in tps["hispec/auto"].items()}
    report = [v for (s, _), v in ratios.items() if s != "summarize"]
    summaries = [v for (s, _), v in ratios.items() if s == "summarize"]
    return [f"{min(report):.2f}-{max(report):.2f}×", f"{min(summaries):.2f}-{max(summaries):.2f}×",
            f"{_geomean(ratios.values()):.2f}×", f"{_geomean(summaries):.2f}×"]


def _level_shares(r: dict) -> list[str]:
    """The share of the wall time in each level's layer passes, over all prompts (stage_s / wall_s)."""
    out = []
    for method, stages in (("hispec/auto", ("target", "draft", "verify", "prefill")),
                           ("hispec/fixed", ("target", "draft", "verify", "prefill"))):
        rows = [x for x in r["records"] if x["method"] == method]
        wall = sum(x["wall_s"] for x in rows)
        out += [f"{sum(x['stage_s'].get(s, 0) for x in rows) / wall:.0%}" for s in stages]
    return out


def _priors_against_guesses(manifest: dict) -> list[str]:
    from hispec.engine.planning.policy import LOOKUP_UNMEASURED

    shipped = manifest["policy_priors"]
    lookup = sorted(shipped["lookup"].values())
    guesses = sorted(LOOKUP_UNMEASURED.values())
    agree = manifest["evaluation"]["agreement"]
    return [f"{lookup[0]:.0%}"[:-1] + f"-{lookup[-1]:.0%}", f"{guesses[0]:.0%}"[:-1] + f"-{guesses[-1]:.0%}",
            f"{shipped['exits']['2-4']:.1%}", f"{agree['2']['trained']:.1%}",
            f"{shipped['exits']['4-target']:.1%}", f"{agree['4']['trained']:.1%}"]


def _heldout_acceptance(r: dict) -> list[str]:
    s = r["summary"]
    return [f"{s['all']['methods']['hispec']['acceptance']['draft->verify']:.0%}",
            f"{s['heldout-humaneval']['methods']['layerskip']['acceptance']['draft->target']:.0%}",
            f"{s['heldout-mtbench']['methods']['layerskip']['acceptance']['draft->target']:.0%}"]


def _cold_over_hot_heads(p: dict) -> list[str]:
    """An exit head timed after a full step against the same head called again and again."""
    return sorted({f"{p['heads_ms'][k] / p['heads_hot_ms'][k]:.0f}×" for k in p["heads_ms"] if k != "final"})


def _two_tokens_over_one(p: dict) -> list[str]:
    return [f"{p['stock_layers_full_step_ms']['2'] / p['stock_layers_full_step_ms']['1']:.1f}×",
            f"{p['full_step_ms']['2'] / p['full_step_ms']['1']:.1f}×"]


def _layers_over_two_tokens(t: dict) -> list[str]:
    """Layerskip's pass of layers [4, 30) over 2 tokens against a plain step's [0, 30), per layer."""
    two = t["methods"]["layerskip"]["calls"]["layers [4,30) x2"]["ms_per_call"] / 26
    one = t["methods"]["autoregressive"]["calls"]["layers [0,30) x1"]["ms_per_call"] / 30
    return [f"{two / one - 1:.0%}"]


def _old_default_behind_q4(first_fresh: dict) -> list[str]:
    """The first heldout-fresh run: the default of then (lookup,full@q4) over plain q4 decoding."""
    import choice_record

    return [f"{choice_record.old_default_over_plain_q4(first_fresh)['geomean']:.2f}×"]


def _choice_record(tune: dict, fresh: dict) -> list[str]:
    """a8's list over q4's on both splits, with the bootstrap intervals (scripts/docs/choice_record.py)."""
    import choice_record

    out = []
    for report, path in ((tune, choice_record.TUNE), (fresh, choice_record.FRESH)):
        r = choice_record.a8_over_q4(report, path)
        out += [f"{r['geomean']:.3f}×", f"{r['low']:.2f}–{r['high']:.2f}×"]
    return out


def _fp32_step_floors(*reports: dict) -> list[str]:
    """The float32 step over its two floors (memory_bound.fp32): the float32 products' and the read's."""
    def span(key: str, digits: int) -> str:
        values = [r["memory_bound"]["fp32"][key] for r in reports]
        low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
        return f"{low}×" if low == high else f"{low}–{high}×"

    return [span("step_over_matvec_bound", 2), span("step_over_bound", 1)]


def _fp32_torch_step_floors(*reports: dict) -> list[str]:
    """_fp32_step_floors of the float32 route through torch's products (memory_bound['fp32-torch'])."""
    return _fp32_step_floors(*({**r, "memory_bound": {"fp32": r["memory_bound"]["fp32-torch"]}} for r in reports))


def _summary(report: dict) -> dict:
    from hispec.evaluation.bench import summarise
    from hispec.evaluation.method import BenchMethod

    return summarise(report["records"], [BenchMethod.parse(m) for m in report["methods"]])["all"]["methods"]


def _by_prompt(report: dict) -> dict[str, dict]:
    tps: dict[str, dict] = {}
    for rec in report["records"]:
        tps.setdefault(rec["method"], {})[(rec["set"], rec["prompt_id"])] = rec["tokens_per_s"]
    return tps


def _geomean(values) -> float:
    values = list(values)
    return math.exp(statistics.mean(map(math.log, values)))


def _sub_lists(r: dict) -> list[str]:
    """The hierarchy over its two-level sub-list, prompt by prompt, per set: fixed rounds
    (hispec/fixed over 2/fixed), then auto (hispec/auto over lookup+4/auto) and auto on the whole."""
    tps = _by_prompt(r)
    sets = ("heldout-report-humaneval", "heldout-report-mtbench", "heldout-report-sharegpt", "summarize")

    def ratio(a, b, s=None):
        return _geomean(tps[a][k] / tps[b][k] for k in tps[a] if k in tps[b] and (s is None or k[0] == s))

    return ([f"{ratio('hispec/fixed', '2/fixed', s):.2f}×" for s in sets]
            + [f"{ratio('hispec/auto', 'lookup+4/auto', s):.2f}×" for s in sets]
            + [f"{ratio('hispec/auto', 'lookup+4/auto'):.2f}×"])


def _heldout_rates(r: dict) -> list[str]:
    s = r["summary"]["all"]["methods"]
    return [f"{s['layerskip']['acceptance']['draft->target']:.0%}", f"{s['hispec']['acceptance']['verify->target']:.0%}"]


def _agreement(manifest: dict, *exits: str) -> list[str]:
    agree = manifest["evaluation"]["agreement"]
    return [f"{agree[e]['trained']:.0%}" for e in exits]


def _hf_generate(r: dict) -> list[str]:
    return [f"{_summary(r)['hf_generate']['vs_reference']['geomean']:.2f}×"]


def _timed_against_bench(t: dict, bench: dict) -> list[str]:
    m = t["methods"]
    return [f"{m['autoregressive']['ms_per_token'] / m['layerskip']['ms_per_token']:.2f}×",
            f"{_summary(bench)['layerskip']['vs_reference']['geomean']:.2f}×"]


def _verifier_acceptance(r: dict) -> list[str]:
    from hispec.evaluation.sweep import summarise_sweep

    cells = {(c["draft_layer"], c["verify_layer"]): c for c in summarise_sweep(r)["grids"]["layers"]["cells"]}
    return [f"{cells[(2, v)]['acceptance']['verify->target']:.0%}" for v in (12, 4)]


def _recorded_rate(a: dict) -> list[str]:
    return [f"{a['patterns']['layerskip']['rates']['target']:.0%}"]


def _lean_step(p: dict) -> list[str]:
    return [f"{p['full_step_ms']['1']:.1f} ms"]


def _head_costs(t: dict) -> list[str]:
    """Inside a generation: the reduced-vocabulary exit head per call, its attention step, the full LM head."""
    lay, plain = t["methods"]["layerskip"]["calls"], t["methods"]["autoregressive"]["calls"]
    return [f"{lay['exit 4 head']['ms_per_call']:.2f} ms", f"{lay['attention step 4']['ms_per_call']:.2f} ms",
            f"{plain['final head']['ms_per_call']:.1f} ms"]


def _medians(r: dict) -> list[str]:
    s = _summary(r)
    return [f"{s['autoregressive']['tokens_per_s']:.0f} tok/s", f"{s['hf_generate']['tokens_per_s']:.1f} tok/s"]


def _gpu_steps(g: dict) -> list[str]:
    """Per-stage step costs on the 1B and 7B shapes: a full pass over 1 and 8 tokens, a draft pass."""
    one, seven = (t["step_ms"] for t in g["timings"])
    return [f"{one['1']['full_pass_0_to_L']:.1f} ms", f"{one['8']['full_pass_0_to_L']:.1f} ms",
            f"{seven['1']['full_pass_0_to_L']:.0f} ms", f"{seven['8']['full_pass_0_to_L']:.0f} ms",
            f"{one['1']['draft_pass_d']:.1f} ms", f"{seven['1']['draft_pass_d']:.1f} ms"]


TIES = (
    Tie("but take 11-92× as long per product here", ("assets/bench/q4_alternatives_cpu.json",),
        _q4_alternatives_range),
    Tie("is faster than both but reads 5.6× the bytes", ("assets/bench/q4_cpu_default.json",), _fp32_over_q4_bytes),
    Tie("(goal 1.3×) and at 1.49× llama.cpp with its own lookup", ("assets/bench/q4_cpu_default.json",), _q4_goals),
    Tie("hispec gains only 1.03× over 4-bit plain decoding", ("assets/bench/q4_cpu_default.json",), _q4_hispec_gain),
    Tie("proposing 2, 4 and 10 tokens ran at 0.81×, 0.71× and 0.52× of llama.cpp's plain decoding",
        ("assets/bench/llamacpp_lookup_tune.json",), _lookup_lengths),
    Tie("a 1-token step takes 8.2 ms against 14.1 ms (AVX-512), 11.4 against 21.7 ms (AVX2)", Q4_PROFILES,
        _native_against_op_by_op),
    Tie("The products take 4.7 of the native step's 8.2 ms, and the rest (3.0 ms) is mostly the 8-bit LM head "
        "(2.1 ms op by op)", Q4_PROFILES[:1], _native_parts),
    Tie("Reading the weights would take 1.8 ms", ("assets/bench/q4_cpu_default.json",), _q4_bound),
    Tie("A pass over 8 tokens costs 26.5 ms in 4-bit against 8.2 ms for one (3.2×), but 47.0 against 40.2 ms in "
        "float32 (1.17×)", Q4_PROFILES[:1], _eight_over_one),
    Tie("an exit's plan must be expected to beat a plain step by 1.15×, a lookup copy by 1.05×", (), _min_gain),
    Tie("a kind measured below 0.9x plain decoding", (), lambda: _policy_margins()[:1]),
    Tie("`MIN_GAIN` (1.15x)", (), lambda: _policy_margins()[1:2]),
    Tie("`LOOKUP_MIN_GAIN` (1.05x", (), lambda: _policy_margins()[2:]),
    Tie("In the Teaching preset's lengths the tuning split measured it at 0.64× plain decoding",
        ("assets/bench/sweep_cpu_tune_lengths.json",), _teaching_lengths),
    Tie("the (x, 12) pairs ran at 0.93–0.94× against 0.98× for (2, 4)", ("assets/bench/sweep_cpu_tune_layers.json",),
        _x12_against_default),
    Tie("Exit 2 against exit 4, prompt by prompt: 1.125× at draft_len 1 (standard error of the mean log ratio "
        "0.065) and 1.067× at draft_len 2",
        ("assets/bench/layerskip_cpu_tune_len1.json", "assets/bench/layerskip_cpu_tune_len2.json"), _paired),
    Tie("lift agreement to 39–41% at layers 2 and 4", ("assets/exits/smollm2-135m-instruct/manifest.json",),
        _trained_agreement),
    Tie("Those sit at 79-95% per-token acceptance and 1.34-2.0× on GPUs", ("assets/published_points.json",),
        _published_ranges),
    Tie("(per prompt 1.06-2.39× on the report split, 1.13-3.06× on the summaries): 1.53× on the whole (goal 1.15×) "
        "and 1.72× on the summaries", ("assets/bench/levels_cpu_report.json",), _per_prompt_range),
    Tie("hispec/auto 51% full model, 8% exit 2, 5% exit 4, 21% prefill; hispec/fixed 51%, 9%, 8%, 13%",
        ("assets/bench/levels_cpu_report.json",), _level_shares),
    Tie("lookup copies at 37-89% by match length instead of guessed 25-50%, so it copies sooner; exit 2 judged by "
        "exit 4 from 59.5% instead of 38.8%, exit 4 judged by the full model from 37.6% instead of 40.5%",
        ("assets/exits/smollm2-135m-instruct/manifest.json",), _priors_against_guesses),
    Tie("In hispec, 61% of drafts passed the verifier", ("assets/bench/bench_cpu_default.json",),
        lambda r: _heldout_acceptance(r)[:1]),
    Tie("HumanEval is the most predictable set (48%) and MT-Bench the least (31%)",
        ("assets/bench/bench_cpu_default.json",), lambda r: _heldout_acceptance(r)[1:]),
    Tie("costs about 3× more there than when called again and again", ("assets/profile/profile_cpu_default.json",),
        _cold_over_hot_heads),
    Tie("which made the exits look 3× cheaper than they are", ("assets/profile/profile_cpu_default.json",),
        _cold_over_hot_heads),
    Tie("a verification pass over 2 tokens costs 1.6× a one-token step (the table), so speculation at ~40% "
        "acceptance loses; on the lean path it costs about 1.1×", ("assets/profile/profile_cpu_default.json",),
        _two_tokens_over_one),
    Tie("(+1.8 ms: 15% more per layer in this run", ("assets/profile/time_split_cpu_default.json",),
        _layers_over_two_tokens),
    Tie("prompt by prompt: 0.94× (HumanEval), 0.92× (MT-Bench), 0.96× (ShareGPT), 0.92× (summaries). Auto, [lookup, "
        "2, 4, full] over [lookup, 4, full]: 1.03×, 1.00×, 0.94×, 0.97× (0.98× on the whole",
        ("assets/bench/levels_cpu_report.json",), _sub_lists),
    Tie("layerskip's drafts were accepted 41% of the time", ("assets/bench/bench_cpu_default.json",),
        lambda r: _heldout_rates(r)[:1]),
    Tie("the full model accepted 41% of what it passed", ("assets/bench/bench_cpu_default.json",),
        lambda r: _heldout_rates(r)[1:]),
    Tie("Deeper verifiers agree more (46% at exit 12)", ("assets/exits/smollm2-135m-instruct/manifest.json",),
        lambda m: _agreement(m, "12")),
    # exit 4's acceptance by the full model in real generations on all 47 held-out prompts
    Tie("far more accurate than 40%", ("assets/gpu/acceptance_default_heldout.json",), _recorded_rate),
    Tie("speculation at ~40% acceptance loses", ("assets/gpu/acceptance_default_heldout.json",), _recorded_rate),
    Tie("transformers' `generate()` runs at 0.43× of ours", ("assets/bench/bench_cpu_default.json",), _hf_generate),
    Tie("came out at 1.01×; the benchmark above measured 1.06×",
        ("assets/profile/time_split_cpu_default.json", "assets/bench/bench_cpu_default.json"), _timed_against_bench),
    Tie("(44% at exit 12, against 37% at exit 4)", ("assets/bench/sweep_cpu_tune_layers.json",), _verifier_acceptance),
    Tie("(about 40% of judged tokens accepted", ("assets/gpu/acceptance_default_heldout.json",), _recorded_rate),
    Tie("a full lean step 13.7 ms on one", ("assets/profile/profile_cpu_default.json",), _lean_step),
    Tie("inside a generation 0.76 ms per call plus 0.35 ms for the attention step, against about 2.4 ms for the full "
        "49,152 rows", ("assets/profile/time_split_cpu_default.json",), _head_costs),
    Tie("autoregressive ran at 57 tok/s in this run and at 68.5 tok/s in release 3's identical run, while "
        "transformers' `generate()` ran at 25.0 tok/s in both", ("assets/bench/bench_cpu_default.json",), _medians),
    Tie("One full pass costs 8.8 ms for 1 token and 10.5 ms for 8 tokens on the 1B shape, and 38 ms for 1 token and "
        "21 ms for 8 tokens on the 7B shape (the 7B figures are noisy). A draft pass of d layers plus its exit costs "
        "1.6 ms (1B) and 5.7 ms (7B)", ("assets/gpu/gpu_check_h200.json",), _gpu_steps),
)

TIES += (
    Tie("0.65–0.69× the time its weights need through float32 matrix-vector products at the run's measured rate, "
        "and 1.9–3.1× the time to read them", ("assets/bench/headline_cpu_fresh_a8.json", "assets/bench/a8_goals_cpu.json",
                                               "assets/bench/a8_goals_cpu_avx2.json"), _fp32_step_floors),
    Tie("on this run's host, 1.32× and 3.1×", ("assets/bench/headline_cpu_fresh2.json",), _fp32_torch_step_floors),
    Tie("at 0.91× plain q4 decoding", ("assets/bench/headline_cpu_fresh.json",), _old_default_behind_q4),
    Tie("on the tuning split 1.048× (95% CI 0.99–1.11×, 23 prompts), on `heldout-fresh` 1.038× (95% CI 0.98–1.10×, "
        "28 prompts)", ("assets/bench/drafter_tune_cpu.json", "assets/bench/headline_cpu_fresh_a8.json"),
        _choice_record),
)

# ---- sections that retell one recorded run ---------------------------------------------------------

SHOWN = {"## Reading the page": "assets/walkthrough.json"}

# ---- figures with no artifact to check them against -------------------------------------------------

GOAL = "a goal set for this path, not a measurement"
HISTORY = "an earlier release's measurement; its artifact is not kept"
TRAINING = "an exit-head training run of an earlier release, or a side experiment; its heads and evaluation are not shipped"
EE_RUN = "the reduced early-exit training run; no adapter and no artifact of it are kept"
PAGE = "shown by the page in the walkthrough's run (its screenshot) but not kept in assets/walkthrough.json"
UNTIED = (
    Untied("95% CI", "the interval's confidence level, a setting of scripts/docs/choice_record.py"),
    Untied("so a plan expected at 1.05x loses", "an example of a plan the margin turns down, not a measurement"),
    Untied("run the same code up to about 5x apart", "hosts seen during development; no artifact records two hosts"),
    Untied("(goal 1.5×)", GOAL), Untied("(the issue's goals were 2.5× for four visitors on the default and 4× for eight on plain a8)", GOAL), Untied("(goal 1.3×)", GOAL),
    Untied("0.71× and 0.87×, at commits 8317dc2 and 4480782",
           "the same command's two previous runs on this host: assets/bench/visitors_cpu.json at those commits"),
    Untied("measured 4-bit plain decoding at 1.20× and 1.27× llama.cpp",
           "the same command's two previous runs on this host: assets/bench/q4_cpu_default.json at commits 48c58cd "
           "and d5b3a92"), Untied("(goal 1.15×)", GOAL),
    Untied("(the goal was at most 1.2×)", GOAL), Untied("(goal: ours at 1.5× or more)", GOAL),
    Untied("We aimed at 35% at the draft exit and 45% at the verifier exit", GOAL),
    Untied("far from the goal (70% at the verifier, 50% at the draft)", GOAL),
    Untied("(the raw exits at layers 8 and 15: 4.0% and 10.5%)", TRAINING),
    Untied("| linear head, own generations and prompts (release 1) | 26.6% | 30.0% | 30.7% | 32.1% | 35.6% | 37.4% |",
           TRAINING),
    Untied("| linear head + teacher-forced text | 27.9% | 30.1% |", TRAINING),
    Untied("| attention head + teacher-forced text (release 2) | 32.6% | 34.0% | 36.4% | 36.6% | 40.2% | 41.4% |",
           TRAINING),
    Untied("not shipped) | 37.4% | 39.2% | 42.0% | – | 44.6% | 45.8% |", TRAINING),
    Untied("release 3's heads agreed 46.1 / 48.8 / 50.6 / 54.7% at exits 2 / 4 / 6 / 12", TRAINING),
    Untied("attention block lifted agreement from 29.8% to 32.1%, or 33.9% with a higher attention learning rate and "
           "longer training; a whole extra decoder layer (with MLP) added nothing (32.0%). Those heads overfitted (66% "
           "on training prompts against 34% held out)", TRAINING),
    Untied("(27.9% and 30.1% at exits 2 and 4)", TRAINING),
    Untied("58.6% at exit 20 and 67.5% at exit 24 (raw: 16.9% and 35.8%)", TRAINING),
    Untied("| untouched default | | 4.2% | 4.1% | 100% | 67.9 |", EE_RUN),
    Untied("| A: ee-scale 1, layer dropout 0.1, lr 5e-4 | 200 (51k) | 15.8% | 17.3% | 66.8% | 103.4 (+52%) |", EE_RUN),
    Untied("| B: ee-scale 0.1, no layer dropout, lr 5e-4 | 80 (20k) | 6.9% | 7.4% | 90.1% | 69.2 (+1.2%) |", EE_RUN),
    Untied("untouched exits agree 4.6% / 4.2%", EE_RUN),
    Untied("(on the default model d 3, v 5 once gave 0% acceptance)", "an observation on raw exits; no artifact"),
    Untied('("19% slower", "7% faster, within noise")', "examples of the page's wording, not measurements"),
    Untied("the trained exit 2 head's first choice was `.` (34%), exit 4's was `.` (37%), and the full model's `,` "
           "(78%)", PAGE),
    Untied("paper's 1.28× needs exits trained to exit early", "the HiSpec paper's reported speedup (another project's)"),
    Untied("40% with release 3's heads, 34% with release 2's", HISTORY),
    Untied("Release 3's heads gave layerskip 1.04× and hispec 0.94× in that run (1.10× and 1.02× in runs without "
           "hf_generate); release 2's, in a like-for-like run, 1.00× and 0.91×", HISTORY),
    Untied("Earlier releases reported layerskip at 1.18× and hispec at 1.16× here", HISTORY),
    Untied("(linear heads: 44% of layerskip's drafts there, 27% on the held-out prompts). On the held-out prompts the "
           "previous linear heads give layerskip 1.04× and hispec 0.86×", HISTORY),
    Untied("hispec/auto went from 1.44× to 1.53× on the whole and from 1.61× to 1.72× on the summaries; hispec/fixed "
           "from 1.04× to 0.97×; layerskip from 1.06× to 1.03×; hf_lookup from 0.70× to 0.50×",
           HISTORY + " (the earlier figures; the later ones are in the block above)"),
    Untied("and said 12%", HISTORY),
    Untied("about 0% in another", HISTORY),
    Untied("within noise (1.06× and 1.07× at 128 tokens)", HISTORY + " (the choice of layerskip's earlier default)"),
    Untied("69 ms on another", "another host's profile; no artifact of it is kept"),
    Untied("245 tokens/s on this 2-core CPU at 64 prompts per batch and 128 new tokens, against 72–78 tokens/s",
           "throughput seen while building the heads; the manifest does not record it"),
    Untied("(0.2 and 0.33 ms when called again and again",
           "no artifact gives these: the profile's repeated-call exit heads take 0.34-0.36 ms (a release-3 figure?)"),
    Untied("at 68.5 tok/s in release 3's", HISTORY),
    Untied("A layerskip round (one full-model pass, 1.41 tokens) cost 22.4 ms, or 1.37 autoregressive steps. Beyond "
           "one plain step it pays: the draft's second pass through [0, 4) (+2.3 ms), the exit head and two attention "
           "steps (+1.5 ms), layers [4, 30) over 2 tokens instead of 1 (+1.8 ms",
           "worked out by hand from the time-split artifact's per-call times; not recomputed here"),
    Untied("and the engine's bookkeeping (+0.4 ms)", "worked out by hand from the time-split artifact; not recomputed"),
    Untied("The engine's own Python is small: 0.3–0.6 ms per token", "the time-split block's last row, rounded by hand"),
)
