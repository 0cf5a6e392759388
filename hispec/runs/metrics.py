"""Statistics folded from the event stream: the same numbers for the UI, CLI and benchmarks."""

from __future__ import annotations

from collections import defaultdict

from hispec.engine.events import (
    COMMITTED_STATES,
    REJECTED_STATES,
    DoneEvent,
    Event,
    PassEvent,
    PolicyEvent,
    RoundEvent,
    TokenEvent,
)
from hispec.engine.events import TokenState as S
from hispec.engine.levels import level_words
from hispec.engine.planning.round import event_kind, kind_words


def _rate(ok: int, total: int) -> float | None:
    return ok / total if total else None


def decode_rate(new_tokens: int, wall_s: float | None, ttft_s: float | None) -> float | None:
    """Decode-only tokens per second: the tokens after the first over the time after the first token
    (time to first token = the set-up, the prompt's evaluation and the first token's choice). The one
    definition of "decode-only" for every method and peer; None where the first token's time is unknown."""
    if ttft_s is None or wall_s is None or new_tokens < 2 or wall_s <= ttft_s:
        return None
    return (new_tokens - 1) / (wall_s - ttft_s)


class StatsCollector:
    """Feed it events with `add`; `summary()` any time (live) or after the DoneEvent."""

    def __init__(self, method: str = ""):
        self.method = method
        self.judged: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # "a->b" -> [accepted, judged]
        self.in_order: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # the same, up to first rejections
        # the same by position in its block: [i] = [accepted, judged] of the i-th token a pair judged in a round
        self.by_position: dict[str, list[list[int]]] = defaultdict(list)
        self._position: dict[tuple[int, str], int] = defaultdict(int)  # (round, pair) -> in-order verdicts so far
        self._rejected_in: set[tuple[int, str]] = set()  # (round, pair) verdicts that rejected a token
        self._holder: dict[int, str] = {}  # serial -> stage that last passed it
        self._fate: dict[int, str] = {}  # serial -> "useful" | "wasted"
        self._work: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # serial -> stage -> evals
        self.prefill_layer_tokens = 0
        self.full_passes = 0
        self.drafted = 0
        self.new_tokens = 0
        self.prefill_s = None
        self.t = 0.0
        self.rounds = 0
        self.finish_reason = None
        self.host_syncs = 0
        self.history: list[dict] = []  # one row per round, for live charts
        # Seconds inside each stage's layer passes, by stage (an attention exit head's step runs when
        # its exit is consulted and is timed apart, in StageStack.head_work, not here).
        # On an accelerator these are launch times unless something synchronised.
        self.stage_s: dict[str, float] = defaultdict(float)
        self.choices: dict[str, int] = defaultdict(int)  # the adaptive policy's rounds, by kind (RoundKind.key)

    def add(self, ev: Event) -> None:
        if isinstance(ev, TokenEvent):
            self._add_token(ev)
        elif isinstance(ev, PassEvent):
            self.stage_s[ev.stage] += ev.seconds
            if ev.stage == "prefill":
                self.prefill_layer_tokens += ev.layer_tokens
                return
            if ev.stage == "target":
                self.full_passes += 1
            for serial in ev.serials:
                self._work[serial][ev.stage] += ev.end - ev.start
        elif isinstance(ev, PolicyEvent):
            if ev.adaptive:  # a fixed run's rounds are all one kind: its settings say which
                self.choices[event_kind(ev)] += 1
        elif isinstance(ev, RoundEvent):
            self.rounds, self.t = ev.round, ev.t
            self.history.append(self._row(ev))
        elif isinstance(ev, DoneEvent):
            self.t, self.finish_reason, self.host_syncs = ev.t, ev.reason, ev.host_syncs

    def _add_token(self, ev: TokenEvent) -> None:
        self.t = max(self.t, ev.t)
        # Acceptance per level pair "proposer->judge": the level that last proposed, wrote or
        # passed a token, and the level that judged it.
        if ev.state is S.DRAFTED:
            self.drafted += 1
            self._holder[ev.serial] = ev.origin
        elif ev.state in (S.TENTATIVE, S.VERIFY_REJECTED) and ev.serial in self._holder:
            self._judge(f"{self._holder[ev.serial]}->{ev.stage}", ev, ev.state is S.TENTATIVE)
        elif ev.state in (S.ACCEPTED, S.TARGET_REJECTED):
            self._judge(f"{self._holder.get(ev.serial, 'draft')}->target", ev, ev.state is S.ACCEPTED)
        if ev.state is S.TENTATIVE:
            self._holder[ev.serial] = ev.stage
        elif ev.state is S.VERIFY_WROTE:
            self._holder[ev.serial] = ev.origin
        if ev.state in COMMITTED_STATES:
            self.new_tokens += 1
            self._fate[ev.serial] = "useful"
            if self.prefill_s is None:
                self.prefill_s = ev.t
        elif ev.state in REJECTED_STATES:
            self._fate[ev.serial] = "wasted"

    def _judge(self, key: str, ev: TokenEvent, ok: bool) -> None:
        """One verdict on one token. `in_order` counts a block's tokens only up to its first
        rejection (the rest fell with it): the acceptance, per token, of the stats, the speed model,
        the page and the API. `judged` counts every token a stage threw away: the share of proposed
        tokens kept (what papers call token acceptance), reported as `kept`."""
        pair = self.judged[key]
        pair[0] += ok
        pair[1] += 1
        first_rejection = (ev.round, key) not in self._rejected_in
        if ok or first_rejection:
            self.in_order[key][0] += ok
            self.in_order[key][1] += 1
            i = self._position[ev.round, key]
            self._position[ev.round, key] += 1
            positions = self.by_position[key]
            if i == len(positions):
                positions.append([0, 0])
            positions[i][0] += ok
            positions[i][1] += 1
        if not ok:
            self._rejected_in.add((ev.round, key))

    def acceptance(self) -> dict[str, float | None]:
        """Per level pair: accepted / judged up to each verdict's first rejection (the geometric
        estimate of the speed model's a). The one figure called acceptance."""
        return {key: _rate(*pair) for key, pair in self.in_order.items()}

    def kept(self) -> dict[str, float | None]:
        """Per level pair: kept / proposed, every token a verdict threw away counted as lost."""
        return {key: _rate(*pair) for key, pair in self.judged.items()}

    def work(self) -> dict:
        """Layer-token evaluations per stage: useful (on committed tokens) and wasted."""
        by_stage: dict[str, dict[str, int]] = defaultdict(lambda: {"useful": 0, "wasted": 0, "pending": 0})
        for serial, stages in self._work.items():
            fate = self._fate.get(serial, "pending")
            for stage, n in stages.items():
                by_stage[stage][fate] += n
        total = {k: sum(s[k] for s in by_stage.values()) for k in ("useful", "wasted", "pending")}
        return {"by_stage": dict(by_stage), **total, "prefill": self.prefill_layer_tokens}

    def _row(self, ev: RoundEvent) -> dict:
        return {"round": ev.round, "t": ev.t, "new_tokens": ev.committed, "tentative": ev.tentative,
                "tokens_per_s": ev.committed / ev.t if ev.t > 0 else 0.0, **self.acceptance()}

    def summary(self) -> dict:
        decode_passes = self.full_passes
        after_first = max(self.new_tokens - 1, 0)
        return {
            "method": self.method,
            "new_tokens": self.new_tokens,
            "wall_s": self.t,
            "prefill_s": self.prefill_s,
            "tokens_per_s": self.new_tokens / self.t if self.t > 0 else 0.0,
            "acceptance": self.acceptance(),  # per token, in order up to each block's first rejection
            "kept": self.kept(),  # kept / proposed
            "drafted": self.drafted,
            "full_passes": decode_passes,
            "tokens_per_full_pass": after_first / decode_passes if decode_passes else None,
            "rounds": self.rounds,
            "layer_tokens": self.work(),
            "finish_reason": self.finish_reason,
            "host_syncs": self.host_syncs,
            "stage_s": dict(self.stage_s),
            "policy_choices": dict(self.choices),
            # the share of the wall time spent in layer passes; the rest: heads, token choice, engine
            "layers_share": sum(self.stage_s.values()) / self.t if self.t > 0 else None,
        }


def pair_name(key: str, roles: dict | None = None) -> str:
    """A level pair as readers see it, by what each level is: "verify->target" of the list (2, 4) -> "exit 4 →
    full model"; "lookup->verify" with the 4-bit full model as verifier -> "lookup → 4-bit full model".
    `roles`: the run's level of each role (engine.levels.levels_by_role); a role it does not name stays a role."""
    def name(role: str) -> str:
        level = (roles or {}).get(role)
        if role == "target":
            return "full model"
        return role if level is None else level_words(level).removeprefix("the ")

    return " → ".join(name(role) for role in key.split("->"))


ROLE_ORDER = ("lookup", "draft", "verify", "target")  # bottom first, as the levels stack


def in_stack_order(keys) -> list[str]:
    """Level pairs ("lookup->verify", "verify->target") bottom first, as the levels stack."""
    rank = lambda key: [ROLE_ORDER.index(r) if r in ROLE_ORDER else len(ROLE_ORDER) for r in key.split("->")]  # noqa: E731
    return sorted(keys, key=rank)


def stats_rows(s: dict, roles: dict | None = None) -> list[tuple[str, str]]:
    """A run's summary as (label, value) rows, in reading order: the one rendering of the stats that
    the CLI (one line) and the app (a table) both show; `roles`: as pair_name takes them."""
    def pct(v):
        return "–" if v is None else f"{v:.0%}"

    rows = [("new tokens", str(s["new_tokens"])), ("time", f"{s['wall_s']:.2f} s"),
            ("tokens / s", f"{s['tokens_per_s']:.2f}")]
    rows += [(f"acceptance {pair_name(k, roles)}", pct(v)) for k, v in s["acceptance"].items()]
    kept = s.get("kept") or {}
    if any(kept.get(k) != v for k, v in s["acceptance"].items()):  # a block's tail fell with its first rejection
        rows += [(f"drafts kept {pair_name(k, roles)} (of all proposed)", pct(v)) for k, v in kept.items()]
    per_pass = s["tokens_per_full_pass"]
    rows += [("full-model passes", str(s["full_passes"])),
             ("tokens per full pass", "–" if per_pass is None else f"{per_pass:.2f}"),
             ("layer-token work: useful / wasted", f"{s['layer_tokens']['useful']} / {s['layer_tokens']['wasted']}")]
    if s.get("policy_choices"):  # the adaptive policy's plans, most frequent first
        plans = sorted(s["policy_choices"].items(), key=lambda kv: -kv[1])
        rows.append(("adaptive plans (rounds)", ", ".join(f"{kind_words(k)}: {n}" for k, n in plans)))
    if s.get("layers_share") is not None:
        rows.append(("time in layer passes", pct(s["layers_share"])))
    if s.get("finish_reason"):
        rows.append(("stopped by", s["finish_reason"].replace("_", " ")))
    return rows
