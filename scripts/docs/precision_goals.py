"""Issue 35's figures from a bench JSON run in both weight formats with the precision levels
(``bench --weights fp32,q4 --methods autoregressive@fp32,...,lookup+full@q4/auto@fp32,...``): each
method's geometric mean of per-prompt ratios to its own format's plain decoding and to the same
policy without three-level plans, the share of rounds that ran three levels, output equality with
its format's plain decoding, and the goals met or missed. Used by the README's generated table
(figures_tables.precision_table): repository tooling, outside the package."""

from __future__ import annotations

from q4_goals import geomean_ratio, output_pairs  # noqa: F401 (geomean_ratio also used by figures_tables)

from dataclasses import replace

from hispec.engine.planning.round import key_levels
from hispec.evaluation.method import BenchMethod

# hispec/auto with the precision level, per weight format: lookup, the cheaper full model, the exact model
# (float32: the 4-bit model; 4-bit: the same blocks with int8 activations, the 'a8' level). Found by the
# level list its records ran (`with_method`): since 2026-12-04 hispec/auto itself runs the float32
# list on the default model; earlier runs named the list.
PRECISION = {"fp32": ["lookup", "full@q4"], "q4": ["lookup", "full@a8"]}
WITH = {"fp32": "lookup+full@q4/auto", "q4": "lookup+full@a8/auto"}  # the list's own name, where none ran it
WITHOUT = "lookup+4/auto"  # the same policy with exit 4 as the middle level: a weaker drafter than the 4-bit model,
# whose three-level plans never pay (issue 35). Not the 4-bit drafter alone: that is full@q4/auto (issue 51)


def with_method(report: dict, fmt: str) -> str | None:
    """The method of this format whose records ran the precision list under the auto policy: hispec/auto
    where it did, else the first such (None: none in this run)."""
    ran: dict[str, tuple] = {}
    for rec in report["records"]:
        settings = rec.get("settings") or {}
        ran.setdefault(rec["method"], (settings.get("levels"), settings.get("policy")))
    found = [m for m in report["methods"] if fmt_of(m) == fmt and ran.get(m) == (PRECISION[fmt], "auto")]
    return next((m for m in found if base_of(m) == "hispec/auto"), found[0] if found else None)


def fmt_of(method: str) -> str | None:
    """The weights a method key names ('hispec/auto@q4' -> 'q4'; None: none)."""
    return BenchMethod.parse(method).weights


def base_of(method: str) -> str:
    """A method key without its weights ('lookup+full@q4/auto@fp32' -> 'lookup+full@q4/auto')."""
    return replace(BenchMethod.parse(method), weights=None).key


def on(method: str, fmt: str | None) -> str:
    """A method key on the weights `fmt` ('lookup+4/auto', 'q4' -> 'lookup+4/auto@q4')."""
    return replace(BenchMethod.parse(method), weights=fmt).key


def three_level_share(report: dict, method: str) -> float | None:
    """Rounds whose plan ran two levels below the exact model (a '->' plan: a judged copy, a copy judged
    and drafted on, the hierarchy), over all the method's rounds, every prompt together."""
    total = three = 0
    for rec in report["records"]:
        if rec["method"] == method:
            for kind, n in (rec.get("policy_choices") or {}).items():
                total += n
                three += n if len(key_levels(kind)) > 1 else 0
    return three / total if total else None


def outputs_equal(report: dict, method: str, reference: str) -> bool:
    pairs = output_pairs(report, method, reference)
    return bool(pairs) and all(a == b for a, b in pairs)


def rows(report: dict) -> list[dict]:
    out = []
    for m in report["methods"]:
        fmt = fmt_of(m)
        plain, without = BenchMethod.plain(fmt).key, on(WITHOUT, fmt)
        out.append({"method": m, "format": fmt, "vs_plain": geomean_ratio(report, m, plain),
                    "vs_without": None if base_of(m) in (WITHOUT, "autoregressive") else geomean_ratio(report, m, without),
                    "three_level": three_level_share(report, m),
                    "equal": None if m == plain else outputs_equal(report, m, plain)})
    return out


def goals(report: dict) -> list[tuple[str, str, bool | None]]:
    """The issue's goals, per format: (goal, measured, met; None: not measurable from this run)."""
    by = {r["method"]: r for r in rows(report)}
    out = []
    for fmt, speed_goal in (("fp32", 2.0), ("q4", 1.5)):
        method = with_method(report, fmt)
        if method is None:
            out.append((f"{fmt}: hispec/auto with a precision level ({WITH[fmt]})", "not in this run", None))
            continue
        r, name = by[method], base_of(method)
        if name != WITH[fmt]:
            name += f" ({' → '.join(PRECISION[fmt])})"
        share = r["three_level"]
        out.append((f"{fmt}: {name}: three-level plans >= 30% of rounds", f"{share:.0%}" if share is not None else "–",
                    None if share is None else share >= 0.30))
        out.append((f"{fmt}: {name}: >= {speed_goal}x plain decoding", f"{r['vs_plain']}x" if r["vs_plain"] is not None else "–",
                    None if r["vs_plain"] is None else r["vs_plain"] >= speed_goal))
        out.append((f"{fmt}: {name}: >= 1.2x the same policy with exit 4 as its middle level ({WITHOUT})", f"{r['vs_without']}x" if r["vs_without"] is not None else f"– ({on(WITHOUT, fmt)} not in this run)",
                    None if r["vs_without"] is None else r["vs_without"] >= 1.2))
        out.append((f"{fmt}: {name}: output equal to plain decoding", "yes" if r["equal"] else "NO", bool(r["equal"])))
    return out
