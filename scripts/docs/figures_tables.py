"""The tables of README.md and docs/, one function per generated block: the loaded artifacts in, Markdown out.

Benchmark summaries are recomputed from the raw records with ``bench.summarise``, so every ratio
is the geometric mean of per-prompt ratios, whatever the version of the code that wrote the
artifact. ``figures.py`` maps each block to its function and its artifacts.
"""

from __future__ import annotations

import re
import statistics

from hispec.engine.planning.round import PLAIN_KEY, kind_words
from hispec.evaluation.method import BenchMethod

# ---- formatting ----------------------------------------------------------------------------------

def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(head: list, rows: list[list]) -> str:
    return "\n".join([_row(head), _row(["---"] * len(head))] + [_row(r) for r in rows])



# ---- benchmarks ----------------------------------------------------------------------------------

def ran_levels(report: dict, method: str) -> list | None:
    """The level list a method's records ran (settings.levels; None where the artifact does not record it)."""
    for rec in report.get("records") or ():
        if rec["method"] == method:
            return (rec.get("settings") or {}).get("levels")
    return None


def named(report: dict, method: str) -> str:
    """A method with the level list it ran, where its name does not say it: hispec/auto ran the exits
    [lookup, 2, 4] before 2026-12-04 and [lookup, full@q4] since, under the same name."""
    levels = ran_levels(report, method)
    if BenchMethod.parse(method).name != "hispec" or not levels:
        return method
    return f"{method} (ran {','.join(str(level) for level in levels)})"

def _summary(report: dict) -> dict:
    from hispec.evaluation.bench import summarise

    methods = [BenchMethod.parse(m) for m in report["methods"]]
    return summarise(report["records"], methods) if report.get("records") else report["summary"]


def bench_table(report: dict) -> str:
    """Per set (and all): the reference's median tokens/s, every other method's geometric mean of
    per-prompt ratios to it (and the range over the set's prompts for the whole), output equality."""
    summary = _summary(report)
    ref = summary["all"]["reference"]
    methods = [m for m in report["methods"] if m != ref]
    rows = []
    for set_name, s in summary.items():
        per = s["methods"]
        label = "all" if set_name == "all" else set_name
        row = [f"{'**all**' if set_name == 'all' else label} ({per[ref]['prompts']})",
               f"{per[ref]['tokens_per_s']:.1f} tok/s"]
        for m in methods:
            v = (per.get(m) or {}).get("vs_reference") or {}
            cell = _x(v.get("geomean"))
            if set_name == "all" and v.get("geomean") is not None:
                cell += f" ({v['min']:.2f}–{v['max']:.2f})"
            row.append(cell)
        row.append("yes" if s["all_outputs_equal"] else "NO")
        rows.append(row)
    table = _table(["set (prompts)", f"{ref} (median)", *methods, "all outputs equal"], rows)
    return (table + f"\n\nRatios: the geometric mean over the set's prompts of each method's tokens/s over {ref}'s "
            "on the same prompt (on the all row, the range over prompts in brackets).")


def levels_table(report: dict) -> str:
    return bench_table(report) + "\n\n" + plans_line(report)


def plans_line(report: dict) -> str:
    """The adaptive methods' plans over every prompt, and the acceptance of every method per level pair."""
    parts = []
    summary = _summary(report)["all"]["methods"]
    for m in report["methods"]:
        choices: dict[str, int] = {}
        for r in report["records"]:
            if r["method"] == m:
                for plan, n in (r.get("policy_choices") or {}).items():
                    choices[plan] = choices.get(plan, 0) + n
        if choices:
            top = sorted(choices.items(), key=lambda kv: -kv[1])[:5]
            parts.append(f"{m}: " + ", ".join(f"{k} {n}" for k, n in top))
    acc = []
    for m in report["methods"]:
        levels = (summary.get(m) or {}).get("acceptance") or {}
        if levels:
            acc.append(f"{m} " + ", ".join(f"{k} {_pct(v)}" for k, v in levels.items()))
    out = "Acceptance per level pair (per token, in order, mean over prompts): " + "; ".join(acc) + "."
    if parts:
        out += " Adaptive plans, rounds over all prompts (the five most chosen): " + "; ".join(parts) + "."
    return out


def bf16_table(bf16: dict, fp32: dict) -> str:
    """How far bfloat16 goes from exactness: prompts whose output differs, and where, three ways."""
    def ids(report, method):
        return {(r["set"], r["prompt_id"]): r["token_ids"] for r in report["records"] if r["method"] == method}

    def differ(a: dict, b: dict) -> tuple[int, int, list[int]]:
        from hispec.evaluation.bench import first_difference

        keys = sorted(set(a) & set(b))
        firsts = [first_difference(a[k], b[k]) + 1 for k in keys if a[k] != b[k]]  # 1 = the first new token
        return len(firsts), len(keys), firsts

    speculative = [m for m in bf16["methods"] if m != "autoregressive"]
    rows = []
    spec = ids(bf16, speculative[0])  # they verify with the same full-model passes (checked below)
    same = all(ids(bf16, speculative[0]) == ids(bf16, m) for m in speculative)
    for label, a, b in ((f"{' and '.join(speculative)} vs bfloat16 autoregressive", ids(bf16, speculative[0]),
                         ids(bf16, "autoregressive")),
                        ("bfloat16 autoregressive vs float32 autoregressive", ids(bf16, "autoregressive"),
                         ids(fp32, "autoregressive")),
                        (f"{' and '.join(speculative)} vs float32 autoregressive", spec, ids(fp32, "autoregressive"))):
        n, total, firsts = differ(a, b)
        rows.append([label, f"{n} of {total}", f"token {statistics.median(firsts):g}" if firsts else "–",
                     f"token {min(firsts)}" if firsts else "–"])
    table = _table(["bfloat16 run", "prompts whose output differs", "median first difference", "earliest"], rows)
    note = (f"{' and '.join(speculative)} gave the same outputs as each other on every prompt."
            if same else f"{' and '.join(speculative)} differ from each other on some prompts.")
    per = _summary(bf16)["all"]["methods"]
    speed = ", ".join(f"{m} {_x(per[m]['vs_reference']['geomean'])}" for m in speculative)
    return (table + f"\n\n{note} Speed in bfloat16: autoregressive {per['autoregressive']['tokens_per_s']:.1f} tok/s "
            f"(median), {speed} (geometric mean of per-prompt ratios; not comparable with the float32 ratios, since "
            f"the texts differ). The float32 run: `{fp32.get('command') or FP32_COMMAND}`.")


LEVELS_COMMAND = ("python -m hispec bench --prompts heldout:4,summarize:16 --max-new-tokens 128 --methods "
                  "autoregressive,hf_lookup,layerskip/fixed,2/fixed,hispec/fixed,lookup+2+4/fixed,lookup+4/auto,hispec/auto "
                  "--json levels.json --svg levels.svg")
FP32_COMMAND = ("python -m hispec bench --prompts heldout --methods autoregressive,hf_generate,layerskip,hispec "
                "--max-new-tokens 128 --json bench.json --svg bench.svg")


# ---- sweeps --------------------------------------------------------------------------------------

def sweep_table(report: dict) -> str:
    """Each grid as a matrix: the geometric mean of per-prompt ratios to autoregressive at every
    point (the best in bold), with the verifier's and the full model's acceptance in brackets."""
    from hispec.evaluation.sweep import SHORT, summarise_sweep

    s = summarise_sweep(report)
    out = []
    for name, grid in report["grids"].items():
        g = s["grids"][name]
        a, b = grid["rows_axis"], grid["cols_axis"]
        cells = {(c[a], c[b]): c for c in g["cells"]}
        best = g["best"]
        fixed = ", ".join(f"{SHORT[k]} {v}" for k, v in grid["fixed"].items())
        rows = []
        for r in grid["rows"]:
            row = [str(r)]
            for c in grid["cols"]:
                cell = cells.get((r, c))
                if cell is None:
                    row.append("–")
                    continue
                acc = cell["acceptance"]
                text = (f"{_x(cell['speedup_geomean'])} ({_pct(acc.get('draft->verify'))}, "
                        f"{_pct(acc.get('verify->target'))})")
                if best and (best[a], best[b]) == (r, c):
                    text = f"**{text}**"
                row.append(text)
            rows.append(row)
        out.append(_table([f"{SHORT[a]} \\ {SHORT[b]} ({fixed})", *map(str, grid["cols"])], rows))
    ref = s["reference"]
    prompts = sum(len(v) for v in (report.get("prompts") or {}).values()) or ref["prompts"]
    paired = []
    for name, grid in report["grids"].items():
        g = s["grids"][name]
        a, b = grid["rows_axis"], grid["cols_axis"]
        if g["best"] and g["default"]["on_grid"] and (g["best"][a], g["best"][b]) != (g["default"][a], g["default"][b]):
            ratio, se = paired_ratio(report, name, (g["best"][a], g["best"][b]), (g["default"][a], g["default"][b]))
            paired.append(f"the best point ({SHORT[a]} {g['best'][a]}, {SHORT[b]} {g['best'][b]}) against the default "
                          f"({SHORT[a]} {g['default'][a]}, {SHORT[b]} {g['default'][b]}) prompt by prompt: {ratio:.3f}× "
                          f"(standard error of the mean log ratio {se:.3f})")
    return ("\n\n".join(out) + f"\n\nEach cell: hispec's tokens/s over autoregressive's on the same prompt, geometric "
            f"mean over {prompts} prompts ({', '.join(report.get('prompts') or {})}), {report['max_new_tokens']} "
            f"new tokens; in brackets the share of drafts the verifier passed and of those the full model accepted "
            f"(per token, in order). Autoregressive: {ref['tokens_per_s']:.1f} tok/s (median). Best in bold. "
            f"All outputs equal: {'yes' if s['all_outputs_equal'] else 'NO'}."
            + (" Paired, " + "; ".join(paired) + "." if paired else ""))


def paired_ratio(report: dict, grid: str, point: tuple, other: tuple) -> tuple[float, float]:
    """The geometric mean of one grid point's tokens/s over another's on the same prompts, and the
    standard error of the mean log ratio: how far apart two points are, beyond the noise."""
    import math

    a, b = report["grids"][grid]["rows_axis"], report["grids"][grid]["cols_axis"]

    def tps(at):
        return {(r["set"], r["prompt_id"]): r["tokens_per_s"] for r in report["records"]
                if r["grid"] == grid and (r[a], r[b]) == at}

    mine, theirs = tps(point), tps(other)
    logs = [math.log(mine[k] / theirs[k]) for k in mine if k in theirs and mine[k] > 0 and theirs[k] > 0]
    se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    return math.exp(statistics.mean(logs)), se


def layerskip_table(*reports: dict) -> str:
    """Single-exit self-speculation at several exits and draft lengths, one benchmark per length."""
    rows = []
    for report in reports:
        summary = _summary(report)["all"]
        ref = summary["reference"]
        settings = report["settings"]  # reports before 1b3ce29's successor recorded the paper's name
        length = settings["lengths"][0] if settings.get("lengths") else settings.get("draft_len")
        for m in report["methods"]:
            if m == ref:
                continue
            r = summary["methods"][m]
            acc = next(iter(r["acceptance"].values()), None)
            rows.append([BenchMethod.parse(m).name.replace("+", ", "), str(length), _x(r["vs_reference"]["geomean"]),
                         _pct(acc), "yes" if r["outputs_equal"] else "NO"])
    ref_tps = ", ".join(f"{_summary(r)['all']['methods']['autoregressive']['tokens_per_s']:.1f}" for r in reports)
    prompts = _summary(reports[0])["all"]["methods"]["autoregressive"]["prompts"]
    return (_table(["exit", "draft_len", "vs autoregressive", "acceptance exit → full model", "outputs equal"], rows)
            + f"\n\nGeometric mean over {prompts} prompts of per-prompt ratios to autoregressive in the same run "
              f"({ref_tps} tok/s median in the runs, in order).")


# ---- profiles ------------------------------------------------------------------------------------

def profile_table(p: dict) -> str:
    counts = list(p["full_step_ms"])
    rows = []
    for key, label in (("full_step_ms", "full step, lean path (engine)"),
                       ("hf_full_step_ms", "full step, transformers' forward"),
                       ("stock_layers_full_step_ms", "full step, our stock-layer path"),
                       ("draft_range_ms", f"draft range [{p['draft_range'][0]}, {p['draft_range'][1]}), lean"),
                       ("stock_draft_range_ms", f"draft range [{p['draft_range'][0]}, {p['draft_range'][1]}), "
                                                "stock layers")):
        if p.get(key):
            rows.append([label, *(f"{_ms(p[key].get(n))} ms" for n in counts)])
    steps = _table(["new tokens", *counts], rows)
    heads = _table(["head (ms)", *p["heads_ms"]],
                   [["after an untimed full step (as in a generation)", *(_ms(v) for v in p["heads_ms"].values())],
                    ["called again and again", *(_ms(p["heads_hot_ms"].get(k)) for k in p["heads_ms"])]])
    be = p.get("break_even_acceptance") or {}
    lean8 = p["full_step_ms"].get("8")
    return (f"{steps}\n\n{heads}\n\n"
            f"Verifying 8 tokens on the lean path costs {p['lean_8_vs_stock_1']:.2f}× one token through transformers' "
            f"forward, and {lean8 / p['full_step_ms']['1']:.2f}× one lean token; 16 tokens cost "
            f"{p['full_step_ms']['16'] / p['full_step_ms']['1']:.2f}× one. Break-even acceptance ({p['break_even_model']}): "
            f"{_pct(be.get('lean'))} on the lean path, {_pct(be.get('stock'))} on the stock path. "
            f"Median of {p['repeats']} calls after a {p['context']}-token context, {p['dtype']}.")


def time_split_table(t: dict) -> str:
    methods = t["methods"]

    def part(m: dict, kind: str) -> float:
        calls = m["calls"]
        if kind == "layers":
            return sum(v["ms_per_token"] for k, v in calls.items() if k.startswith("layers"))
        if kind == "final":
            return sum(v["ms_per_token"] for k, v in calls.items() if k == "final head")
        return sum(v["ms_per_token"] for k, v in calls.items() if k.startswith(("exit", "attention")))

    from hispec.engine.config import Preset

    names = {name: Preset.recorded(m["settings"]).label() for name, m in methods.items()}
    rows = [["layer passes", *(f"{part(m, 'layers'):.1f}" for m in methods.values())],
            ["final head", *(f"{part(m, 'final'):.1f}" for m in methods.values())],
            ["exit heads and their attention steps",
             *("–" if not part(m, "exits") else f"{part(m, 'exits'):.1f}" for m in methods.values())],
            ["the rest (token choice, events, bookkeeping)", *(f"{m['other_ms_per_token']:.1f}" for m in methods.values())],
            ["**total**", *(f"**{m['ms_per_token']:.1f}** ({1e3 / m['ms_per_token']:.1f} tok/s)" for m in methods.values())]]
    return (_table(["ms per generated token", *(names.get(k, k) for k in methods)], rows)
            + f"\n\n{t['prompts']} held-out prompts, {t['max_new_tokens']} new tokens each, {t['threads']} threads; "
              "every layer range, head and attention step timed where the engine calls it.")


# ---- exit heads ----------------------------------------------------------------------------------

def agreement_table(manifest: dict) -> str:
    ev = manifest["evaluation"]
    layers = list(ev["agreement"])
    rows = [["raw exit (the model's own final norm and LM head)", *(_pct1(ev["agreement"][e]["raw"]) for e in layers)],
            [f"shipped {manifest['head']['type']} heads", *(f"**{_pct1(ev['agreement'][e]['trained'])}**" for e in layers)]]
    pairs = ev.get("pairs") or {}
    pair_rows = [[f"{k.replace('-', ' and ')}", _pct1(v["trained"]), _pct1(v["raw"])] for k, v in pairs.items()]
    return (_table(["exit", *layers], rows) + "\n\n"
            + _table(["exits agreeing with each other", "trained heads", "raw exits"], pair_rows)
            + f"\n\nTop-1 agreement on {ev['tokens']:,} tokens the model wrote for {ev['prompts']} held-out prompts "
              f"(the same tokens for every row); the {manifest['vocab']['size']:,}-token head vocabulary covers "
              f"{ev['subset_coverage']:.1%} of them.")


def _pct1(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def priors_table(measured: dict, manifest: dict) -> str:
    """The adaptive policy's priors: what it starts from, beside what generations on the tuning split measured."""
    ev = manifest["evaluation"]
    acc = measured["acceptance"]
    shipped = (manifest.get("policy_priors") or {}).get("exits") or {}
    rows = []
    for holder, prior in sorted((manifest.get("policy_priors") or {}).get("lookup", {}).items()):
        m = acc["lookup"].get(f"{holder}->target") or {}
        rows.append([f"lookup copy after a {holder.partition(':')[2]}-token match → full model",
                     f"{_pct1(m.get('rate'))} ({m.get('judged', 0):,} tokens)", f"**{_pct1(prior)}**",
                     "this measurement", "–"])
    for run, pairs in acc.items():
        if run == "lookup":
            continue
        layers = [int(x) for x in run.replace("exits", "").replace("exit", "").replace(",", " ").split()]
        for key, m in pairs.items():
            holder, _, judge = key.partition("->")
            if len(layers) == 1 and judge == "target":
                key, name = f"{layers[0]}-target", f"exit {layers[0]} → full model"
                held_out = ev["agreement"][str(layers[0])]["trained"]
            elif len(layers) == 2 and judge == "verify":
                key, name = f"{layers[0]}-{layers[1]}", f"exit {layers[0]} → exit {layers[1]}"
                held_out = ev["pairs"][key]["trained"]
            else:
                continue
            prior = shipped.get(key)
            source = ("this measurement" if prior is not None else "manifest's agreement (47 held-out prompts)")
            rows.append([name, f"{_pct1(m['rate'])} ({m['judged']:,} tokens)",
                         f"**{_pct1(held_out if prior is None else prior)}**", source, _pct1(held_out)])
    prompts = sum(len(v) for v in measured["prompts"].values())
    return (_table(["level pair", "acceptance in generations, tuning split", "prior the policy starts from",
                    "prior from", "heads' agreement, all 47 held-out prompts"], rows)
            + f"\n\nAcceptance per token, in order up to each block's first rejection, with fixed rounds and one draft a "
              f"round, over {prompts} prompts of the tuning split, {measured['max_new_tokens']} new tokens each; "
              "greedy, so the figures depend on the text, not the machine. The heads' agreement (their manifest) "
              "was measured on all the held-out prompts, the report split included, so it is shown, not used.")


# ---- 4-bit weights ---------------------------------------------------------------------------------

def q4_table(report: dict) -> str:
    """Both weight formats and llama.cpp side by side: speeds, the three goals, the memory bound, and
    how far 4-bit output goes from float32."""
    import q4_goals as q

    r = q.ratios(report)
    summary = _summary(report)["all"]["methods"]
    rows = []
    for m in report["methods"]:
        fmt = BenchMethod.parse(m).weights  # llama.cpp runs its own file: none
        same = q.geomean_ratio(report, m, q.AR32)
        equal = ("–" if m in (q.AR32, q.AR4) or not fmt else
                 "yes" if _equal_to(report, m, BenchMethod.plain(fmt).key) else "NO")
        rows.append([named(report, m), f"{r['tokens_per_s'][m]:.1f}", _x(same), _x(q.geomean_ratio(report, m, q.LLAMA)),
                     equal])
    out = [_table(["method@weights", "tokens/s (median)", "vs autoregressive@fp32", "vs llamacpp",
                   "output equal to its format's autoregressive"], rows)]
    goal_rows = [[name, value, "–" if ok is None else "met" if ok else "**missed**"] for name, value, ok in q.goals(r)]
    out.append(_table(["goal", "measured", ""], goal_rows))
    bounds = []
    for fmt, b in (report.get("memory_bound") or {}).items():
        if b.get("step_ms"):
            bounds.append(f"{fmt}: a plain step {b['step_ms']:.1f} ms against {b['bound_ms']:.1f} ms to read its "
                          f"{b['weight_bytes'] / 1e6:.0f} MB of weights at {b['read_gbs']:.1f} GB/s "
                          f"({b['step_over_bound']:.2f}× the bound)")
    div = q.divergence(report)
    q4_firsts = [d["q4_vs_fp32"] for d in div if d.get("q4_vs_fp32") is not None]
    ll_firsts = [d["llamacpp_vs_q4"] for d in div if d.get("llamacpp_vs_q4") is not None]
    text = (f"Ratios: the geometric mean over {len(div)} prompts of per-prompt ratios, {report['max_new_tokens']} new "
            f"tokens, greedy. Memory bound (1 / autoregressive tokens/s, the prefill included, against the "
            f"weights' bytes over the run's best read bandwidth): " + "; ".join(bounds) + ". "
            f"4-bit output differs from float32 on {len(q4_firsts)} of {len(div)} prompts"
            + (f" (first difference at generated token {min(q4_firsts) + 1}-{max(q4_firsts) + 1}, median "
               f"{statistics.median(q4_firsts) + 1:.0f})" if q4_firsts else "")
            + (f"; llama.cpp's output differs from our 4-bit output on {len(ll_firsts)} of {len(div)}"
               + (f" (median first difference at token {statistics.median(ll_firsts) + 1:.0f})" if ll_firsts else "")
               if any("llamacpp_vs_q4" in d for d in div) else "") + ".")
    return "\n\n".join(out) + "\n\n" + text + " " + plans_line(report)


def q4_alternatives_table(r: dict) -> str:
    """Kernels tried for the 4-bit path: time per product by rows, and whether a row's bits hold in a batch."""
    names = {"hispec_q4_1": "this project's kernel, the file's Q4_1 blocks",
             "torch_int4pack": "PyTorch int4 weight-only (groups of 32)",
             "torch_int8pack": "PyTorch int8 weight-only (per row: a re-quantisation)",
             "fp32_dense": "float32, the dequantised weight"}
    rows = []
    for name, shapes in r["results"].items():
        for shape, per in shapes.items():
            if "error" in per:
                rows.append([names.get(name, name), shape, f"cannot run: {per['error']}", "–"])
                continue
            times = " / ".join(f"{v['ms']:.3f}" for v in per.values())
            same = all(v["row_0_same_bits"] for v in per.values())
            rows.append([names.get(name, name), shape, times, "yes" if same else "**no**"])
    rows_label = ", ".join(next(iter(next(iter(r["results"].values())).values())).keys())
    return (_table(["kernel", "product (in -> out)", f"ms per call, {rows_label} rows", "a row's bits alone = in a batch"],
                    rows)
            + f"\n\nMedian of the calls, {r['threads']} threads, torch {r['torch']}; random weights of the default "
              "model's projection shapes.")


def q4_ab_table(*reports: dict) -> str:
    """Two builds of the 4-bit kernel on whole steps (scripts/measure/q4_ab.py): per build and token count, the
    medians before and after, their ratio, and whether the logits kept their bits."""
    rows = []
    for r in reports:
        for n, row in r["steps"].items():
            rows.append([r["isa"], n, f"{row['base']['median_ms']:.1f}", f"{row['new']['median_ms']:.1f}",
                         f"{row['new_over_base_median']:.2f}×", "yes" if row["same_bits"] else "**no**"])
    first = reports[0]
    base = first.get("base_commit") or (first["code"]["commit"] if first["base"] == "HEAD" else first["base"])
    model = {"a8": "the a8 model (the 4-bit blocks with int8 activations, its LM head too)",
             "fp32": "the float32 model on the file's blocks (the wide arithmetic, its LM head too)"}.get(
        first.get("format"), "the 4-bit model")
    return (_table(["kernel build", "new tokens", f"ms per step at {base[:7]}", "ms per step now",
                    "now / before", "logits the same bits"], rows)
            + f"\n\nSteps of {model}: medians of {first['steps']['1']['new']['steps']} steps per build, the builds "
              f"taking turns in one process; {first['threads']} threads, a {first['context']}-token context"
              + ("; the steps in a thread of their own, as the app runs a generation (the model loaded in the main "
                 "thread)" if first.get("in_thread") else "")
              + ("; the AVX2 build run on the same AVX-512 host (`ATEN_CPU_CAPABILITY=avx2`)."
                 if any(r["isa"] == "avx2" for r in reports) else "."))


def q4_profile_table(*reports: dict) -> str:
    """Where a step's time goes (scripts/measure/q4_profile.py), per kernel build and tokens per pass: float32 and
    the 4-bit route op by op (each op timed; Python/dispatch is what the step has beyond them), and the
    4-bit native layer's own phase clock (the rest: embedding, final norm and LM head, Python)."""
    def ms(v):
        return "–" if v is None else f"{v:.1f}"

    rows = []
    for r in reports:
        isa = r["host"].get("q4_kernel_isa", "?")
        for n, got in r["tokens"].items():
            for key, name in (("fp32", "float32, op by op"), ("q4", "4-bit, op by op"),
                              ("q4_native", "4-bit, one native call per layer")):
                row = got.get(key)
                if not row:
                    continue
                if "split_ms" in row:
                    sp = row["split_ms"]
                    parts = [sp["products"], sp["attention"], sp["norms_rotary_act"], sp["cache_writes"], sp["head"],
                             sp["python_dispatch"]]
                else:
                    ph = row["native_phases_ms"]
                    rest = row["step_ms_median"] - sum(ph.values())
                    parts = [ph["products"], ph["attention_rotary_cache"], ph["norms_block_sums"], None, None, rest]
                rows.append([isa, n, name, ms(row["step_ms_median"]), *map(ms, parts)])
    first = reports[0]
    return (_table(["kernel build", "tokens per pass", "route", "step (ms)", "products", "attention",
                    "norms, rotary, activations", "cache writes", "final norm + LM head", "the rest"], rows)
            + f"\n\nMedians of {first['command'].split('--repeats ')[1].split()[0]} interleaved steps per route, "
              f"{first['threads']} threads, a {first['context']}-token context, wall clock. Op by op: each operation "
              "timed on its own, the rest is Python and dispatch. The native call's phases are its own clock (thread 0 "
              "at each phase's barrier; its attention column includes rotary and the cache writes, its norms column the "
              "block sums), and its rest is the embedding, the final norm, the LM head and Python. The AVX2 build ran on "
              "the same AVX-512 host (`ATEN_CPU_CAPABILITY=avx2 HISPEC_Q4_ISA=avx2`).")


def _equal_to(report: dict, method: str, reference: str) -> bool:
    import q4_goals as q

    return all(a == b for a, b in q.output_pairs(report, method, reference))


# ---- GPU and load --------------------------------------------------------------------------------

def gpu_table(g: dict) -> str:
    rows = []
    head = None
    for t in g["timings"]:
        syn = t["synthetic"]
        head = ["shape", "autoregressive",
                *(f"layerskip @{s['p_verify_target']:g}" for s in syn),
                *(f"hispec @{s['p_draft_verify']:g}/{s['p_verify_target']:g}" for s in syn)]
        rows.append([f"{t['shape']} ({t['layers']} layers, d={t['draft_layer']}, v={t['verify_layer']})",
                     f"{t['autoregressive_tokens_per_s']:.1f} tok/s (HF generate: {t['hf_generate_tokens_per_s']:.1f})",
                     *(_x(s["layerskip_vs_ar"]) for s in syn), *(_x(s["hispec_vs_ar"]) for s in syn)])
    ex, bf = g["exactness_fp32"], g["bf16_mismatch"]
    diverged = "; ".join(f"{m}: {v['differs']} of {bf['prompts']}" for m, v in bf["methods"].items())
    return (_table(head, rows)
            + f"\n\nSynthetic acceptance (timing only: each pending token accepted with the given probability), "
              f"random weights of these shapes, {g['timings'][0]['dtype']}, {g['timings'][0]['new_tokens']} new "
              f"tokens. Exactness in float32: {ex['runs'] - len(ex['failures'])} of "
              f"{ex['runs']} runs equal transformers' `generate()`. In bfloat16 ({bf['model']}), outputs that "
              f"diverged from our own autoregressive within 64 tokens: {diverged}.")


def load_table(r: dict) -> str:
    kinds = r["by_kind"]

    def lat(key):
        got = r.get(key) or {}
        return f"{got['p50']:.1f} / {got['p90']:.1f} / {got['p99']:.1f} s" if got.get("p50") is not None else "–"

    row = [f"{r['sessions']} × {r['requests_per_session']}",
           f"{r['completed']} ({kinds.get('normal', 0)} short, {kinds.get('long', 0)} long, {kinds.get('stop', 0)} Stops)",
           str(r["refused_as_expected"]), str(r["failed"]), str(r["crossed"]), lat("latency_s_normal"),
           lat("latency_s_long"), f"{r['seconds']:.0f} s"]
    long = f" and {r['long_tokens']} for a long one" if r.get("long_tokens") else ""
    visitors = (", each session a visitor of its own (its own client address)" if r.get("visitors") else "")
    seats = r.get("seats") or 1
    sharing = ("one generation at a time per model, its turn shared round by round between visitors, so requests "
               "queue." if seats == 1 else
               f"up to {seats} generations hold the model at once, their passes sharing calls (each writing what it "
               "would alone); beyond them, turns are shared round by round between visitors.")
    return (_table(["sessions × requests", "completed", "malformed, refused with their message", "failed", "crossed",
                    "short latency p50 / p90 / p99", "long latency p50 / p90 / p99", "wall time"], [row])
            + f"\n\nModel {r['model']}, {r['max_new_tokens']} new tokens for a short request{long}, every session at "
              f"once{visitors}; {sharing}" + _stops_line(r))


LOADED_FLOOR = 0.9  # issue 37: hispec/auto never more than 10% slower than plain decoding on any prompt


def loaded_ratios(r: dict, method: str = "hispec/auto", reference: str = "autoregressive") -> dict:
    """Per set, each prompt's tokens/s of `method` over `reference` (the same prompt, same run)."""
    rates: dict = {}
    for rec in r["records"]:
        rates.setdefault((rec["set"], rec["prompt_id"]), {})[rec["method"]] = rec["tokens_per_s"]
    out: dict = {}
    for (name, _), by in sorted(rates.items()):
        if by.get(reference) and by.get(method) is not None:
            out.setdefault(name, []).append(by[method] / by[reference])
    return out


def loaded_table(r: dict) -> str:
    """Issue 37: hispec/auto against plain decoding prompt by prompt while another process loads the cores."""
    ratios = loaded_ratios(r)
    every = [x for xs in ratios.values() for x in xs]
    rows = [[name, len(xs), f"{_geomean(xs):.2f}×", f"{min(xs):.2f}×", f"{max(xs):.2f}×",
             sum(x < LOADED_FLOOR for x in xs)] for name, xs in ratios.items()]
    rows.append(["all", len(every), f"{_geomean(every):.2f}×", f"{min(every):.2f}×", f"{max(every):.2f}×",
                 sum(x < LOADED_FLOOR for x in every)])
    load = r["host"].get("background_load") or {}
    slow = sum(x < LOADED_FLOOR for x in every)
    goal = ("met: no prompt is more than 10% slower than plain decoding" if not slow else
            f"missed: {slow} of {len(every)} prompts are more than 10% slower than plain decoding (the slowest "
            f"{min(every):.2f}×)")
    host = r["host"]
    equal = all(m["methods"]["hispec/auto"]["outputs_equal"] for m in _summary(r).values())
    return (_table(["prompt set", "prompts", "hispec/auto ÷ plain, geometric mean", "slowest prompt", "fastest prompt",
                    f"prompts below {LOADED_FLOOR:.1f}×"], rows)
            + f"\n\nThe goal (hispec/auto never more than 10% slower than plain decoding on any prompt, on a loaded "
              f"machine): {goal}. Load: {_busy(load.get('processes', 0))} for the whole "
              f"run (load average {host.get('loadavg_start')} at the start, {host.get('loadavg_end')} at the end); "
              f"{r['max_new_tokens']} new tokens; every output equal to plain decoding's: {'yes' if equal else 'NO'}.")


def _busy(n: int) -> str:
    return "no other process" if not n else "another process busy on one core" if n == 1 else (
        f"{n} other processes, each busy on one core")


def _geomean(xs: list[float]) -> float:
    return statistics.geometric_mean(xs) if xs else float("nan")


def _stops_line(r: dict) -> str:
    stops = r.get("stops")
    if not stops:
        return ""
    return (f" Stops: {stops['sent']} sent ({stops['at_0_ms']} at 0 ms after their request), {stops['stopped']} "
            f"stopped, {stops['ran_in_full']} ran in full, {stops['done_before_it']} done before the Stop.")


def precision_table(report: dict) -> str:
    """Issue 35: each method against its own format's plain decoding and against the same policy without
    three-level plans, the share of three-level rounds, output equality; the goals; the plans chosen."""
    import precision_goals as pg

    rows = []
    for r in pg.rows(report):
        equal = "–" if r["equal"] is None else "yes" if r["equal"] else "NO"
        rows.append([named(report, r["method"]), _x(r["vs_plain"]), _x(r["vs_without"]),
                     "–" if r["three_level"] is None else f"{r['three_level']:.0%}", equal])
    out = [_table(["method@weights", "vs its format's autoregressive", f"vs {pg.WITHOUT} (same format)",
                   "rounds with three levels", "output equal to its format's autoregressive"], rows)]
    out.append(_table(["goal", "measured", ""], [[g, v, "–" if ok is None else "met" if ok else "**missed**"]
                                               for g, v, ok in pg.goals(report)]))
    prompts = len({(r["set"], r["prompt_id"]) for r in report["records"]})
    return ("\n\n".join(out) + f"\n\nRatios: the geometric mean over {prompts} prompts of per-prompt ratios, "
            f"{report['max_new_tokens']} new tokens, greedy. " + third_level_line(report) + plans_line(report))


def third_level_line(report: dict) -> str:
    """What the third level adds on its own: lookup on top of the cheaper full model drafting alone, in the
    same run (lookup+full@q4/auto, or hispec/auto where it ran that list, over full@q4/auto)."""
    import precision_goals as pg

    parts = []
    for fmt in ("fp32", "q4"):
        three = pg.with_method(report, fmt)
        two = BenchMethod.parse(pg.PRECISION[fmt][1]).on(fmt, "auto").key  # e.g. full@q4/auto@fp32
        if three is None:
            continue
        ratio = pg.geomean_ratio(report, three, two)
        measured = f"{ratio:.2f}×" if ratio is not None else f"not measured ({two} not in this run)"
        parts.append(f"{fmt}: {pg.base_of(three)}, the lookup level on top of {pg.base_of(two)} drafting alone: "
                     f"{measured}")
    return ("The third level's own increment (" + "; ".join(parts) + "). ") if parts else ""


def a8_agreement_table(report: dict, tune: dict, report_q4: dict) -> str:
    """The a8 level (the 4-bit blocks with int8 activations) judged per token by each exact model it can sit
    under: the float32 model (report split, and the tuning split's prior) and the 4-bit model (report split)."""
    def cell(m: dict) -> str:
        r = m["acceptance"]["full@a8"]["draft->target"]
        return f"**{_pct1(r['rate'])}** ({r['judged']:,} tokens, {sum(len(v) for v in m['prompts'].values())} prompts)"

    rows = [["full@a8 judged by the float32 model", cell(report), cell(tune).replace("**", "")],
            ["full@a8 judged by the 4-bit model (its exact format on 4-bit weights)", cell(report_q4), "–"]]
    return (_table(["level", "report split", "tuning split (the prior)"], rows)
            + f"\n\nAcceptance per token, in order up to each block's first rejection, fixed one-token rounds, greedy, "
              f"{report['max_new_tokens']} new tokens a prompt; the prior (judged by float32) serves both formats.")


def _rate(measured: dict, run: str) -> float:
    return measured["acceptance"][run]["draft->target"]["rate"]


def precision_breakeven_table(steps: dict, a8_q4: dict, a8_fp32: dict, q4_fp32: dict) -> str:
    """Why a cheaper full model pays as a drafter in float32 and not in 4-bit, from measured figures only:
    per-token agreement a (report split), the drafter's one-token step c and the exact model's k-token pass
    v(k), both over the exact model's one-token step (scripts/measure/q4_steps.py, wall clock medians). A round of k
    drafts yields (1 - a^(k+1)) / (1 - a) tokens for k c + v(k + 1) one-token steps of the exact model."""
    wall = steps["wall_ms"]

    def med(fmt: str, n: int) -> float:
        return wall[fmt][str(n)]["median"]

    rows = []
    for label, draft, exact, a in (("full@q4 under the float32 model", "q4", "fp32", _rate(q4_fp32, "full@q4")),
                                   ("full@a8 under the float32 model", "a8", "fp32", _rate(a8_fp32, "full@a8")),
                                   ("full@a8 under the 4-bit model", "a8", "q4", _rate(a8_q4, "full@a8"))):
        c = med(draft, 1) / med(exact, 1)
        cells, best = [], (0.0, 1)
        for k in (1, 3, 7, 15):
            tokens = k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
            speed = tokens / (k * c + med(exact, k + 1) / med(exact, 1))
            cells.append(f"{speed:.2f}×")
            best = max(best, (speed, k))
        k = best[1]
        tokens = k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
        need = (tokens / 1.5 - med(exact, k + 1) / med(exact, 1)) / k
        rows.append([label, _pct1(a), f"{c:.2f}", *cells, f"{need:.2f}" if need > 0 else "none reaches 1.5×"])
    v = ", ".join(f"{n} tokens {med(f, n) / med(f, 1):.2f}" for f in ("fp32", "q4") for n in (2, 8, 16))
    return (_table(["drafter, exact model", "a (per token)", "c (draft step / exact step)", "k=1", "k=3", "k=7",
                    "k=15", "c needed for 1.5× (at the best k)"], rows)
            + "\n\nExpected speed of a round of k drafts against plain decoding, no lookup, no policy overhead: an upper "
              "bound from the measured figures. The exact model's k-token pass over its one-token step, "
              f"fp32 then q4: {v}.")


def precision_agreement_table(measured: dict, tune: dict | None = None) -> str:
    """Per-token acceptance of each 4-bit level by the exact model (and of 4-bit exits by the 4-bit full
    model), from scripts/measure/measure_priors.py runs (--formats q4): `measured` (the report split) beside
    `tune` (the tuning split: the priors the policy starts from)."""
    def split_of(m: dict) -> str:
        return "report" if "heldout-report" in m.get("command", "") else "tuning"

    def prompts(m: dict) -> int:
        return sum(len(v) for v in m["prompts"].values())

    rows = []
    for run, pairs in measured["acceptance"].items():
        levels = measured["runs"][run]["levels"]
        for key, m in pairs.items():
            holder, _, judge = key.partition("->")
            if holder == "verify" and len(levels) > 1:
                continue  # the 4-bit full model judged by the exact one: its own row
            level = {"draft": levels[0], "verify": levels[-1]}[holder]
            judged_by = "the exact model" if judge == "target" else levels[-1]
            row = [f"{level} judged by {judged_by}", f"**{_pct1(m['rate'])}** ({m['judged']:,} tokens)"]
            if tune is not None:
                t = (tune["acceptance"].get(run) or {}).get(key) or {}
                row.append(f"{_pct1(t.get('rate'))} ({t.get('judged', 0):,} tokens)")
            rows.append(row)
    head = ["level", f"{split_of(measured)} split ({prompts(measured)} prompts)"]
    if tune is not None:
        head.append(f"{split_of(tune)} split ({prompts(tune)} prompts: the priors)")
    return (_table(head, rows)
            + f"\n\nAcceptance per token, in order up to each block's first rejection, fixed rounds, greedy, "
              f"{measured['max_new_tokens']} new tokens a prompt; 4-bit levels run the GGUF's own blocks, the exact "
              "model is the float32 dequantisation of the same file.")


# ---- the GPU sessions ----------------------------------------------------------------------------

EE_EXITS = ("1", "2", "4", "6", "8", "12", "16", "20", "24", "29")


def ee_gpu_table(art: dict, heads: dict) -> str:
    """A LayerSkip LoRA run on the GPU: every shown exit's agreement with the final layer before and after,
    beside the shipped exit heads' (the untouched model, other positions), and what it cost the model."""
    agree, ev = art["evaluation"]["exit_agreement"], art["evaluation"]
    shipped = heads["evaluation"]["agreement"]
    rows = [["untouched model (its own final norm and LM head at the exit)", *(_pct1(agree["original"][e]) for e in EE_EXITS)],
            ["after the LoRA run (tuned model, its own final layer)", *(f"**{_pct1(agree['tuned'][e])}**" for e in EE_EXITS)],
            [f"shipped {heads['head']['type']} exit heads (untouched model)",
             *(_pct1(shipped[e]["trained"]) if e in shipped else "–" for e in EE_EXITS)]]
    fid, run, tr = ev["fidelity"], art["run"], art["training"]
    free = ev["free_run"]
    return (_table(["exit", *EE_EXITS], rows)
            + f"\n\nAgreement of each exit's top-1 token with the final layer on {ev['positions']:,} held-out positions "
              f"({ev['sequences']} prompts and the original model's continuations); the heads' row is their manifest's, "
              f"on {heads['evaluation']['tokens']:,} tokens of {heads['evaluation']['prompts']} other held-out prompts. "
              f"Cost to the model: the tuned model's greedy token equals the original's at "
              f"{fid['greedy_token_match']:.1%} of positions; perplexity on held-out text "
              f"{fid['ppl_heldout_text']['original']:.1f} → {fid['ppl_heldout_text']['tuned']:.1f} "
              f"({fid['ppl_change_heldout_text']:+.0%}); {free['identical_outputs']} of {free['prompts']} free-running "
              f"greedy outputs identical. The run: {run['train_tokens']:,} tokens of the original's greedy and sampled "
              f"continuations ({run['phases']['generate']:.0f} s to generate), {run['trained']['steps']} steps of "
              f"{tr['batch_size']} × {tr['seq_len']} in {run['trained']['seconds']:.0f} s "
              f"({run['trained']['tokens'] / run['train_tokens']:.1f} passes over the data; bf16, rank {tr['rank']}, "
              f"rotation {tr['rotation']}, layer dropout {tr['layer_dropout']}), {run['phases']['total']:.0f} s in all. "
              f"Adapter not shipped: {art['adapter']['why_not']}.")


def gpu_profile_table(profile: dict, check: dict) -> str:
    """One GPU session's CUDA-graph timings (synthetic acceptance) and its float32 exactness check."""
    runs = profile["runs"]
    ar = statistics.median(runs["autoregressive"])
    rows = [[name, f"{statistics.median(v):.0f} tok/s", _x(statistics.median(v) / ar),
             " / ".join(f"{x:.0f}" for x in v)] for name, v in runs.items()]
    ex, bf = check["exactness_fp32"], check["bf16_mismatch"]
    graphs = {m.removesuffix("+graphs"): v for m, v in bf["methods"].items() if m.endswith("+graphs")}
    same = bool(graphs) and all(bf["methods"][m] == v for m, v in graphs.items())
    return (_table(["method (synthetic acceptance)", "median of 3", "vs autoregressive", "the three runs"], rows)
            + f"\n\nShape {profile['shape']} ({profile['layers']} layers, d={profile['d']}, v={profile['v']}), random weights, "
              f"{profile['dtype']}, CUDA graphs, {profile['new_tokens']} new tokens after a {profile['prompt_tokens']}-token "
              f"prompt, methods alternating. Exactness in float32 in the same session "
              f"(`{check['command'].replace('/root/out/', '')}`): {ex['runs'] - len(ex['failures'])} of {ex['runs']} runs equal "
              f"transformers' `generate()`, {ex['graph_runs']} of them replayed from CUDA graphs; in bfloat16 every method "
              f"diverged from autoregressive on {'the same prompts at the same tokens' if same else 'other prompts or tokens'} "
              f"with CUDA graphs as without ({bf['graphs_vs_eager_autoregressive_differs']} autoregressive outputs differ "
              f"between the two modes). layerskip@0.9 drafts 4 tokens a round at exit v; hispec@0.9/0.9 drafts 2 at d, "
              f"judged at v, the full model once 4 are tentative; each judged token accepted with probability 0.9 "
              f"(timing only: the text is not the model's).")


# ---- the README's one table --------------------------------------------------------------------------

HEADLINE_ROWS = (  # (method, what it runs), in the order shown; a row shows where its run measured the method
    ("autoregressive@fp32", "plain decoding, the exact float32 model (the GGUF file dequantised by transformers); "
                            "its products widen the file's blocks to those float32 weights in registers"),
    ("autoregressive@fp32-torch", "plain decoding of the same float32 model through torch's products on the float "
                                  "weights (the float32 route until 2026-12-07)"),
    ("hispec/auto@fp32", "**the default**: lookup → the 4-bit model → the exact float32 model"),
    ("lookup+full@q4/auto@fp32", "the same with float32 activations in the 4-bit model (the default until 2026-12-05)"),
    ("full@q4/auto@fp32", "the 4-bit model drafting alone under the exact model (no lookup)"),
    ("lookup/auto@fp32", "prompt lookup alone under the exact float32 model (no 4-bit level)"),
    ("autoregressive@q4", "plain decoding of the 4-bit model, float32 activations (exact to itself)"),
    ("autoregressive@a8", "plain decoding of the 4-bit model, int8 activations (its text depends on the kernel build)"),
    ("hispec/auto@a8", "hispec on that model: prompt lookup alone (equal to its plain decoding in the same build)"),
    ("llamacpp", "llama.cpp, plain decoding of the same 4-bit GGUF"),
)
DEFAULT_LISTS = (["lookup", "full@q4"], ["lookup", "full@a8"])  # what hispec/auto@fp32 ran since 2026-12-04


def headline_table(*reports: dict) -> str:
    """The README's one table: the default against plain float32 decoding and llama.cpp, each method's
    tokens/s over plain float32 decoding on the same prompts of its own run (runs are lettered when there
    are several: ratios of different runs are not comparable with each other's tokens/s)."""
    import q4_goals as q

    rows, notes = [], []
    for i, report in enumerate(reports):
        run = "ABCDEF"[i]
        prompts = len({(r["set"], r["prompt_id"]) for r in report["records"]})
        spec = re.search(r"--prompts (\S+)", report.get("command", ""))
        commit = ((report.get("code") or {}).get("commit") or "not recorded")[:12]
        order = "a balanced order" if report.get("order") else "rotating"  # recorded since the balanced order
        notes.append(f"run {run}: {prompts} prompts (`{spec[1] if spec else '?'}`), methods in {order}, commit {commit}")
        tps = q.ratios(report)["tokens_per_s"]
        for method, what in HEADLINE_ROWS:
            shown = any(r[0] == method for r in rows)
            if method not in report["methods"] or (shown and method != "autoregressive@q4"):
                continue  # plain 4-bit decoding shows in every run: it says how far the runs' hosts differ
            typed = BenchMethod.parse(method)
            if method == "llamacpp":
                equal = f"no: differs on {sum(_differs(report, method))} of {prompts} prompts"
            elif typed.weights == "fp32" and method != "autoregressive@fp32":
                equal = "yes" if _equal_to(report, method, "autoregressive@fp32") else "NO"
            elif method != "autoregressive@fp32" and typed.weights and (typed.method == "autoregressive"
                                                                           or typed.weights == "a8"):
                n = sum(_differs(report, method))
                equal = "yes" if n == 0 else f"no: differs on {n} of {prompts} prompts"
            else:
                equal = "–"
            if method == "hispec/auto@fp32" and ran_levels(report, method) not in DEFAULT_LISTS:
                method_name, what = named(report, method), "hispec/auto before today's default (its exits)"
            else:
                method_name = method
            decode = q.median_rate(report, method, "decode_tokens_per_s")
            rows.append([method_name, what, f"{tps[method]:.1f} / {'not recorded' if decode is None else f'{decode:.1f}'}",
                         _both(report, method, "autoregressive@fp32"), _both(report, method, "autoregressive@q4"),
                         _first_token(report, method), equal] + ([run] if len(reports) > 1 else []))
        rows += [row + ([run] if len(reports) > 1 else []) for row in _llama_bench_rows(report)]
        if report.get("llama_bench"):
            notes.append(f"llama-bench rows (run {run}): llama.cpp's own binary after the prompts, same threads; "
                         "decode-only is its tg, time to first token its evaluation of the run's median prompt "
                         f"({_median_prompt(report)} tokens), end to end both together; ratios of medians")
    head = ["method@weights", "what runs", "tokens/s (median): end to end / decode-only",
            "× plain float32: end to end / decode-only", "× plain 4-bit (q4): end to end / decode-only",
            "time to first token (median)", "output equal to plain float32"] + (["run"] if len(reports) > 1 else [])
    return (_table(head, rows) + "\n\nEnd to end: from the start of the call to the last token, the prompt's "
            "evaluation included; decode-only: the tokens after the first over the time after the first token. "
            "Ratios: the geometric mean over the run's prompts of per-prompt ratios, "
            "greedy, 128 new tokens, one process. " + "; ".join(notes) + ".")


def _median_prompt(report: dict) -> int:
    from hispec.evaluation.llama_cpp.llama_bench import median_prompt_tokens

    return median_prompt_tokens(report["records"])


def _llama_bench_rows(report: dict) -> list[list[str]]:
    """llama-bench's rows (the default file, and another file where it ran one): its speeds as a run of the
    bench's budget after the run's median prompt, against the median plain float32 and q4 runs."""
    import q4_goals as q
    from hispec.evaluation.llama_cpp.llama_bench import as_run

    rows = []
    for figures in (report.get("llama_bench") or {}).get("files", []):
        run = as_run(figures, _median_prompt(report), report["max_new_tokens"])

        def over(reference: str) -> str:
            ref = [q.median_rate(report, reference, key) for key in ("tokens_per_s", "decode_tokens_per_s")]
            mine = (run["tokens_per_s"], run["decode_tokens_per_s"])
            return " / ".join(_x(m / r if r else None) for m, r in zip(mine, ref))

        name = "llama-bench" + (" (Q4_0: another file)" if figures["file_name"].endswith("Q4_0.gguf") else "")
        rows.append([name, f"llama.cpp's own binary: {figures['file']}",
                     f"{run['tokens_per_s']:.1f} / {run['decode_tokens_per_s']:.1f}", over("autoregressive@fp32"),
                     over("autoregressive@q4"), f"{run['ttft_s'] * 1e3:.1f} ms", "– (its own synthetic tokens)"])
    return rows


def _both(report: dict, method: str, reference: str) -> str:
    """'2.47× / 2.90×': the method over `reference` end to end and decode-only ('–' where not recorded)."""
    import q4_goals as q

    return " / ".join(_x(q.geomean_ratio(report, method, reference, key))
                      for key in ("tokens_per_s", "decode_tokens_per_s"))


def _first_token(report: dict, method: str) -> str:
    import q4_goals as q

    ttft = q.median_rate(report, method, "ttft_s")  # the median over prompts of any record key
    return f"{ttft * 1e3:.1f} ms" if ttft is not None else "not recorded"


def _differs(report: dict, method: str) -> list[bool]:
    """Per prompt: whether the method's output differs from plain float32 decoding's."""
    import q4_goals as q

    return [a != b for a, b in q.output_pairs(report, method, "autoregressive@fp32")]


# ---- the float32 lane on the file's blocks (scripts/measure/f32_widths.py) ---------------------------------

F32_WIDTH_WORDS = {"fp32-torch": "float32, torch's products on the float weights (before)",
                   "fp32": "float32 on the file's blocks, widened in registers (after)",
                   "q4": "4-bit, float32 activations", "a8": "4-bit, int8 activations"}


def f32_widths_table(report: dict) -> str:
    """One full-model pass per format and width (ms, and over the format's 1-row pass), its roofline, and how
    far its 8-row logits are from the float32 route of before."""
    widths = list(next(iter(report["formats"].values()))["ms"])
    head = (["format", "bytes a step reads"] + [f"{w} row{'s' if w != '1' else ''}" for w in widths]
            + ["roofline (read bandwidth)", "8 rows: max logit difference from before, argmax equal"])
    rows = []
    for fmt, e in report["formats"].items():
        roof = f"{e['roofline_ms']:.2f} ms" + (f" (its float weights: {e['float_roofline_ms']:.2f} ms)"
                                               if fmt == "fp32" and "float_roofline_ms" in e else "")
        diff = e.get("vs_fp32_torch_8rows")
        rows.append([F32_WIDTH_WORDS.get(fmt, fmt), f"{e['step_bytes'] / 1e6:.0f} MB"]
                    + [f"{e['ms'][w]:.1f} ms ({e['over_1'][w]:.2f}×)" for w in widths] + [roof,
                    "–" if fmt == "fp32-torch" or not diff else
                    f"{diff['max_abs_logit_diff']:.1e}, {'yes' if diff['argmax_equal'] else 'NO'}"])
    return (_table(head, rows) + f"\n\nA full-model pass (embedding, {'every decoder layer'}, final norm, LM head) of "
            f"1-{widths[-1]} new rows after a {report['context']}-token context, the median of {report['repeats']} "
            "calls taken round by round across formats; in brackets, over the same format's 1-row pass. Roofline: "
            f"the bytes a step reads over the run's read bandwidth ({report['read_gbs']:.1f} GB/s, the higher of "
            "its start and end medians).")


# ---- several visitors at once (bench --visitors) -------------------------------------------------------------

def _plans_words(r: dict) -> str:
    """'plain step (full model): 120 → 180; lookup → full model: 30 → 12': each plan's rounds, alone → at once."""
    alone, together = r["alone"]["plans"], r["together"]["plans"]
    keys = sorted(set(alone) | set(together), key=lambda k: -(alone.get(k, 0) + together.get(k, 0)))
    return "; ".join(f"{kind_words(k)}: {alone.get(k, 0)} → {together.get(k, 0)}" for k in keys)


def visitors_table(report: dict) -> str:
    """Per method and visitor count: the machine's tokens/s one after another and at once, their ratio, each
    visitor's speed against its solo run, and whether every visitor's token ids equal its solo run's."""
    head = ["method", "visitors", "one after another, tok/s", "at once, tok/s", "machine ×", "each visitor × its solo "
            "(median, lowest)", "first token at once (median, slowest)", "token ids equal to solo"]
    rows = []
    for r in report["results"]:
        ttft = sorted(v["ttft_s"] for v in r["together"]["visitors"])
        rows.append([r["method"], r["visitors"], f"{r['alone']['machine_tokens_per_s']:.1f}",
                     f"{r['together']['machine_tokens_per_s']:.1f}", f"{r['machine_ratio']:.2f}×",
                     f"{r['visitor_ratio_median']:.2f}×, {r['visitor_ratio_min']:.2f}×",
                     f"{ttft[len(ttft) // 2]:.2f} s, {ttft[-1]:.2f} s",
                     "yes" if r["all_equal_to_solo"] else f"NO ({len(r['differ'])} differ)"])
    plans = [[r["method"], r["visitors"], _plans_words(r)] for r in report["results"]
             if r["alone"].get("plans") and set(r["alone"]["plans"]) | set(r["together"]["plans"]) != {PLAIN_KEY}]
    if plans:  # the adaptive policy's rounds by plan: what it chose alone, and beside the others
        rows_words = _table(["method", "visitors", "rounds by plan: one after another → at once"], plans)
    else:
        rows_words = ""
    return (_table(head, rows) + (f"\n\n{rows_words}" if rows_words else "")
            + f"\n\n{report['prompts']} prompts, {report['max_new_tokens']} new tokens each; N "
            "visitors take the first N (repeated where fewer). Both series count prompt evaluation (a visitor's "
            "clock starts before its prompt is read); the machine's tokens/s is every visitor's tokens over the wall "
            "clock from the first start to the last end. At once, each visitor runs in its own thread and its passes "
            "share one call of the native route with the others' (the pass board).")

