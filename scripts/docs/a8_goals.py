"""The 4-bit path's goals (issue 52) from its artifacts, both kernel builds: a bench on the report split
(``bench --weights fp32,q4,a8 --methods autoregressive,hispec/auto@... ,llamacpp``, one per build) and the
pass-width profile (``scripts/measure/q4_widths.py``: steps by pass width against the memory bound, and
plain decoding against the bare step). The 4-bit path measured is ``a8``, the GGUF's blocks with int8
activations (its k-token passes are the cheap ones); ``q4`` (float32 activations) is shown beside it.
Repository tooling, outside the package: the README's generated block (figures.py, "a8-goals")."""

from __future__ import annotations

import re
import statistics

import q4_goals as q

from hispec.evaluation.method import BenchMethod

FMT = "a8"
AR, HS = f"autoregressive@{FMT}", f"hispec/auto@{FMT}"
AR32, HS32, LLAMA = "autoregressive@fp32", "hispec/auto@fp32", "llamacpp"


def _width(widths: dict, isa: str, n: int, fmt: str = FMT, threads: str = "2") -> dict:
    return ((widths.get("threads") or {}).get(threads) or {}).get(str(n), {}).get(f"{isa}/{fmt}") or {}


def _equal(report: dict, method: str, reference: str) -> bool | None:
    """Equal on every prompt both ran; None where none did (not measured)."""
    pairs = q.output_pairs(report, method, reference)
    return all(a == b for a, b in pairs) if pairs else None


def best_read_gbs(*reports: dict) -> float:
    """The highest read bandwidth any of the runs measured (at its start or end): the memory bound is
    stated against the fastest the host was seen to read, never a slow moment of it."""
    return max(r for report in reports for key in ("bandwidth_start", "bandwidth_end")
               for r in [((report.get("host") or {}).get(key) or {}).get("read_gbs")] if r)


def measured(bench: dict, widths: dict, decode: dict | None, isa: str, read_gbs: float) -> dict:
    """Every goal's figure for one build: the bench run on that build, the pass widths of that build from
    `widths`, plain decoding against the step from `decode` (the profile run on that build), and the
    memory bound at `read_gbs`."""
    one = _width(widths, isa, 1)
    bound = widths["weight_bytes"]["step"] / (read_gbs * 1e9) * 1e3
    dec = ((decode or {}).get("decode") or {}).get("2") or {}
    out = {"step_ms": one.get("step_ms"), "bound_ms": bound,
           "step_over_bound": round(one["step_ms"] / bound, 3) if one.get("step_ms") and bound else None,
           "decode_over_step": (dec.get(FMT) or {}).get("decode_over_step") if dec.get("isa") == isa else None,
           "pass8": _width(widths, isa, 8).get("step_over_1"), "pass16": _width(widths, isa, 16).get("step_over_1"),
           "plain_over_llamacpp": q.geomean_ratio(bench, AR, LLAMA),
           "hispec_over_plain": q.geomean_ratio(bench, HS, AR),
           "hispec_over_llamacpp": q.geomean_ratio(bench, HS, LLAMA),
           "hispec_equal": _equal(bench, HS, AR),
           "fp32_hispec_over_plain": q.geomean_ratio(bench, HS32, AR32),
           "fp32_equal": _equal(bench, HS32, AR32)}
    return out


def goals(m: dict) -> list[tuple[str, object, bool | None]]:
    """(goal, the figure as shown, met) for one build's figures."""
    def x(v):
        return None if v is None else f"{v:.2f}×"

    def ok(v, test):
        return None if v is None else bool(test(v))

    equal = {True: "yes", False: "NO", None: None}
    return [
        ("1-token step within 2× of its memory bound", x(m["step_over_bound"]), ok(m["step_over_bound"], lambda v: v <= 2)),
        ("plain decoding per token within 1.15× of that step", x(m["decode_over_step"]),
         ok(m["decode_over_step"], lambda v: v <= 1.15)),
        ("an 8-token pass at most 1.5× a 1-token pass", x(m["pass8"]), ok(m["pass8"], lambda v: v <= 1.5)),
        ("a 16-token pass at most 2× a 1-token pass", x(m["pass16"]), ok(m["pass16"], lambda v: v <= 2)),
        ("4-bit plain decoding at least 1.8× llama.cpp plain", x(m["plain_over_llamacpp"]),
         ok(m["plain_over_llamacpp"], lambda v: v >= 1.8)),
        ("hispec(auto) in 4-bit (lookup alone) at least 1.5× 4-bit plain", x(m["hispec_over_plain"]),
         ok(m["hispec_over_plain"], lambda v: v >= 1.5)),
        ("hispec(auto) in 4-bit (lookup alone) at least 2.5× llama.cpp plain", x(m["hispec_over_llamacpp"]),
         ok(m["hispec_over_llamacpp"], lambda v: v >= 2.5)),
        ("hispec(auto) in 4-bit (lookup alone) equal to 4-bit plain on every prompt", equal[m["hispec_equal"]], m["hispec_equal"]),
        ("float32 hispec(auto) at least 3× float32 plain", x(m["fp32_hispec_over_plain"]),
         ok(m["fp32_hispec_over_plain"], lambda v: v >= 3)),
        ("float32 hispec(auto) equal to plain float32 on every prompt", equal[m["fp32_equal"]], m["fp32_equal"]),
    ]


def _verdict(shown, met) -> str:
    if shown is None:
        return "not measured"
    return f"{shown} {'(met)' if met else '(**missed**)'}"


def _agreement(bench: dict) -> str:
    """How far each 4-bit output goes from float32 and from llama.cpp's, prompt by prompt."""
    parts = []
    for a, b, words in ((AR, AR32, "a8 output from float32"), ("autoregressive@q4", AR32, "q4 output from float32"),
                        (AR, LLAMA, "a8 output from llama.cpp's (same file)"),
                        ("autoregressive@q4", LLAMA, "q4 output from llama.cpp's")):
        firsts = [q.first_difference(x, y) for x, y in q.output_pairs(bench, a, b)]
        if not firsts:
            continue
        differ = [f for f in firsts if f is not None]
        where = f", median first difference at token {statistics.median(differ) + 1:.0f}" if differ else ""
        parts.append(f"{words}: differs on {len(differ)} of {len(firsts)} prompts{where}")
    return "; ".join(parts)


def a8_goals_table(bench: dict, bench_avx2: dict, widths: dict, widths_avx2: dict) -> str:
    """Speeds of the AVX-512 run, then the goals for both builds, with the roofline and agreement."""
    from figures_tables import _table, _x, named

    tps = q.ratios(bench)["tokens_per_s"]
    rows = []
    for m in bench["methods"]:
        method = BenchMethod.parse(m)
        plain = BenchMethod.plain(method.weights).key if method.weights else None
        same = "–" if method.method == "autoregressive" or not method.weights else (
            "yes" if _equal(bench, m, plain) else "NO")
        rows.append([named(bench, m), f"{tps[m]:.1f}", _x(q.geomean_ratio(bench, m, plain)) if plain else "–",
                     _x(q.geomean_ratio(bench, m, LLAMA)), same])
    speeds = _table(["method@weights", "tokens/s (median)", "vs its format's plain decoding", "vs llama.cpp plain",
                     "output equal to its format's plain decoding"], rows)
    read = best_read_gbs(bench, bench_avx2, widths, widths_avx2)
    builds = [("AVX-512 (VNNI)", measured(bench, widths, widths, "avx512", read)),
              ("AVX2", measured(bench_avx2, widths, widths_avx2, "avx2", read))]
    goal_rows = []
    for i, (goal, _, _) in enumerate(goals(builds[0][1])):
        goal_rows.append([goal] + [_verdict(*goals(m)[i][1:]) for _, m in builds])
    table = _table(["goal (the a8 4-bit path; 2 threads)", *(name for name, _ in builds)], goal_rows)
    m512 = builds[0][1]
    prompts = len({(r["set"], r["prompt_id"]) for r in bench["records"]})
    roof = (f"Memory bound: the step reads {widths['weight_bytes']['step'] / 1e6:.0f} MB of blocks (decoder and LM "
            f"head): {m512['bound_ms']:.2f} ms at {read} GB/s, the highest read bandwidth the four runs measured "
            f"(the profile's own was {widths['roofline']['read_gbs']} GB/s); the a8 1-token step took "
            f"{m512['step_ms']:.2f} ms (AVX-512), {builds[1][1]['step_ms']:.2f} ms (AVX2)")
    return (speeds + "\n\n" + table + "\n\n"
            f"Ratios: the geometric mean over {prompts} prompts of per-prompt ratios, {bench['max_new_tokens']} new "
            f"tokens, greedy, one process per build. Passes and steps: medians of the profile's interleaved calls, "
            f"2 threads. {roof}. Agreement, token by token: {_agreement(bench)}. The AVX2 column's bench ran our "
            "kernels and torch in their AVX2 builds on this AVX-512 host (`ATEN_CPU_CAPABILITY=avx2 "
            "HISPEC_Q4_ISA=avx2`); llama.cpp there ran its own build for this CPU (AVX-512).")


def _repeats(widths: dict) -> int:
    """The calls per figure the profile ran (its --repeats, else the script's default, 15)."""
    found = re.search(r"--repeats (\d+)", widths.get("command", ""))
    return int(found[1]) if found else 15


def widths_table(widths: dict, widths_avx2: dict) -> str:
    """A step's cost by pass width, both formats and both builds (2 threads), over the 1-token step and
    against the memory bound; then plain decoding against the bare step per build."""
    from figures_tables import _table, _x

    per = (widths.get("threads") or {}).get("2") or {}
    ns = [n for n in map(str, widths["widths"]) if n in per]
    rows = []
    for isa in widths["isas"]:
        for fmt, words in (("q4", "q4 (float32 activations)"), ("a8", "a8 (int8 activations)")):
            cells = [f"{per[n][f'{isa}/{fmt}']['step_ms']:.2f} ({_x(per[n][f'{isa}/{fmt}']['step_over_1'])})"
                     for n in ns]
            rows.append([isa, words, *cells])
    table = _table(["kernel build", "format", *(f"{n} token{'s' if n != '1' else ''}" for n in ns)], rows)
    decode = []
    for report in (widths, widths_avx2):
        d = ((report.get("decode") or {}).get("2")) or {}
        if d:
            decode.append(f"{d['isa']}: " + ", ".join(
                f"{fmt} {d[fmt]['decode_ms_per_token']:.2f} ms a token against a {d[fmt]['step_ms']:.2f} ms step "
                f"({_x(d[fmt]['decode_over_step'])})" for fmt in ("q4", "a8")))
    return (table + "\n\n"
            f"Milliseconds per step (every layer through the native route, plus the LM head), medians of "
            f"{_repeats(widths)} interleaved calls, 2 threads, after a 128-token context; in brackets "
            f"over the same build and format's 1-token step. Memory bound of a step: "
            f"{widths['roofline']['step_bound_ms']:.2f} ms ({widths['weight_bytes']['step'] / 1e6:.0f} MB at "
            f"{widths['roofline']['read_gbs']} GB/s, the run's best read bandwidth). Plain decoding through the "
            f"engine against the bare step, per token: " + "; ".join(decode) + ".")
