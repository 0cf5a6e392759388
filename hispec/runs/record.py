"""A finished generation as one typed value, built once when it ends, from its events.

    engine events --> RunRecord --> /generate (to_json, with SCHEMA_VERSION) | Why | What-if | Steps | stories
                        ^ from_json: the one reader of recorded JSON (this schema, the page's and the API's older shapes)

A record holds the run's levels (typed, with their roles), its policy and lengths, the plan of every round (a
`Round`), the acceptance of each pair of levels overall and by position in its block, each lane's pass costs,
the measured timing pairs against plain decoding, and its events. Everything that explains or replays a run
reads it; nothing else reads a recorded settings dict, a pair's text key or a round's label
(tests/test_layout.py pins it): `RecordedSettings.read` and `from_json` are the only places that do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from hispec.engine.config import recorded_lengths, run_name
from hispec.engine.events import DoneEvent, Event, PolicyEvent, event_from_dict, event_to_dict
from hispec.engine.levels import FULL, Level, level_words, recorded_levels
from hispec.engine.planning.costs import CostModel
from hispec.engine.planning.policy import POLICIES, adapts
from hispec.engine.planning.round import Round, kind_words
from hispec.model.shared import Tally
from hispec.runs.metrics import StatsCollector

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class MachinePace:
    """What the machine wrote while a run ran (the process's meter, hispec.runs.meter, fed by serving): every
    visitor's committed tokens over the same seconds, this run's own included, and the most generations that ran
    at once meanwhile. A run's own tokens/s beside the machine's: on a shared machine a run's speed is its share."""

    tokens: int
    own_tokens: int
    seconds: float
    visitors: int = 1

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def own_tokens_per_s(self) -> float | None:
        return self.own_tokens / self.seconds if self.seconds > 0 else None

    @property
    def others(self) -> bool:
        """Whether other visitors' generations wrote tokens while this one ran."""
        return self.tokens > self.own_tokens


def words(level: Level) -> str:
    """A level as a reader says it: 'lookup', 'exit 4', 'the 4-bit full model', 'the full model' (the exact top)."""
    return "the full model" if level.kind == FULL and level.precision is None else level_words(level)


def pair_words(pair: tuple[Level, Level]) -> str:
    """A pair of levels as a reader says it: '4-bit, int8-activation full model → full model'."""
    low, high = pair
    return f"{words(low).removeprefix('the ')} → {words(high).removeprefix('the ')}"


@dataclass(frozen=True)
class PairAcceptance:
    """How often `high` kept what `low` proposed: per token, in order up to each block's first rejection
    (the one figure called acceptance), `kept` of all proposed, and by position in the block (`by_position[i]`:
    (kept, judged) of the i-th token the pair judged in a round)."""

    low: Level
    high: Level
    accepted: int
    judged: int
    kept: float | None = None
    by_position: tuple[tuple[int, int], ...] = ()

    @property
    def rate(self) -> float | None:
        return self.accepted / self.judged if self.judged else None

    @property
    def words(self) -> str:
        return pair_words((self.low, self.high))

    def survival(self) -> list[float]:
        """The share of blocks whose i-th token survived (kept, all earlier ones kept too): what falls with i
        is why longer drafts stop paying."""
        blocks = self.by_position[0][1] if self.by_position else 0
        return [kept / blocks for kept, _ in self.by_position] if blocks else []

    def to_json(self) -> dict:
        return {"from": str(self.low.spec), "to": str(self.high.spec), "words": self.words, "acceptance": self.rate,
                "accepted": self.accepted, "judged": self.judged, "kept": self.kept,
                "by_position": [list(p) for p in self.by_position]}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return not self.temperature

    @property
    def plain_distribution(self) -> bool:
        """Sampling from the model's own distribution (temperature 1, no top-k or top-p)."""
        return self.temperature == 1 and not self.top_k and self.top_p == 1


@dataclass(frozen=True)
class RunRecord:
    model: str
    method: str  # the run's name as reports print it: 'hispec (auto)'
    levels: tuple[Level, ...]  # bottom first, ending with the full model; roles in Level.name
    policy: str
    adapts: bool
    lengths: tuple[int, int] | None  # a fixed round's (k, t); None: the adaptive policy chose its own
    num_layers: int
    sampling: Sampling
    plans: Mapping[int, Round]  # each decoding round's plan (round 0, the prompt, has none)
    pairs: tuple[PairAcceptance, ...]  # bottom first
    costs: Mapping[str | None, CostModel]  # each lane's pass costs the run kept (None: the exact lane); {}: none
    events: tuple[Event, ...]
    stats: Mapping  # the engine's fold of the events (runs.metrics.StatsCollector.summary, timed by runs.runner)
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    text: str = ""
    finish_reason: str | None = None
    vs_plain: Mapping | None = None  # the timing pairs against plain decoding (evaluation.compare.vs_plain)
    pairs_asked: int = 0
    costs_whose: str | None = "run"  # 'run': kept by the run itself; 'first': fetched by its first explanation
    settings: Mapping = field(default_factory=dict)  # as the engine recorded them: written back out, never read
    # a recorded run replayed (a lesson): where and when it ran ({"machine", "commit", "command"}), and what each
    # exit believed (explain.beliefs), kept with it so that its views need no model; None for a live run
    recorded_on: Mapping | None = None
    beliefs: Mapping | None = None
    shared: Tally | None = None  # the calls its passes shared with other visitors' (model.shared); None: ran alone
    machine: MachinePace | None = None  # what every visitor's generations wrote meanwhile (serving); None: not served

    # ---- questions the views ask ---------------------------------------------------------------
    @property
    def top(self) -> Level:
        return self.levels[-1]

    @property
    def below_full(self) -> tuple[Level, ...]:
        """The levels under the full model, bottom first (what a what-if replays)."""
        return self.levels[:-1]

    @property
    def spec(self) -> tuple[str | int, ...]:
        """The levels below the full model as a list is written: ('lookup', 'full@a8'), (2, 4)."""
        return tuple(lv.spec for lv in self.below_full)

    @property
    def formats(self) -> tuple[str, ...]:
        """The cheaper number formats its levels ran in ('a8' for the default's 4-bit level), bottom first."""
        return tuple(dict.fromkeys(lv.precision for lv in self.levels if lv.precision is not None))

    @property
    def exact_exits(self) -> tuple[int, ...]:
        return tuple(sorted(lv.layer for lv in self.levels if lv.kind == "exit" and lv.precision is None))

    def acceptance(self) -> dict[tuple[Level, Level], float | None]:
        """Each pair's acceptance, keyed by the pair of levels."""
        return {(p.low, p.high): p.rate for p in self.pairs}

    @property
    def recorded_where(self) -> str | None:
        """'AMD EPYC (AVX-512), 2 cores at commit 1a2b3c4': where a recorded run ran; None for a live run."""
        if not self.recorded_on:
            return None
        commit = str(self.recorded_on.get("commit") or "unknown")
        return f"{self.recorded_on.get('machine', 'an unnamed machine')} at commit {commit[:7]}"

    @property
    def done(self) -> DoneEvent | None:
        return next((ev for ev in reversed(self.events) if isinstance(ev, DoneEvent)), None)

    def with_costs(self, costs: Mapping[str | None, CostModel], whose: str) -> RunRecord:
        return dataclasses.replace(self, costs=MappingProxyType(dict(costs)), costs_whose=whose)

    # ---- out -----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The record as /generate answers it (docs/hosting.md): every level named in words beside its spec;
        `stats` with acceptance and plans keyed by words; `settings` and `events` as the engine wrote them,
        which is all from_json needs to read it back."""
        stats = dict(self.stats)
        stats["acceptance"] = {p.words: p.rate for p in self.pairs}
        stats["kept"] = {p.words: p.kept for p in self.pairs}
        stats["policy_choices"] = {kind_words(k): n for k, n in (self.stats.get("policy_choices") or {}).items()}
        if self.vs_plain is not None:
            stats["vs_plain"] = dict(self.vs_plain)
        costs = {} if None not in self.costs else {**self.costs[None].figures_ms(), **(
            {"lanes": {f: c.figures_ms() for f, c in self.costs.items() if f is not None}} if len(self.costs) > 1 else {})}
        return {"schema": SCHEMA_VERSION, "model": self.model, "method": self.method,
                "levels": [{"level": str(lv.spec), "role": lv.name, "words": words(lv)} for lv in self.levels],
                "policy": self.policy, "adapts": self.adapts, "lengths": list(self.lengths) if self.lengths else None,
                "text": self.text, "token_ids": list(self.token_ids), "prompt_ids": list(self.prompt_ids),
                "finish_reason": self.finish_reason, "acceptance": [p.to_json() for p in self.pairs],
                "stats": stats, "vs_plain": None if self.vs_plain is None else dict(self.vs_plain),
                "pairs_asked": self.pairs_asked, "costs_ms": costs, "costs_whose": self.costs_whose if costs else None,
                "settings": dict(self.settings), "events": [event_to_dict(ev) for ev in self.events],
                **({"recorded_on": dict(self.recorded_on)} if self.recorded_on else {}),
                **({"shared": dataclasses.asdict(self.shared)} if self.shared else {}),
                **({"machine": dataclasses.asdict(self.machine)} if self.machine else {}),
                **({"beliefs": self.beliefs} if self.beliefs else {})}


# ---- in: the one reader of recorded settings, pair keys and labels -----------------------------------------
@dataclass(frozen=True)
class RecordedSettings:
    """What a recorded settings dict (DoneEvent.settings, a resolved DecodeConfig's) says about a run."""

    levels: tuple[Level, ...]
    policy: str
    adapts: bool
    lengths: tuple[int, int] | None
    num_layers: int
    sampling: Sampling
    method: str

    @property
    def spec(self) -> tuple[str | int, ...]:
        return tuple(lv.spec for lv in self.levels[:-1])

    @classmethod
    def read(cls, settings: Mapping) -> RecordedSettings:
        settings = dict(settings)
        if not isinstance(settings.get("num_layers"), int):
            raise ValueError("a recorded run without its settings' num_layers cannot be read")
        policy = settings.get("policy") or "fixed"
        adaptive = policy in POLICIES and adapts(policy)
        lengths = None if adaptive else recorded_lengths(settings)
        sampling = Sampling(float(settings.get("temperature") or 0.0), int(settings.get("top_k") or 0),
                            float(settings.get("top_p", 1.0) if settings.get("top_p") is not None else 1.0),
                            settings.get("seed"))
        return cls(recorded_levels(settings), policy, adaptive, lengths, settings["num_layers"], sampling,
                   run_name(settings.get("method", ""), settings.get("policy")))


def fixed_round(levels: tuple[Level, ...], lengths: tuple[int, int]) -> Round:
    """The round a fixed run runs: the bottom level proposes k, the levels above judge, the full model after t
    pending (1 without a judge)."""
    k, t = lengths
    top, judges = levels[-1], levels[1:-1]
    if len(levels) == 1:
        return Round.plain_step(top)
    return Round(levels[0], top, k, judges, t if judges else 1)


def _plans(events: tuple[Event, ...], s: RecordedSettings) -> dict[int, Round]:
    """Each decoding round's plan: its PolicyEvent's Round; a label recorded before rounds travelled as values,
    read once here; a fixed run recorded before every round was an event: its one round."""
    plans = {}
    for ev in events:
        if isinstance(ev, PolicyEvent) and ev.round > 0:
            plans[ev.round] = ev.plan if ev.plan is not None else Round.from_label(ev.choice, s.levels)
    if not plans:
        rounds = {getattr(ev, "round", 0) for ev in events} - {0}
        one = fixed_round(s.levels, s.lengths or (1, 1))
        plans = {r: one for r in rounds if r is not None}
    return plans


def pairs_of(fold: StatsCollector, levels: tuple[Level, ...]) -> tuple[PairAcceptance, ...]:
    """The fold's pairs, keyed by role text ('verify->target'), as pairs of the run's levels, bottom first."""
    by_role = {lv.name: lv for lv in levels}
    kept = fold.kept()
    out = []
    for key, (accepted, judged) in fold.in_order.items():
        low, _, high = key.partition("->")
        if low not in by_role or high not in by_role:
            continue  # a role the level list does not have: a trace of another list
        positions = tuple((a, j) for a, j in fold.by_position.get(key, ()))
        out.append(PairAcceptance(by_role[low], by_role[high], accepted, judged, kept.get(key), positions))
    rank = {lv: i for i, lv in enumerate(levels)}
    return tuple(sorted(out, key=lambda p: (rank[p.low], rank[p.high])))


def acceptance_in_words(acceptance: Mapping[str, float | None], settings: Mapping) -> dict[str, float | None]:
    """A stats dict's acceptance (keyed by role: 'verify->target') keyed by the run's levels in words
    ('4-bit full model → full model'), bottom first: how a row of runs that kept only stats names its pairs."""
    levels = RecordedSettings.read(settings).levels
    by_role, rank = {lv.name: lv for lv in levels}, {lv.name: i for i, lv in enumerate(levels)}
    out = []
    for key, rate in acceptance.items():
        low, _, high = key.partition("->")
        if low in by_role and high in by_role:
            out.append(((rank[low], rank[high]), pair_words((by_role[low], by_role[high])), rate))
    return {words_: rate for _, words_, rate in sorted(out)}


def _costs(costs_ms: Mapping | None) -> dict[str | None, CostModel]:
    if not costs_ms:
        return {}
    lanes = {fmt: CostModel.from_figures_ms(figures) for fmt, figures in (costs_ms.get("lanes") or {}).items()}
    return {None: CostModel.from_figures_ms(costs_ms), **lanes}


def build(events, stats: Mapping, model: str = "", prompt_ids=(), vs_plain: Mapping | None = None,
          pairs_asked: int = 0, costs_ms: Mapping | None = None, costs_whose: str | None = None) -> RunRecord:
    """The record of a finished (or stopped) generation from its events (typed) and its stats. `costs_ms`: pass
    costs fetched for it where it kept none (`costs_whose` says whose)."""
    events = tuple(events)
    done = next((ev for ev in reversed(events) if isinstance(ev, DoneEvent)), None)
    if done is None:
        raise ValueError("a run record is built when a generation ends: its events have no DoneEvent")
    s = RecordedSettings.read(done.settings)
    fold = StatsCollector()
    for ev in events:
        fold.add(ev)
    # a stats dict read back without the engine's role-keyed figures (an answer names pairs in words) gets the fold's
    stats = {"acceptance": fold.acceptance(), "kept": fold.kept(), "policy_choices": dict(fold.choices), **stats}
    own = _costs(done.costs_ms)
    costs, whose = (own, "run") if own else (_costs(costs_ms), costs_whose if costs_ms else None)
    return RunRecord(model=model, method=s.method, levels=s.levels, policy=s.policy, adapts=s.adapts,
                     lengths=s.lengths, num_layers=s.num_layers, sampling=s.sampling,
                     plans=MappingProxyType(_plans(events, s)), pairs=pairs_of(fold, s.levels),
                     costs=MappingProxyType(costs), events=events, stats=MappingProxyType(dict(stats)),
                     prompt_ids=tuple(prompt_ids or ()), token_ids=tuple(done.token_ids), text=done.text,
                     finish_reason=done.reason, vs_plain=None if vs_plain is None else MappingProxyType(dict(vs_plain)),
                     pairs_asked=int(pairs_asked or 0), costs_whose=whose,
                     settings=MappingProxyType(dict(done.settings)))


def from_json(data: Mapping) -> RunRecord:
    """A record from JSON: this schema (RunRecord.to_json), or an older shape that kept `settings` and its
    events (`events`, or `trace` in /generate's answers before the schema) and `stats` (the page's kept run,
    tests' and tools' traces). Raises ValueError naming what is missing."""
    version = data.get("schema")
    if version is not None and version != SCHEMA_VERSION:
        raise ValueError(f"run record schema {version!r} is not one this version reads (it reads {SCHEMA_VERSION} "
                         "and the unversioned shapes before it)")
    raw = data.get("events") if data.get("events") is not None else data.get("trace")
    if not raw:
        raise ValueError("a recorded run needs its events ('events' or 'trace')")
    events = tuple(ev if not isinstance(ev, Mapping) else event_from_dict(dict(ev)) for ev in raw)
    stats = dict(data.get("stats") or {})
    if version is not None:  # the answer's stats name pairs in words: build() refolds them from the events
        for key in ("acceptance", "kept", "policy_choices", "vs_plain"):
            stats.pop(key, None)
    record = build(events, stats, model=data.get("model") or "", prompt_ids=data.get("prompt_ids") or (),
                   vs_plain=data.get("vs_plain"), pairs_asked=data.get("pairs_asked") or 0,
                   costs_ms=data.get("costs_ms"), costs_whose="first")
    if data.get("recorded_on") or data.get("beliefs") or data.get("shared") or data.get("machine"):
        record = dataclasses.replace(record, recorded_on=data.get("recorded_on"), beliefs=data.get("beliefs"),
                                     shared=Tally(**data["shared"]) if data.get("shared") else None,
                                     machine=MachinePace(**data["machine"]) if data.get("machine") else None)
    return record
