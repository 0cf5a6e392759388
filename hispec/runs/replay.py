"""Replay a finished generation round by round from its recorded events (nothing is re-run).

`replay(events)` folds the event stream of one generation (hispec.engine.events) into one
JSON-ready dict per round, round 0 being the prefill:

    {"round": r, "plan": {"choice", "reason", "count", "verify_at"} | None,
     "steps": [step, ...],                  # what ran, in the order it ran
     "cache_before": [n per layer], "cache_after": [n per layer],
     "committed_total": n,                  # generated tokens committed after this round
     "tentative": n,                        # tokens pending (not yet judged by the full model) after it
     "seconds": s,                          # sum of the round's layer passes
     "wall_seconds": s | None,              # time since the previous round ended (bookkeeping included)
     "complete": bool}                      # False: the run stopped inside this round (no RoundEvent)

    step = {"stage": "prefill" | "lookup" | "draft" | "verify" | "target" | "stop",
            "level": the level's role name (a draft at the verifier's exit has stage "draft", level "verify"),
            "title": "Draft at exit 4", "exit": exit layer | None,
            "layers": [start, end) over all its passes | None (lookup and stop run no layer),
            "tokens": distinct tokens its passes ran on, "runs": passes that reached its top stage
            (drafts: one per drafted token), "seconds": s,
            "passes": [{"stage", "layers": [start, end], "tokens": n, "seconds": s}, ...],
            "proposed", "kept", "rejected", "wrote", "committed", "discarded": [token, ...]}
    token = {"serial", "index", "text", "token_id", "origin", "state", "born"}  # born: its first state

A round's stages in order: the proposal (lookup: a zero-cost step; an exit: one "draft" step that
merges its one-token passes, listed under "passes"), each intermediate judge ("verify"), followed by
its own drafts when it drafted on after judging, the full model ("target") when it ran, and a "stop"
step holding the tokens discarded by a Stop.

The engine drains a round's passes before its token events, so passes are matched to stages by
the order they ran in: every stage runs the stack up to its own level (catching up the stages
below on tokens they have not seen) and ends with a pass of its own level; the stages present are
read from the token events (who decided what). Where a round has no RoundEvent (stopped), cache
lengths are recomputed from the passes and the rejections (the same arithmetic as the stack's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Mapping

from hispec.engine.events import DoneEvent, Event, PassEvent, PolicyEvent, RoundEvent, TokenEvent
from hispec.engine.planning.round import Round
from hispec.runs.record import RunRecord
from hispec.engine.events import TokenState as S

_LISTS = ("proposed", "kept", "rejected", "wrote", "committed", "discarded")
_INTO = {
    S.DRAFTED: ("proposed",),
    S.TENTATIVE: ("kept",),
    S.VERIFY_REJECTED: ("rejected",),
    S.VERIFY_WROTE: ("wrote",),
    S.ACCEPTED: ("committed",),
    S.TARGET_REJECTED: ("rejected",),
    S.TARGET_WROTE: ("wrote", "committed"),
    S.DISCARDED: ("discarded",),
}
_JUDGED = (S.TENTATIVE, S.VERIFY_REJECTED, S.VERIFY_WROTE)
_BY_TARGET = (S.ACCEPTED, S.TARGET_REJECTED, S.TARGET_WROTE)
_PENDING = (S.DRAFTED, S.TENTATIVE, S.VERIFY_WROTE)
_CUTS = (S.VERIFY_REJECTED, S.TARGET_REJECTED, S.DISCARDED)


@dataclass
class _Step:
    stage: str  # what the step does in the round
    level: str  # the level (role name) it ran as; its passes end with a pass of this stage
    need: int = 1  # runs that reach `level` (drafts: one per drafted token; lookup, stop: none)
    passes: list[PassEvent] = field(default_factory=list)
    runs: int = 0
    tokens: list[TokenEvent] = field(default_factory=list)

    def to_dict(self, born: dict[int, S]) -> dict:
        start = min((p.start for p in self.passes), default=None)
        end = max((p.end for p in self.passes), default=None)
        exit_layer = end if self.stage in ("draft", "verify") else None
        out = {"stage": self.stage, "level": self.level, "title": _title(self.stage, exit_layer),
               "exit": exit_layer, "layers": None if start is None else [start, end],
               "tokens": len({s for p in self.passes for s in p.serials}), "runs": self.runs,
               "seconds": sum(p.seconds for p in self.passes),
               "passes": [{"stage": p.stage, "layers": [p.start, p.end], "tokens": len(p.serials),
                           "seconds": p.seconds} for p in self.passes]}
        out.update({name: [] for name in _LISTS})
        for ev in self.tokens:
            token = {"serial": ev.serial, "index": ev.index, "text": ev.text, "token_id": ev.token_id,
                     "origin": ev.origin, "state": ev.state.value, "born": born[ev.serial].value}
            for name in _INTO[ev.state]:
                out[name].append(token)
        return out


def _title(stage: str, exit_layer: int | None) -> str:
    at = f" at exit {exit_layer}" if exit_layer is not None else ""
    return {"prefill": "Prefill", "lookup": "Lookup", "draft": f"Draft{at}", "verify": f"Intermediate verify{at}",
            "target": "Full model", "stop": "Stopped"}[stage]


def _steps_of(r: int, tokens: list[TokenEvent]) -> list[_Step]:
    """The round's stages in the order they ran, read from who decided what."""
    if r == 0:
        return [_Step("prefill", "prefill")]
    steps: dict[tuple[str, str], _Step] = {}
    for ev in tokens:  # proposals first, then each judge bottom up, then the full model
        if ev.state is S.DRAFTED:
            if ev.origin == "lookup":
                steps.setdefault(("lookup", "lookup"), _Step("lookup", "lookup", need=0))
            else:
                steps.setdefault(("draft", ev.origin), _Step("draft", ev.origin, need=0)).need += 1
    judges: dict[str, _Step] = {}
    for ev in tokens:
        if ev.state in _JUDGED:
            judges.setdefault(ev.stage, _Step("verify", ev.stage))
    # a level that judged this round and drafted too drafted on after judging ("lookup 5 -> full@q4 +3"):
    # its drafts are listed after its verdicts, in the order they ran
    after: dict[str, _Step] = {level: steps.pop(("draft", level)) for level in judges if ("draft", level) in steps}
    propose = list(steps.values())
    ordered = [step for level, judge in judges.items() for step in (judge, after.get(level)) if step is not None]
    target = [_Step("target", "target")] if any(
        ev.state in _BY_TARGET or (ev.state is S.DISCARDED and ev.stage == "target") for ev in tokens) else []
    stop = [_Step("stop", "stop", need=0)] if any(
        ev.state is S.DISCARDED and ev.stage == "stop" for ev in tokens) else []
    return propose + ordered + target + stop


def _step_for(ev: TokenEvent, steps: list[_Step]) -> _Step:
    def find(stage, level=None):
        return next((s for s in steps if s.stage == stage and (level is None or s.level == level)), None)

    if ev.state is S.DRAFTED:
        step = find("lookup") if ev.origin == "lookup" else find("draft", ev.origin)
    elif ev.state in _JUDGED:
        step = find("verify", ev.stage)
    elif ev.state in _BY_TARGET:
        step = find("prefill") or find("target")
    elif ev.stage == "stop":
        step = find("stop")
    elif ev.stage == "target":
        step = find("target") or find("prefill")
    else:  # drafts after a drafted EOS, cut when they reached the host
        step = find("draft") or find("lookup")
    return step or steps[-1]


def _assign_passes(passes: list[PassEvent], steps: list[_Step]) -> None:
    """Each stage's passes end with one of its own level (a draft stage: one per drafted token)."""
    if steps and steps[0].stage == "prefill":
        steps[0].passes, steps[0].runs = list(passes), 1 if passes else 0
        return
    runnable = [s for s in steps if s.stage in ("draft", "verify", "target")]
    i = 0
    for p in passes:
        while i < len(runnable) - 1 and runnable[i].runs >= runnable[i].need:
            i += 1
        if not runnable:  # passes but no decision at all (a truncated trace): a step of their own
            runnable.append(_Step("target" if p.stage == "target" else "draft", p.stage, need=0))
            steps.append(runnable[0])
        step = runnable[i]
        step.passes.append(p)
        if p.stage == step.level:
            step.runs += 1


def rounds_of(record: RunRecord) -> list[dict]:
    """`replay` of a finished run's record: its events, each round named by its plan."""
    return replay(record.events, record.plans, record.num_layers)


def replay(events: list[Event], plans: Mapping[int, Round] | None = None, num_layers: int | None = None) -> list[dict]:
    """One JSON-ready dict per round of a finished (or stopped) generation; see the module doc. `plans`: each
    round's plan (RunRecord.plans, which reads traces recorded before rounds travelled as values); without
    it, a round is named by its PolicyEvent's plan, else its label as written."""
    by_round: dict[int, list[Event]] = {}
    done = None
    for ev in events:
        if isinstance(ev, DoneEvent):
            done = ev
        elif isinstance(ev, (TokenEvent, PassEvent, RoundEvent, PolicyEvent)):
            by_round.setdefault(ev.round, []).append(ev)
    if not by_round:
        return []
    prefill = [ev for ev in by_round.get(0, []) if isinstance(ev, PassEvent)]
    prompt_len = done.prompt_len if done is not None else len(prefill[0].serials) if prefill else 0
    num_layers = _num_layers(events, num_layers)

    rounds, cache = [], [0] * num_layers
    born: dict[int, S] = {}
    state: dict[int, S] = {}
    committed, prev_end = 0, 0.0
    last = max(by_round)
    for r in sorted(by_round):
        evs = by_round[r]
        tokens = [ev for ev in evs if isinstance(ev, TokenEvent)]
        passes = [ev for ev in evs if isinstance(ev, PassEvent)]
        round_ev = next((ev for ev in evs if isinstance(ev, RoundEvent)), None)
        policy = next((ev for ev in evs if isinstance(ev, PolicyEvent)), None)
        steps = _steps_of(r, tokens)
        for ev in tokens:
            born.setdefault(ev.serial, ev.state)
            state[ev.serial] = ev.state
            if ev.state in (S.ACCEPTED, S.TARGET_WROTE):
                committed += 1
            if steps:
                _step_for(ev, steps).tokens.append(ev)
        _assign_passes(passes, steps)

        before = list(cache)
        for step in steps:  # the caches as the stack changed them: each stage's passes, then its cuts
            for p in step.passes:
                for layer in range(p.start, min(p.end, num_layers)):
                    cache[layer] += len(p.serials)
            cuts = [ev.index for ev in step.tokens if ev.state in _CUTS]
            if cuts:
                cache = [min(n, prompt_len + min(cuts)) for n in cache]
        if round_ev is not None:
            cache = list(round_ev.cache_lengths)
        tentative = round_ev.tentative if round_ev is not None else sum(s in _PENDING for s in state.values())

        times = [ev.t for ev in evs if isinstance(ev, (TokenEvent, RoundEvent, PolicyEvent))]
        end = round_ev.t if round_ev is not None else done.t if done is not None and r == last else max(
            times, default=None)
        wall = None if end is None else max(0.0, end - prev_end)
        prev_end = end if end is not None else prev_end
        step_dicts = [s.to_dict(born) for s in steps]
        rounds.append({
            "round": r,
            "plan": None if policy is None else {"choice": policy.choice, "words": _plan_words(policy, (plans or {}).get(r)),
                                                 "reason": policy.reason, "count": policy.count,
                                                 "verify_at": policy.verify_at, "expected_gain": policy.expected_gain},
            "steps": step_dicts,
            "cache_before": before,
            "cache_after": list(cache),
            "committed_total": committed,
            "tentative": tentative,
            "seconds": sum(s["seconds"] for s in step_dicts),
            "wall_seconds": wall,
            "complete": round_ev is not None or (r == 0 and bool(tokens)),
        })
    return rounds


def _plan_words(policy: PolicyEvent, plan: Round | None) -> str:
    """The round in the page's words (engine.planning.round.Round.words), else its label as it is."""
    plan = policy.plan if policy.plan is not None else plan
    return plan.words if plan is not None else policy.choice


def _num_layers(events: list[Event], known: int | None) -> int:
    for ev in events:
        if isinstance(ev, RoundEvent):
            return len(ev.cache_lengths)
    if known is not None:
        return known
    return max((ev.end for ev in events if isinstance(ev, PassEvent)), default=0)
