"""python -m hispec: the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from dataclasses import replace

from hispec.cli.parsers import build_parser
from hispec.engine.config import METHODS, preset
from hispec.engine.planning.policy import DEFAULT_POLICY
from hispec.errors import HiSpecError


def cmd_train_exits(args) -> int:
    from hispec.training.heads.command import cli

    return cli(args)


def cmd_profile(args) -> int:
    from hispec.evaluation.profile import format_table, profile
    from hispec.model.loading import load_model

    if args.context < 1 or args.repeats < 1:
        raise HiSpecError("--context and --repeats must be at least 1")
    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr),
                    weights=_one_format(args))
    if args.stock:
        lm.ee.set_lean(False)
    if args.context + 16 > lm.ee.context_limit:
        raise HiSpecError(f"--context {args.context} + 16 new tokens exceeds the model's context of "
                          f"{lm.ee.context_limit} tokens")
    result = profile(lm, context=args.context, repeats=args.repeats,
                     progress=lambda m: print(f"profiling {m}", file=sys.stderr, flush=True))
    result["command"] = getattr(args, "command_line", None)
    print(json.dumps(result, indent=1) if args.json else format_table(result))
    return 0


def parse_methods(text: str) -> list[tuple]:
    """generate's --method: (each of ours as written, the name the output shows; its BenchMethod)."""
    from hispec.evaluation.method import BenchMethod

    methods = [(m.strip(), BenchMethod.parse_ours(m)) for m in text.split(",") if m.strip()]
    if not methods:
        raise HiSpecError(f"no method given; choose from {', '.join(METHODS)}")
    return methods


def cmd_generate(args) -> int:
    from hispec.cli.terminal import legend, render
    from hispec.data.prompts import load_sets
    from hispec.runs.runner import run_loaded
    from hispec.model.loading import load_model
    from hispec.text import Detokenizer

    parsed = parse_methods(args.method)
    methods, specs = [m for m, _ in parsed], dict(parsed)
    if args.repeats < 1:
        raise HiSpecError("--repeats must be at least 1")
    if args.prompts:
        prompts = [{"id": p.id, "prompt": p.text, "chat": p.chat} for ps in load_sets(args.prompts).values() for p in ps]
    else:
        prompts = [{"id": "0", "prompt": args.prompt, "chat": True}]
    for p in prompts:
        p["chat"] = p["chat"] and not args.raw
    configs = {m: preset(method=spec.method, draft_layer=args.draft_layer, verify_layer=args.verify_layer,
                               draft_len=args.draft_len, verify_threshold=args.verify_threshold,
                               max_new_tokens=args.max_new_tokens, stop_strings=tuple(args.stop),
                               temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                               levels=spec.levels or (args.levels if spec.method == "hispec" else None),
                               policy="fixed" if spec.method == "autoregressive" else spec.policy or args.policy,
                               lookup_len=args.lookup_len, lengths=args.lengths)  # autoregressive: the plain loop
               for m, spec in specs.items()}
    for config in configs.values():  # bad numbers fail before the model loads
        config.validate()
    lm = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                    progress=lambda msg: print(msg, file=sys.stderr), exits=args.exits, weights=_one_format(args))
    if args.cuda_graphs:
        lm.ee.set_graphs("cuda")
    configs = {m: c.resolve_for(lm.ee) for m, c in configs.items()}
    detok = Detokenizer(lm.tokenizer)
    color = not args.no_color and sys.stdout.isatty()
    for p in prompts:
        if not p["prompt"].strip():
            raise HiSpecError(f"prompt {p['id']} is empty: give some text")
    from hispec.evaluation.order import Balanced

    several = len(methods) > 1
    costs = None
    if several:  # a fair ratio table: one cost model for all, a warm-up of each, the order balanced
        from hispec.evaluation.bench import CostSnapshot

        costs = CostSnapshot.for_methods(lm, list(configs.values()))
        first = lm.encode(prompts[0]["prompt"], chat=prompts[0]["chat"])
        for method in methods:  # untimed, unprinted
            costs.restore(lm)
            run_loaded(lm, first, replace(configs[method], max_new_tokens=min(8, args.max_new_tokens)), detok)
    for n, p in enumerate(prompts):
        ids = lm.encode(p["prompt"], chat=p["chat"])
        runs: dict[str, list] = {m: [] for m in methods}
        for rep in range(args.repeats if several else 1):
            for method in Balanced(methods).of(n * args.repeats + rep):  # evaluation.order: drift hits all alike
                if costs is not None:
                    costs.restore(lm)
                result = run_loaded(lm, ids, configs[method], detok)
                result.method = method  # the name as written (e.g. hispec/fixed)
                runs[method].append(result)
        for method in methods:  # printed in the order given
            result = runs[method][0]
            if args.json:
                record = result.record(p["id"])
                if len(runs[method]) > 1:
                    record["runs_tokens_per_s"] = [r.stats["tokens_per_s"] for r in runs[method]]
                print(json.dumps(record), flush=True)
            else:
                print(f"\n== prompt {p['id']} · {method} ==")
                print(render(result.trace, color=color, show_rejected=args.show_rejected))
                print(stats_table(result))
        if not args.json and several:
            print(compare_table(runs, methods, rotated=len(prompts) > 1 or args.repeats > 1))
    if not args.json:
        print("\nlegend: " + legend(color=color, show_rejected=args.show_rejected), file=sys.stderr)
    return 0


def _llama_bench(args, lm, report: dict) -> None:
    """llama-bench in the same run, after the prompts: the default file (and the Q4_0 file), the run's threads
    and median prompt length; kept in the report and its JSON."""
    import torch

    from hispec.evaluation.llama_cpp import llama_bench as lb
    from hispec.evaluation.record import write
    from hispec.model.loading import default_gguf_path

    if lm.name != "default":
        raise HiSpecError(f"--llama-bench runs the default model's GGUF file; '{lm.name}' has none")
    options = dict(threads=torch.get_num_threads(), tokens=report["max_new_tokens"],
                   prompt_lengths=(lb.median_prompt_tokens(report["records"]),))
    print("llama-bench: the default model's file" + (" and the Q4_0 file" if args.llama_bench_q4_0 else ""),
          file=sys.stderr)
    files = [lb.measure(args.llama_bench, default_gguf_path(), lb.DEFAULT_FILE, **options)]
    if args.llama_bench_q4_0:
        files.append(lb.measure(args.llama_bench, args.llama_bench_q4_0, lb.Q4_0_FILE, **options))
    report["llama_bench"] = {"binary": str(args.llama_bench), "files": files}
    if args.json:
        write(args.json, report)


def cmd_bench(args) -> int:
    from hispec.evaluation.bench import benchmark, expand_weights
    from hispec.evaluation.report import write_html

    if args.sweep is not None or any((args.draft_layers, args.verify_layers, args.draft_lens, args.verify_thresholds)):
        return cmd_sweep(args)
    if args.visitors is not None:
        return cmd_visitors(args)
    from hispec.evaluation import peers
    from hispec.evaluation.method import BENCH_METHODS, BenchMethod
    from hispec.model.loading import load_model

    typed = [m.strip() for m in (args.methods or ",".join(BENCH_METHODS)).split(",") if m.strip()]
    for path, what in ((args.llama_bench, "--llama-bench"), (args.llama_bench_q4_0, "--llama-bench-q4_0")):
        if path is not None and not Path(path).is_file():
            raise HiSpecError(f"{what} {path}: no such file (build llama-bench with python scripts/measure/"
                              "llama_bench.py --build-only; --q4_0 there makes the Q4_0 file)")
    if args.llama_bench_q4_0 and not args.llama_bench:
        raise HiSpecError("--llama-bench-q4_0 needs --llama-bench BINARY")
    formats = _formats(args)
    methods = expand_weights([BenchMethod.parse(m) for m in typed], formats, args.policy)
    peers.check(methods)  # a peer that cannot run here, said once
    base, sets, lm = _bench_inputs(args, formats[0])
    models = {formats[0]: lm}
    for fmt in formats[1:]:  # the same model in the other formats, side by side in this process
        models[fmt] = load_model(args.model, device=args.device, dtype=args.dtype, exits=args.exits, weights=fmt,
                                 progress=lambda m: print(m, file=sys.stderr))

    def progress(done, total, what):
        print(f"[{done}/{total}] {what}", file=sys.stderr, flush=True)

    from hispec.evaluation.host import busy_cores

    with busy_cores(args.background_load) as background:
        report = benchmark(lm, sets, methods, base, args.layerskip_exit, json_path=args.json,
                           warmup=not args.no_warmup, progress=progress, models=models if len(models) > 1 else None,
                           host=True, command=getattr(args, "command_line", None), background=background)
    if args.llama_bench and report["records"]:
        _llama_bench(args, lm, report)
    if args.html:
        write_html(report, args.html)
    if args.svg:
        from hispec.evaluation.svg_chart import write_svg

        write_svg(report, args.svg, title=f"{lm.name}: tokens/s relative to autoregressive "
                                          f"({args.max_new_tokens} new tokens, {lm.device}, {lm.dtype})")
    ref = report["summary"]["all"]["reference"]
    width = max(len(name) for name in report["summary"]) + 2
    for set_name, s in report["summary"].items():
        for m, r in s["methods"].items():
            share = f"  time in layer passes {r['layers_share']:.0%}" if r.get("layers_share") is not None else ""
            geo = (r.get("vs_reference") or {}).get("geomean")
            geo = f"  per prompt {geo:.2f}x (geometric mean)" if geo is not None else ""
            dec = (r.get("vs_reference_decode") or {}).get("geomean")
            dec = (f"  decode-only {r['decode_tokens_per_s']:.2f} tok/s, per prompt {dec:.2f}x, first token "
                   f"{r['ttft_s'] * 1e3:.1f} ms" if dec is not None else "")
            print(f"{set_name:<{width}}{m:<16}{r['tokens_per_s']:>9.2f} tok/s end to end  "
                  f"{r['speedup_vs'].get(ref, 1.0):>6.2f}x vs {ref} (medians){geo}{dec}  outputs equal: {_equality(r)}{share}")
    for fmt, b in (report.get("memory_bound") or {}).items():
        if b.get("step_ms"):
            print(f"{fmt}: plain step {b['step_ms']:.2f} ms = {b['step_over_bound']:.2f}x its memory bound "
                  f"({b['weight_bytes'] / 1e6:.1f} MB at {b['read_gbs']:.1f} GB/s read = {b['bound_ms']:.2f} ms)"
                  + (f", {b['step_over_float_bound']:.2f}x its float weights' ({b['float_bytes'] / 1e6:.1f} MB: "
                     f"{b['float_bound_ms']:.2f} ms)" if b.get("step_over_float_bound") else "")
                  + (f", {b['step_over_matvec_bound']:.2f}x its float32 products' bound ({b['matvec_gbs']:.1f} GB/s "
                     f"through torch.mv = {b['matvec_bound_ms']:.2f} ms)" if b.get("step_over_matvec_bound") else ""))
    if not report["summary"]["all"]["all_outputs_equal"] and lm.dtype != "float32":
        print(f"note: in {lm.dtype}, passes over different numbers of tokens can round a "
              "near-tie differently, so outputs may differ from autoregressive; exactness holds in float32",
              file=sys.stderr)
    return 0


def cmd_visitors(args) -> int:
    """bench --visitors: several visitors at once against one after another (evaluation.visitors)."""
    from hispec.evaluation.bench import expand_weights
    from hispec.evaluation.method import BenchMethod
    from hispec.evaluation.visitors import table, visitor_counts, visitors_bench
    from hispec.model.loading import load_model

    counts = visitor_counts(args.visitors)  # checked before the model loads
    formats = _formats(args)
    typed = [m.strip() for m in (args.methods or "hispec,autoregressive").split(",") if m.strip()]
    methods = expand_weights([BenchMethod.parse(m) for m in typed], formats, args.policy)
    base, sets, lm = _bench_inputs(args, formats[0])
    models = {formats[0]: lm}
    for fmt in formats[1:]:
        models[fmt] = load_model(args.model, device=args.device, dtype=args.dtype, exits=args.exits, weights=fmt,
                                 progress=lambda m: print(m, file=sys.stderr))
    prompts = [lm.encode(p.text, chat=p.chat) for group in sets.values() for p in group]
    if not prompts:
        raise HiSpecError(f"--prompts {args.prompts}: no prompts to run")
    report = visitors_bench(models, prompts, methods, base, counts, formats[0], json_path=args.json,
                            progress=lambda line: print(line, file=sys.stderr, flush=True),
                            command=getattr(args, "command_line", None))
    print(table(report))
    return 0


def _equality(summary: dict) -> str:
    """'yes', or how many outputs differ from the reference and where the first difference came."""
    if summary["outputs_equal"]:
        return "yes"
    firsts = summary.get("first_divergence") or []
    where = f", first at token {firsts[0] + 1}" if firsts else ""  # 1 = the first generated token
    return f"NO ({summary['outputs_differ']} of {summary['prompts']} differ{where})"


def _formats(args) -> list[str]:
    """--weights as a list of formats (fp32,q4,a8), each checked; default $HISPEC_WEIGHTS, else fp32."""
    from hispec.model.loading import resolve_weights

    if args.weights is None:
        return [resolve_weights(None)]
    formats = [resolve_weights(f) for f in args.weights.split(",") if f.strip()]
    if not formats or len(set(formats)) < len(formats):
        raise HiSpecError(f"--weights {args.weights}: give one of fp32, q4, a8 or a list of them without repeats "
                          "(fp32,q4,a8)")
    return formats


def _one_format(args) -> str:
    formats = _formats(args)
    if len(formats) > 1:
        raise HiSpecError(f"--weights {args.weights}: this command loads one format (fp32, q4 or a8); bench runs several")
    return formats[0]


HELDOUT_SPECS = ("heldout", "heldout-tune", "heldout-report")  # see data.prompts (the split)
FRESH_NAME = "heldout-fresh"  # data.prompts.FRESH_NAME: the split no development touches (no sweeps on it)


def _bench_inputs(args, weights: str | None = None):
    """bench/sweep: the base settings (checked before the model loads), prompt sets and model."""
    from hispec.data.prompts import load_sets
    from hispec.model.loading import load_model

    if getattr(args, "levels", None):
        raise HiSpecError(f"bench takes level lists as methods, joined by '+': --methods "
                          f"{args.levels.replace(',', '+')} (not --levels)")
    base = preset("hispec", args.draft_layer, args.verify_layer, args.draft_len, args.verify_threshold,
                        args.max_new_tokens, policy=getattr(args, "policy", DEFAULT_POLICY),
                        lookup_len=getattr(args, "lookup_len", 8), lengths=getattr(args, "lengths", None))
    base.validate()
    # 'heldout[:N]', 'heldout-tune[:N]', 'heldout-report[:N]': the exit heads' held-out prompts, all or
    # one split of them (N per held-out set), known once the model is loaded
    parts = [p.strip() for p in args.prompts.split(",") if p.strip()]
    heldout = [p for p in parts if p.partition(":")[0] in HELDOUT_SPECS]
    others = ",".join(p for p in parts if p not in heldout)
    sets = load_sets(others, seed=args.seed) if others else {}
    for part in heldout:
        name, colon, count = part.partition(":")
        if colon and not (count.isdigit() and int(count) > 0):
            raise HiSpecError(f"'{part}': write {name} or {name}:N (N prompts per held-out set)")
    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=lambda m: print(m, file=sys.stderr),
                    exits=args.exits, weights=weights or _one_format(args))
    if args.cuda_graphs:
        lm.ee.set_graphs("cuda")
    if heldout:
        import random

        from hispec.data.prompts import apply_split
        from hispec.training.heads.prompts import heldout_prompts

        every = heldout_prompts(lm)
        chosen = {}
        for part in heldout:
            name, _, count = part.partition(":")
            held = every if name == "heldout" else apply_split(every, name.removeprefix("heldout-"))
            if count:
                held = {k: random.Random(args.seed).sample(v, min(int(count), len(v))) for k, v in held.items()}
            chosen.update(held)
        sets = {**chosen, **sets}
    base.resolve_for(lm.ee)
    return base, sets, lm


def cmd_sweep(args) -> int:
    from pathlib import Path

    from hispec.evaluation.report import write_html
    from hispec.evaluation.sweep import build_grids, format_table, resolve_grids, sweep

    if args.methods is not None or args.layerskip_exit is not None:
        raise HiSpecError("--methods and --layerskip-exit do not apply to --sweep: a sweep runs hispec at every "
                          "grid point and autoregressive as the reference")
    if FRESH_NAME in args.prompts:
        raise HiSpecError(f"a sweep chooses settings, and nothing is chosen on {FRESH_NAME}: it is the split no "
                          "development touches; sweep on heldout-tune")
    grids = build_grids(args.sweep or "", args.draft_layers, args.verify_layers, args.draft_lens,
                        args.verify_thresholds)
    base, sets, lm = _bench_inputs(args)
    base = replace(base, policy="fixed")  # a sweep measures fixed settings, point by point
    grids = resolve_grids(grids, lm.ee.num_layers)

    def progress(done, total, what):
        print(f"[{done}/{total}] {what}", file=sys.stderr, flush=True)

    try:
        report = sweep(lm, sets, grids, base, json_path=args.json, warmup=not args.no_warmup, progress=progress,
                       command=getattr(args, "command_line", None))
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
    """The run's stats on one line (the app shows the same rows as a table)."""
    from hispec.engine.levels import levels_by_role
    from hispec.runs.metrics import stats_rows

    rows = stats_rows(result.stats, levels_by_role(tuple(result.settings.get("levels") or ())))
    head = f"-- {rows[0][1]} tokens in {rows[1][1]} = {rows[2][1]} tok/s"
    setup = result.stats.get("setup_s") or 0.0
    if setup > 0.2 and setup > 0.2 * (result.stats.get("wall_s") or 0.0):  # one-off work, said as such
        head += (f" (of which {setup:.2f} s set-up: the adaptive policy times this machine's passes once per "
                 "process, and a 4-bit level builds its copy)")
    return " · ".join([head] + [f"{k} {v}" for k, v in rows[3:]])


def compare_table(runs: dict[str, list], methods: list[str], rotated: bool = True) -> str:
    """Speed ratios against the first method: each run's tokens/s over the first method's run of the
    same round (their neighbour in time), the median over rounds; tok/s is the median of the runs."""
    import statistics

    base = methods[0]
    count = len(runs[base])
    how = (f"after a warm-up run of each method; {count} run{'s' if count > 1 else ''} each"
           + (", the order balanced from run to run (each method after each other equally often)" if rotated
              else ", in the order given")
           + ("" if count > 1 else " (single warm runs: --repeats N for medians)")
           + f"; ratio = median of per-run ratios to {base}")
    lines = [f"\n{how}", f"{'method':<16}{'tok/s':>9}{'vs ' + base:>22}  same output as {base}"]
    for m in methods:
        tps = statistics.median(r.stats["tokens_per_s"] for r in runs[m])
        ratios = [r.stats["tokens_per_s"] / b.stats["tokens_per_s"] for r, b in zip(runs[m], runs[base])
                  if b.stats["tokens_per_s"]]
        ratio = statistics.median(ratios) if ratios else 0.0
        same = all(r.token_ids == runs[base][0].token_ids for r in runs[m])
        lines.append(f"{m:<16}{tps:>9.2f}{ratio:>21.2f}x  {'yes' if same else 'NO'}")
    return "\n".join(lines)


def cmd_train_ee(args) -> int:
    from hispec.training.layerskip.command import run_from_args

    return run_from_args(args, log=lambda msg: print(msg, file=sys.stderr, flush=True))


REPOSITORY_TOOLS = {
    "figures": "the README's generated figures are repository tooling: run `python scripts/figures.py` "
               "(or `python scripts/figures.py --check`) from a checkout",
    "load-test": "the load test is repository tooling: run `python scripts/measure/load_test.py --help` from a checkout",
}


def main(argv: list[str] | None = None) -> int:
    import shlex

    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    if given and given[0] in REPOSITORY_TOOLS:  # a command people look for here that lives in scripts/
        print(f"hispec: '{given[0]}' is not a command of the package: {REPOSITORY_TOOLS[given[0]]}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.command_line = "python -m hispec " + shlex.join(sys.argv[1:] if argv is None else argv)  # for the reports
    try:
        return {"generate": cmd_generate, "bench": cmd_bench, "profile": cmd_profile,
                "train-exits": cmd_train_exits, "train-ee": cmd_train_ee}[args.command](args)
    except HiSpecError as exc:
        print(f"hispec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hispec: interrupted", file=sys.stderr)
        return 130
