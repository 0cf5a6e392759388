"""What if the exits were better: the real engine with TIMING ONLY verdicts, against plain decoding.

Each take is a pair run back to back on the same prompt: a real plain run, then a run of the replayed
run's own levels and policy (`replay_of`) whose verdicts are drawn at the asked acceptance
(runs.timing_only). Both ignore
end-of-text and run the whole budget, so the two are the same length, and both are timed by the one
helper of every comparison (evaluation.pairs: set-up and prefill included in both). The synthetic run's text is NOT the model's; its events say so
(settings' `timing_only`), and every view labels them. Takes give a median and a range.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from typing import Iterator

from hispec.engine.config import DecodeConfig
from hispec.engine.levels import Level
from hispec.engine.planning.round import Round
from hispec.errors import ConfigError
from hispec.evaluation import pairs
from hispec.runs.record import RunRecord, words
from hispec.runs.runner import RunResult, plain_config
from hispec.runs.timing_only import SyntheticAcceptance

DEFAULT_TAKES = 3
MAX_TAKES = 5


@dataclass(frozen=True)
class Replay:
    """What a what-if runs for a finished run: its own levels below the full model (bottom first), policy and
    lengths, with verdicts drawn at two rates: the middle level's on what the bottom level proposed (`a_dv`,
    absent without a middle level) and the full model's on whatever reaches it (`a_vt`)."""

    levels: tuple[Level, ...]
    policy: str
    adapts: bool
    lengths: tuple[int, int] | None  # a fixed round's (k, t); None: the adaptive policy plans its own
    dv_pair: tuple[Level, Level] | None  # the pair the middle level judges; None: no middle level
    vt_pair: tuple[Level, Level]  # the pair the full model judges most
    without_tail: bool = False  # the plan's judge drafted on after judging; the replay's fixed rounds do not

    @property
    def words(self) -> str:
        """'lookup → the 4-bit full model → the full model, adaptive'."""
        names = [words(x) for x in self.levels] + ["the full model"]
        policy = "adaptive" if self.adapts else "fixed"
        if not self.adapts and self.lengths:
            k, t = self.lengths
            drafts = ("lookup copies its whole match" if self.levels[0].kind == "lookup"  # the fixed policy's copy
                      else f"{k} draft{'s' if k != 1 else ''}")
            policy += f" ({drafts} a round, the full model at {t} pending)"
        tail = " (without the judge's drafts after judging)" if self.without_tail else ""
        return " → ".join(names) + f", {policy}{tail}"

    def request_fields(self) -> dict:
        """GenerateRequest's fields that make the run's own list (a list is HiSpec's; the page's exit and
        length sliders are left out by the caller)."""
        return {"method": "hispec", "levels": ",".join(str(x.spec) for x in self.levels),
                "lengths": ",".join(map(str, self.lengths)) if self.lengths else None}

    def sliders(self, record: RunRecord) -> tuple[float | None, float | None]:
        """The run's own measured acceptance for the two sliders (None: the run measured none there)."""
        measured = record.acceptance()
        return (measured.get(self.dv_pair) if self.dv_pair else None), measured.get(self.vt_pair)


def replay_of(record: RunRecord | None, plan: Round | None = None) -> Replay:
    """The what-if of a finished run: the plan the Why sliders vary (`plan`: its proposer and judges, in fixed
    rounds at its lengths), so the sliders' acceptance is drawn on the very pairs they name and the result
    sits beside that plan's estimate; without a plan (every round was a plain step), the run's own list and
    policy. A ConfigError names why where drawn verdicts cannot model it (no run yet, no level that drafts, more
    than one level between the proposer and the full model: the judges draw at one middle rate and one
    full-model rate)."""
    if record is None:
        raise ConfigError("Generate once: a what-if replays the run's own levels with drawn verdicts.")
    if plan is not None and not plan.plain and len(plan.judges) <= 1:
        # deviation: a plan whose judge drafts on after judging ('drafts on') is replayed without that tail,
        # as fixed rounds cannot say it; its words say so
        levels = (plan.proposer, *plan.judges)
        lengths = (max(plan.count, 1), plan.verify_at if plan.judges else 1)
        return Replay(levels, "fixed", False, lengths, (levels[0], levels[1]) if len(levels) == 2 else None,
                      (levels[-1], record.top), plan.then > 0)
    levels = record.below_full
    if not levels:
        raise ConfigError("this run drafted nothing (plain decoding): a what-if has no verdicts to draw.")
    if len(levels) > 2:
        names = " → ".join(words(x) for x in levels)
        raise ConfigError(f"a what-if draws verdicts at two rates (one middle level's, the full model's); this run's "
                          f"list {names} → the full model has {len(levels) - 1} levels between its proposer and the "
                          "full model, so it cannot be modelled here. Pick a list with at most one (the Teaching "
                          "preset, or lookup → the 4-bit full model).")
    return Replay(levels, record.policy, record.adapts, record.lengths,
                  (levels[0], levels[1]) if len(levels) == 2 else None, (levels[-1], record.top))


@dataclass(frozen=True)
class PlainTimed:
    take: int
    tokens_per_s: float
    new_tokens: int


@dataclass(frozen=True)
class TakeStarted:
    take: int
    of: int
    rates: tuple[float, float]  # the acceptance drawn at: draft -> verify, -> full model


@dataclass(frozen=True)
class TakeDone:
    take: int
    synthetic_tokens_per_s: float
    plain_tokens_per_s: float
    new_tokens: int
    synthetic_split: dict | None = None  # where each run's time went (split)
    plain_split: dict | None = None

    @property
    def ratio(self) -> float | None:
        return self.synthetic_tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else None


@dataclass(frozen=True)
class Summary:
    takes: tuple[TakeDone, ...]
    of: int

    @property
    def ratios(self) -> list[float]:
        return sorted(t.ratio for t in self.takes if t.ratio is not None)

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


def what_if(lm, ids: list[int], config: DecodeConfig, rates: tuple[float, float], takes: int,
            stop: threading.Event) -> Iterator[object]:
    """Progress text, then per take: PlainTimed, TakeStarted, the synthetic run's engine events,
    TakeDone; last a Summary. `config`: the resolved configuration replayed (levels, policy, lengths); `rates`: (draft -> verify,
    -> full model) per-token acceptance to draw at. Both runs of a take are timed by the helper every
    comparison uses (evaluation.pairs.timed: set-up and prefill included in both); a take cut short
    (a Stop, the time limit) is not counted."""
    plain = plain_config(config).resolve_for(lm.ee)
    done: list[TakeDone] = []
    for take in range(1, takes + 1):
        if stop.is_set():
            break
        yield f"Take {take} of {takes}: timing plain decoding on this prompt first…"
        base = pairs.run_timed(lm, ids, plain, stop)
        if pairs.cut(base, config.max_new_tokens):
            break
        yield PlainTimed(take, base.stats["tokens_per_s"], len(base.token_ids))
        if stop.is_set():
            break
        yield f"Take {take} of {takes}: the synthetic run at the sliders' acceptance…"
        yield TakeStarted(take, takes, rates)
        judge = SyntheticAcceptance(verify=rates[0], target=rates[1], seed=(config.seed or 0) + take - 1)
        synthetic = None
        for item in pairs.timed(lm, ids, config, stop, judge=judge):
            if isinstance(item, RunResult):
                synthetic = item
            else:
                yield item
        if synthetic is None or pairs.cut(synthetic, config.max_new_tokens):
            break  # a stopped take is not a like-for-like pair
        done.append(TakeDone(take, synthetic.stats["tokens_per_s"], base.stats["tokens_per_s"],
                             len(synthetic.token_ids), split(synthetic.stats), split(base.stats)))
        yield done[-1]
    yield Summary(tuple(done), takes)


def split(stats: dict) -> dict:
    """Where a run's time went, in seconds: set-up, the prompt's prefill (to the first token), the
    decoding's layer passes, and the rest (heads, token choice, the engine's bookkeeping)."""
    wall = stats.get("wall_s") or 0.0
    setup, prefill = stats.get("setup_s") or 0.0, stats.get("prefill_s") or 0.0
    passes = sum(s for stage, s in (stats.get("stage_s") or {}).items() if stage != "prefill")
    return {"wall_s": wall, "setup_s": setup, "prefill_s": prefill, "passes_s": passes,
            "other_s": max(0.0, wall - setup - prefill - passes)}


SPLIT_KEYS = ("setup_s", "prefill_s", "passes_s", "other_s")


def result_of(takes: list[TakeDone], rates: tuple[float, float], of: int) -> dict | None:
    """The takes' summary for "Why this speed" (None: no take ended): the ratios' median and range,
    the plain rate the takes were measured against, and the median take's time split of each run."""
    ratios = sorted(t.ratio for t in takes if t.ratio)
    if not ratios:
        return None

    def median_split(which: str) -> dict | None:
        splits = [getattr(t, which) for t in takes if getattr(t, which)]
        return {k: statistics.median(s[k] for s in splits) for k in ("wall_s", *SPLIT_KEYS)} if splits else None

    return {"rates": tuple(round(r, 2) for r in rates), "median": statistics.median(ratios), "low": ratios[0],
            "high": ratios[-1], "takes": len(ratios), "of": of,
            "plain_tokens_per_s": statistics.median(t.plain_tokens_per_s for t in takes),
            "synthetic_split": median_split("synthetic_split"), "plain_split": median_split("plain_split")}


def gap(result: dict, estimate: float | None) -> dict | None:
    """The what-if's speed against plain decoding, its scope narrowed step by step: whole runs,
    decoding only (set-up and prefill left out), layer passes only (the engine's other work left out
    too: heads, token choice, bookkeeping). The estimate counts layer passes and heads, so its scope
    lies between the last two: an estimate between them is accounted for by the other work (which the
    runs do not split further); beyond them, its distance to the nearer is unexplained. None without
    both runs' splits or an estimate."""
    syn, plain = result.get("synthetic_split"), result.get("plain_split")
    if not syn or not plain or not estimate:
        return None

    def ratio(keys) -> float | None:
        mine, theirs = sum(syn[k] for k in keys), sum(plain[k] for k in keys)
        return theirs / mine if mine > 0 else None  # the same tokens in both: speed is the inverse of time

    whole = ratio(SPLIT_KEYS)
    decoding = ratio(("passes_s", "other_s"))
    passes = ratio(("passes_s",))
    unexplained = None
    if decoding and passes:
        low, high = sorted((decoding, passes))
        unexplained = 0.0 if low <= estimate <= high else estimate / (low if estimate < low else high) - 1
    return {"whole": whole, "decoding": decoding, "passes": passes, "estimate": estimate, "unexplained": unexplained}
