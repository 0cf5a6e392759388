"""Design-space sweeps of HiSpec: throughput and acceptance over a grid of settings.

Two grids, the paper's design-space figure:

    layers   draft exit d x intermediate verifier exit v   (draft_len, verify_threshold fixed)
    lengths  draft_len x verify_threshold                  (d, v fixed)

Every grid point runs hispec on the same prompts in one process, next to an autoregressive
reference on those prompts, so every point is reported as a speedup ratio. The prompts are timed
by the loop bench and sweep share (evaluation.timed_passes): a warm-up, then every point (the
reference included) once per prompt in a balanced order (evaluation.order), recorded, so that
machine noise hits them alike; the JSON report is rewritten after every prompt, so an interrupted
sweep keeps what it measured.
"""

from __future__ import annotations

import json
import statistics
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from hispec.engine.config import DecodeConfig, Preset, default_exits, preset
from hispec.errors import ConfigError
from hispec.evaluation.bench import geomean, iqr, mean_or_none, run_one
from hispec.evaluation.method import BenchMethod
from hispec.evaluation.record import run_record
from hispec.evaluation.timed_passes import Items, time_passes
from hispec.data.prompts import Prompt
from hispec.model.loading import LoadedModel

PLAIN, HISPEC = BenchMethod.plain(), BenchMethod.parse("hispec")  # the reference, and every grid point
REFERENCE = PLAIN.key
# grid name -> (row axis, column axis); rows are the heatmap's y, columns its x
AXES = {"layers": ("draft_layer", "verify_layer"), "lengths": ("draft_len", "verify_threshold")}
LABELS = {"draft_layer": "draft layer d", "verify_layer": "verify layer v", "draft_len": "draft_len",
          "verify_threshold": "verify_threshold"}
SHORT = {"draft_layer": "d", "verify_layer": "v", "draft_len": "draft_len", "verify_threshold": "threshold"}
DEFAULT_DRAFT_LENS, DEFAULT_VERIFY_THRESHOLDS = (1, 2, 3, 4), (2, 4, 6, 8)


def default_layer_values(num_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Draft and verify layers around the defaults (d = L/8, v = L/4) when none are given."""
    L = num_layers
    d, v = default_exits(L)
    drafts = sorted({x for x in (round(L / 16), d, round(3 * L / 16)) if 0 < x < L - 1})
    verifies = sorted({x for x in (v, round(3 * L / 8), round(L / 2)) if 1 < x < L})
    return tuple(drafts or [1]), tuple(verifies or [min(2, L - 1)])


def parse_values(text: str, option: str) -> tuple[int, ...]:
    """'2,4,6' or '2-6' (inclusive) or a mix, into sorted distinct whole numbers >= 1."""
    values: set[int] = set()
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            numbers = range(int(lo), int(hi) + 1) if dash and lo else [int(part)]
        except ValueError:
            raise ConfigError(f"{option} '{text}': '{part}' is not a whole number or a range like 2-6") from None
        if dash and lo and int(lo) > int(hi):
            raise ConfigError(f"{option} '{text}': the range '{part}' is empty (write the smaller number first)")
        for n in numbers:
            if n < 1:
                raise ConfigError(f"{option} '{text}': {n} is not allowed, every value must be a whole number >= 1")
            values.add(n)
    if not values:
        raise ConfigError(f"{option} is empty: give comma-separated whole numbers, e.g. 2,4,6")
    return tuple(sorted(values))


@dataclass(frozen=True)
class Grid:
    """One sweep grid: `rows` x `cols` values of the grid's two settings (see AXES)."""

    name: str
    rows: tuple[int, ...]
    cols: tuple[int, ...]

    def __post_init__(self):
        if self.name not in AXES:
            raise ConfigError(f"unknown sweep '{self.name}'; choose from {', '.join(AXES)}")
        for axis, values in zip(AXES[self.name], (self.rows, self.cols)):
            if not values or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in values):
                raise ConfigError(f"{LABELS[axis]} values must be whole numbers >= 1 (got {list(values)})")
        if not self.cells():
            raise ConfigError(f"the {self.name} grid has no valid point: every draft layer ({_list(self.rows)}) "
                              f"must be below some verify layer ({_list(self.cols)})")

    @property
    def axes(self) -> tuple[str, str]:
        return AXES[self.name]

    def _why_not(self, row: int, col: int) -> str | None:
        if self.name == "layers" and row >= col:
            return f"draft layer {row} is not below verify layer {col}"
        return None

    def cells(self) -> list[tuple[int, int]]:
        return [(r, c) for r in self.rows for c in self.cols if self._why_not(r, c) is None]

    def skipped(self) -> list[dict]:
        """Invalid points of the grid, each with the reason; they are not run."""
        return [{self.axes[0]: r, self.axes[1]: c, "reason": self._why_not(r, c)}
                for r in self.rows for c in self.cols if self._why_not(r, c) is not None]

    def check(self, num_layers: int) -> None:
        """Layers a model of `num_layers` layers cannot exit at are an error (before any run)."""
        if self.name != "layers":
            return
        bad = [x for x in sorted(set(self.rows) | set(self.cols)) if not 0 < x < num_layers]
        if bad:
            raise ConfigError(f"layer(s) {_list(bad)} of the layers sweep are impossible: this model has "
                              f"{num_layers} layers, so draft and verify layers must be between 1 and {num_layers - 1}")

    def config(self, row: int, col: int, base: DecodeConfig) -> DecodeConfig:
        if self.name == "layers":  # the paper's (d, v) grid: the hispec preset at each pair
            return replace(base, levels=None, preset=Preset("hispec", row, col))
        return replace(base, lengths=(row, col))  # the lengths grid: a fixed round's (k, t)


def _in_paper_names(config: DecodeConfig) -> dict:
    """A resolved hispec configuration as the sweep's axes name it: d, v and the two lengths."""
    return {"draft_layer": config.preset.draft_layer, "verify_layer": config.preset.verify_layer,
            "draft_len": config.preset.draft_len, "verify_threshold": config.preset.verify_threshold}


def _list(values) -> str:
    return ", ".join(map(str, values))


def build_grids(kinds: str, draft_layers: str | None = None, verify_layers: str | None = None,
                draft_lens: str | None = None, verify_thresholds: str | None = None) -> list[Grid]:
    """Grids from the command line's strings; checks everything that does not need the model.
    A layers grid without its lists is left for `resolve_grids` (its defaults depend on L)."""
    names = [k.strip() for k in kinds.split(",") if k.strip()]
    for n in names:
        if n not in AXES:
            raise ConfigError(f"unknown sweep '{n}'; choose from {', '.join(AXES)} (or both: layers,lengths)")
    if "layers" not in names and (draft_layers or verify_layers):
        raise ConfigError("--draft-layers/--verify-layers need --sweep layers")
    if "lengths" not in names and (draft_lens or verify_thresholds):
        raise ConfigError("--draft-lens/--verify-thresholds need --sweep lengths")
    if not names:
        raise ConfigError(f"no sweep given; choose from {', '.join(AXES)} (or both: layers,lengths)")
    grids = []
    for n in dict.fromkeys(names):
        if n == "layers":
            if draft_layers is None or verify_layers is None:
                rows = parse_values(draft_layers, "--draft-layers") if draft_layers is not None else ()
                cols = parse_values(verify_layers, "--verify-layers") if verify_layers is not None else ()
                grids.append(_Pending("layers", rows, cols))
                continue
            grids.append(Grid("layers", parse_values(draft_layers, "--draft-layers"),
                              parse_values(verify_layers, "--verify-layers")))
        else:
            grids.append(Grid("lengths",
                              parse_values(draft_lens, "--draft-lens") if draft_lens else DEFAULT_DRAFT_LENS,
                              parse_values(verify_thresholds, "--verify-thresholds") if verify_thresholds
                              else DEFAULT_VERIFY_THRESHOLDS))
    return grids


@dataclass(frozen=True)
class _Pending:
    """A layers grid with one or both lists left to the model's defaults."""

    name: str
    rows: tuple[int, ...]
    cols: tuple[int, ...]


def resolve_grids(grids: list, num_layers: int) -> list[Grid]:
    """Fill default layer lists for the model's depth and check every layer against it."""
    out = []
    for g in grids:
        if isinstance(g, _Pending):
            rows, cols = default_layer_values(num_layers)
            g = Grid(g.name, g.rows or rows, g.cols or cols)
        g.check(num_layers)
        out.append(g)
    return out


def sweep(lm: LoadedModel, sets: dict[str, list[Prompt]], grids: list[Grid], base: DecodeConfig,
          json_path: str | None = None, warmup: bool = True,
          progress: Callable[[int, int, str], None] | None = None,
          stop: threading.Event | None = None, command: str | None = None) -> dict:
    """Run every point of every grid and the autoregressive reference on every prompt.

    `base` holds the settings a grid does not vary (the lengths grid's d and v, the layers grid's
    draft_len and verify_threshold) and max_new_tokens. `progress(done, total, what)` is called
    after every prompt (after the JSON is written). `stop`, once set, ends the sweep before the
    next point; the prompt in progress is dropped, the report says `stopped`."""
    L = lm.ee.num_layers
    base = replace(base, preset=replace(base.preset or Preset(), method="hispec")).resolve_for(lm.ee)
    for g in grids:
        g.check(L)
    points: list[tuple[Grid | None, int | None, int | None]] = [(None, None, None)]
    points += [(g, r, c) for g in grids for r, c in g.cells()]
    # the engine's defaults for this model (its trained exits' recommendation where it has one)
    defaults = _in_paper_names(preset("hispec").resolve_for(lm.ee))
    at = _in_paper_names(base)
    report = {
        **run_record(lm, command, base), "kind": "sweep", "reference": REFERENCE,
        "max_new_tokens": base.max_new_tokens,
        "base": at, "defaults": defaults,
        "grids": {g.name: {"rows_axis": g.axes[0], "cols_axis": g.axes[1], "rows": list(g.rows),
                           "cols": list(g.cols), "fixed": {k: at[k] for k in defaults if k not in g.axes},
                           "skipped": g.skipped()} for g in grids},
        "prompts": {name: [p.id for p in ps] for name, ps in sets.items()},
        "records": [], "summary": {}, "complete": False,
    }

    def run_point(point, ids, max_new=None):
        g, r, c = point
        config = base if g is None else g.config(r, c, base)
        if max_new is not None:
            config = replace(config, max_new_tokens=max_new)
        return run_one(lm, PLAIN if g is None else HISPEC, ids, config)

    def label(point) -> dict:
        g, r, c = point
        where = {"grid": None} if g is None else {"grid": g.name, g.axes[0]: r, g.axes[1]: c}
        return {"method": (PLAIN if g is None else HISPEC).key, **where}

    def name(point) -> str:
        g, r, c = point
        return REFERENCE if g is None else f"{g.name} {SHORT[g.axes[0]]}={r} {SHORT[g.axes[1]]}={c}"

    def saved():
        if report["records"]:
            report["summary"] = summarise_sweep(report)
        if json_path:
            Path(json_path).write_text(json.dumps(report, indent=1))

    saved()
    time_passes(lm, sets, Items(points, run_point, label, name), report, base.max_new_tokens, warmup=warmup,
                stop=stop, progress=progress, saved=saved)
    report["summary"] = summarise_sweep(report)
    saved()
    return report


def summarise_sweep(report: dict) -> dict:
    """Per grid point: tokens/s (median, spread), speedup = its median tokens/s over the
    reference's median on the same prompts, speedup_geomean = the geometric mean of its per-prompt
    ratios to the reference (with their range), acceptance per level, tokens per full pass, work,
    output equality with the reference; per grid the best point (by the geometric mean) and the
    default point."""
    records = report["records"]
    ref_rows = [r for r in records if r["grid"] is None]
    ref_ids = {(r["set"], r["prompt_id"]): r["token_ids"] for r in ref_rows}
    ref_by_prompt = {(r["set"], r["prompt_id"]): r["tokens_per_s"] for r in ref_rows}
    ref_tps = statistics.median([r["tokens_per_s"] for r in ref_rows]) if ref_rows else None
    out = {"reference": {"method": REFERENCE, "prompts": len(ref_rows), "tokens_per_s": ref_tps,
                         "tokens_per_s_iqr": iqr([r["tokens_per_s"] for r in ref_rows])},
           "grids": {}}
    for name, grid in report["grids"].items():
        a, b = grid["rows_axis"], grid["cols_axis"]
        cells = []
        for row in grid["rows"]:
            for col in grid["cols"]:
                mine = [r for r in records if r["grid"] == name and r[a] == row and r[b] == col]
                if mine:
                    cells.append({a: row, b: col, **_cell_stats(mine, ref_ids, ref_tps, ref_by_prompt)})
        default = {a: report["defaults"][a], b: report["defaults"][b]}
        at_default = next((c for c in cells if c[a] == default[a] and c[b] == default[b]), None)
        default.update(on_grid=default[a] in grid["rows"] and default[b] in grid["cols"],
                       speedup=at_default["speedup"] if at_default else None,
                       speedup_geomean=at_default["speedup_geomean"] if at_default else None)
        ranked = [c for c in cells if _rank(c) is not None]
        best = max(ranked, key=_rank) if ranked else None
        out["grids"][name] = {"cells": cells, "default": default,
                              "best": {a: best[a], b: best[b], "speedup": best["speedup"],
                                       "speedup_geomean": best["speedup_geomean"],
                                       "tokens_per_s": best["tokens_per_s"]} if best else None}
    out["all_outputs_equal"] = all(c["outputs_equal"] for g in out["grids"].values() for c in g["cells"])
    return out


def _rank(cell: dict) -> float | None:
    """What makes a point the best: the geometric mean of its per-prompt ratios."""
    return cell["speedup_geomean"] if cell.get("speedup_geomean") is not None else cell.get("speedup")


def _cell_stats(rows: list[dict], ref_ids: dict, ref_tps: float | None, ref_by_prompt: dict | None = None) -> dict:
    tps = [r["tokens_per_s"] for r in rows]
    ratios = [r["tokens_per_s"] / ref_by_prompt[(r["set"], r["prompt_id"])] for r in rows
              if (ref_by_prompt or {}).get((r["set"], r["prompt_id"])) and r["tokens_per_s"] > 0]
    acc: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (r.get("acceptance") or {}).items():
            if v is not None:
                acc.setdefault(k, []).append(v)
    useful, wasted = sum(r.get("useful", 0) for r in rows), sum(r.get("wasted", 0) for r in rows)
    median = statistics.median(tps)
    return {"prompts": len(rows), "tokens_per_s": median, "tokens_per_s_min": min(tps),
            "tokens_per_s_max": max(tps), "tokens_per_s_iqr": iqr(tps),
            "speedup": median / ref_tps if ref_tps else None,
            "speedup_geomean": geomean(ratios) if ratios else None,
            "speedup_min": min(ratios) if ratios else None, "speedup_max": max(ratios) if ratios else None,
            "acceptance": {k: statistics.mean(v) for k, v in acc.items()},
            "tokens_per_full_pass": mean_or_none([r.get("tokens_per_full_pass") for r in rows]),
            "useful_layer_tokens": useful, "wasted_layer_tokens": wasted,
            "wasted_fraction": wasted / (useful + wasted) if useful + wasted else None,
            "outputs_equal": all(ref_ids.get((r["set"], r["prompt_id"])) == r["token_ids"] for r in rows)}


def format_table(report: dict) -> str:
    """The sweep's summary as plain text (one line per grid point)."""
    s = report["summary"]
    ref = s["reference"]
    lines = [f"reference {REFERENCE}: {ref['tokens_per_s'] or 0:.2f} tok/s (median of {ref['prompts']} prompts)"]
    for name, g in s["grids"].items():
        grid = report["grids"][name]
        a, b = grid["rows_axis"], grid["cols_axis"]
        fixed = ", ".join(f"{k}={v}" for k, v in grid["fixed"].items())
        lines.append(f"\n{name} sweep ({fixed}):")
        lines.append(f"{SHORT[a]:>10}{SHORT[b]:>10}{'tok/s':>9}{'speedup':>9}  acceptance  same output "
                     "(speedup: geometric mean of per-prompt ratios)")
        for c in g["cells"]:
            marks = (" best" if g["best"] and (c[a], c[b]) == (g["best"][a], g["best"][b]) else "") + (
                " default" if (c[a], c[b]) == (g["default"][a], g["default"][b]) else "")
            acc = ", ".join(f"{k} {v:.0%}" for k, v in c["acceptance"].items()) or "n/a"
            speed = f"{_rank(c):.2f}x" if _rank(c) is not None else "n/a"
            lines.append(f"{c[a]:>10}{c[b]:>10}{c['tokens_per_s']:>9.2f}{speed:>9}  {acc}  "
                         f"{'yes' if c['outputs_equal'] else 'NO'}{marks}")
        for sk in grid["skipped"]:
            lines.append(f"{sk[a]:>10}{sk[b]:>10}  skipped: {sk['reason']}")
    return "\n".join(lines)
