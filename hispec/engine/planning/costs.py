"""Per-call costs measured on this machine, as a function of the number of tokens in a pass.

Decoder layers of one model cost about the same, so a pass over layers [a, b) with n new tokens
costs (b - a) * layer(n); an exit head (its attention step included, for attention heads) costs
head(e, n), the final norm + LM head head(L, n). ``calibrate`` times them once per model, on a
scratch cache after a short context; every generation then refines them with what its own passes
and heads took (an exponential moving average), so the figures follow this machine and context.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
BESIDE_FLOOR = 0.05  # the least share of its cost alone a pass pays beside other visitors' rows (CostModel.beside)


class CostModel:
    """Seconds per decoder layer for a pass of n new tokens, and per exit head for n rows: measured
    (``calibrate``, ``observe_*``) or given (``given``: another machine's figures, a test's)."""

    def __init__(self):
        self._layer: dict[int, float] = {}  # n tokens -> seconds per layer
        self._head: dict[tuple[int, int], float] = {}  # (exit layer, n rows) -> seconds
        self.step = 0.0  # the engine's own seconds per pass (module docstring); 0 until a generation measures it
        self._memo: dict | None = None  # answers remembered: only in a frozen copy (`frozen`)
        self._beside = 0  # other rows in the same call (`beside`; 0: the pass runs alone)
        self.calibrated = False

    @classmethod
    def given(cls, layer: dict[int, float], head: dict[tuple[int, int], float], step: float = 0.0) -> CostModel:
        """A cost model of these figures: `layer` maps new tokens to seconds per layer, `head` maps
        (exit layer, rows) to seconds (the full model's head at exit layer L), `step` the engine's own
        seconds per pass. Counts as calibrated."""
        costs = cls()
        costs._layer, costs._head, costs.step = dict(layer), dict(head), float(step)
        costs.calibrated = True
        return costs

    @classmethod
    def from_figures_ms(cls, figures: dict) -> CostModel:
        """The cost model of figures written by figures_ms (a run's frozen costs)."""
        layer = {int(n): ms / 1e3 for n, ms in (figures.get("layer") or {}).items()}
        head = {}
        for key, ms in (figures.get("head") or {}).items():
            e, n = key.split("x")
            head[int(e), int(n)] = ms / 1e3
        return cls.given(layer, head, (figures.get("step") or 0.0) / 1e3)  # runs recorded before it: none

    def figures_ms(self) -> dict:
        """The figures in milliseconds, JSON-ready: per layer by new tokens, per head as 'layer x rows', and
        the engine's own work per pass ('step', once measured)."""
        return {"layer": {str(n): round(s * 1e3, 4) for n, s in sorted(self._layer.items())},
                "head": {f"{e}x{n}": round(s * 1e3, 4) for (e, n), s in sorted(self._head.items())},
                **({"step": round(self.step * 1e3, 4)} if self.step else {})}

    # ---- queries --------------------------------------------------------------------------
    @staticmethod
    def _near(table: dict, n: int) -> float | None:
        """Linear interpolation over the measured sizes (linear in n beyond the largest)."""
        if not table:
            return None
        sizes = sorted(table)
        if n <= sizes[0]:
            return table[sizes[0]]
        for a, b in zip(sizes, sizes[1:]):
            if a <= n <= b:
                w = (n - a) / (b - a)
                return table[a] * (1 - w) + table[b] * w
        return table[sizes[-1]] * n / sizes[-1]

    def covers(self, exits: tuple[int, ...] = ()) -> bool:
        """Calibrated, with head costs for every exit in `exits`."""
        return self.calibrated and all(any(k[0] == e for k in self._head) for e in exits)

    def layer(self, n: int) -> float:
        if self._memo is not None and n in self._memo:
            return self._memo[n]
        value = self._marginal(self._solo_layer, n)
        if self._memo is not None:
            self._memo[n] = value
        return value

    def head(self, layer: int, n: int) -> float:
        if self._memo is not None and (layer, n) in self._memo:
            return self._memo[layer, n]
        value = self._marginal(lambda rows: self._solo_head(layer, rows), n)
        if self._memo is not None:
            self._memo[layer, n] = value
        return value

    def _solo_layer(self, n: int) -> float:
        value = self._near(self._layer, n)
        return value if value is not None else 1e-3 * (1 + 0.1 * n)

    def _solo_head(self, layer: int, n: int) -> float:
        value = self._near({k[1]: v for k, v in self._head.items() if k[0] == layer}, n)
        return value if value is not None else 0.0

    def _marginal(self, solo, n: int) -> float:
        """n rows alone, or beside `_beside` other rows: what they add to that call (at least BESIDE_FLOOR of
        their cost alone: measured tables are noisy, and no row is free)."""
        if not self._beside:
            return solo(n)
        return max(solo(self._beside + n) - solo(self._beside), BESIDE_FLOOR * solo(n))

    def beside(self, rows: int) -> CostModel:
        """A frozen copy (`frozen`) pricing a pass of n rows by what it adds to a call already carrying `rows`
        rows of other visitors (engine.planning.policy: a pass shared on the pass board, model.shared); the
        engine's own work per pass (`step`) is not shared and stays whole."""
        copy = self.frozen()
        copy._beside = max(0, int(rows))
        return copy

    def frozen(self) -> CostModel:
        """A copy of these figures that never changes and remembers every answer: what one plan reads (the
        policy asks the same few sizes of it thousands of times a round; the live model changes with every pass)."""
        copy = CostModel.given(self._layer, self._head, self.step)
        copy.calibrated, copy._memo = self.calibrated, {}
        return copy

    # ---- measurements ---------------------------------------------------------------------
    def observe_pass(self, layers: int, n: int, seconds: float, weight: float = 0.1) -> None:
        if layers > 0 and n > 0 and seconds > 0:
            self._mix(self._layer, n, seconds / layers, weight)

    def observe_head(self, layer: int, n: int, seconds: float, weight: float = 0.1) -> None:
        if n > 0 and seconds > 0:
            self._mix(self._head, (layer, n), seconds, weight)

    def observe_step(self, seconds: float, weight: float = 0.2) -> None:
        """The engine's own work per pass in one round (CostLearner.on_round)."""
        if seconds >= 0:
            self.step = seconds if not self.step else (1 - weight) * self.step + weight * seconds

    @staticmethod
    def _mix(table: dict, key, value: float, weight: float) -> None:
        old = table.get(key)
        table[key] = value if old is None else (1 - weight) * old + weight * value

    def calibrate(self, ee, exits: tuple[int, ...] = (), context: int = 64, repeats: int = 2) -> None:
        """Time layer passes and heads for SIZES new tokens after `context` tokens (best of `repeats`)."""
        L = ee.num_layers
        cache = ee.new_cache(context + max(SIZES) + 1)
        vocab = ee.model.config.vocab_size
        ids = [(7 + 13 * i) % vocab for i in range(context + max(SIZES))]
        with torch.inference_mode():
            ee.run_layers(ee.embed(ids[:context]), 0, L, cache)
            for n in SIZES:
                x = ee.embed(ids[context : context + n])
                best = math.inf
                for _ in range(repeats):
                    _sync(ee)
                    t0 = time.perf_counter()
                    h = ee.run_layers(x, 0, L, cache)
                    _sync(ee)
                    best = min(best, time.perf_counter() - t0)
                    for layer in range(L):
                        cache.crop(layer, context)
                self._layer[n] = best / L
                for layer in (*exits, L):
                    self._head[(layer, n)] = _time_head(ee, layer, h, repeats)
        cache.release()
        self.calibrated = True


def _sync(ee) -> None:
    if ee.device.type == "cuda":
        torch.cuda.synchronize(ee.device)


def _time_head(ee, layer: int, h: torch.Tensor, repeats: int) -> float:
    """Seconds for one exit (its attention step on a scratch cache included) on the rows of h."""
    head = ee.head(layer)
    best = math.inf
    for _ in range(repeats):
        _sync(ee)
        t0 = time.perf_counter()
        x = h
        if getattr(head, "stateful", False):
            x = head.attend(h, ee.new_head_cache(1, h.shape[1]), 0)
        ee.exit_logits(x, layer)
        _sync(ee)
        best = min(best, time.perf_counter() - t0)
    return best


def model_costs(ee, exits: tuple[int, ...] = ()) -> CostModel:
    """The cost model kept with this model (calibrated on first use, refined by every generation)."""
    costs = getattr(ee, "cost_model", None)
    if costs is None:
        costs = CostModel()
        ee.cost_model = costs
    if not costs.covers(tuple(exits)):
        costs.calibrate(ee, tuple(exits))
    return costs


class CostLearner:
    """The cost model of each lane's copy of the model (calibrated once, for the exits it runs), refined
    as an observer of the generation: every pass the stack reports and every exit head the decoder
    runs. None for a lane that needs none (the fixed policy, on a model never calibrated)."""

    def __init__(self, models: dict, levels, adaptive: bool, others: Callable[[], int] = lambda: 0):
        """`others()`: how many other visitors' generations share this one's passes now (model.shared's board):
        while any do, a pass's time holds their rows too, and nothing is learned from it."""
        self.lanes, self.others = {}, others
        self._timed, self._passes = 0.0, 0  # this round's passes and heads: seconds, and how many passes
        for precision, model in models.items():
            exits = tuple(lv.layer for lv in levels if lv.kind == "exit" and lv.precision == precision)
            self.lanes[precision] = model_costs(model, exits) if adaptive else getattr(model, "cost_model", None)

    def frozen_ms(self) -> dict:
        """The exact lane's costs now (figures_ms), with each cheaper lane's under 'lanes' (by format), or {}
        when the exact lane keeps none calibrated: what a run is explained with, every plan of it."""
        costs = self.lanes.get(None)
        if costs is None or not costs.calibrated:
            return {}
        lanes = {fmt: c.figures_ms() for fmt, c in self.lanes.items() if fmt is not None and c is not None
                 and c.calibrated}
        return {**costs.figures_ms(), **({"lanes": lanes} if lanes else {})}

    def on_pass(self, p) -> None:
        """A decode pass (engine.stack.StagePass); the prefill's passes are not handed in."""
        costs = self.lanes[p.precision]
        self._timed, self._passes = self._timed + p.seconds, self._passes + 1
        if costs is not None and len(p.serials) <= 16 and not self.others():
            costs.observe_pass(p.end - p.start, len(p.serials), p.seconds)

    def on_head(self, level, rows: int, seconds: float, head_work: list) -> None:
        """An exit head of `level` (engine.levels.Level) ran on `rows` rows in `seconds`; its attention
        step, for a head that has one, is in the stack's `head_work` (drained here)."""
        attend = sum(s for at, _, s in head_work if at == level.layer)
        head_work.clear()
        self._timed += seconds + attend
        costs = self.lanes[level.precision]
        if costs is not None and not self.others():
            costs.observe_head(level.layer, rows, seconds + attend)

    def on_round(self, seconds: float) -> float:
        """A round took `seconds` of the generation's own time: what its passes and heads did not take is the
        engine's own work, per pass, kept by the exact lane (one engine runs every lane's passes). Returns
        `seconds`. (The first round also counts the prefill's head, which makes its figure smaller, never less
        than 0.)"""
        costs = self.lanes.get(None)
        if costs is not None and self._passes and not self.others():
            costs.observe_step(max(0.0, seconds - self._timed) / self._passes)
        self._timed, self._passes = 0.0, 0
        return seconds
