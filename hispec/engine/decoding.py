"""One decode loop over a list of levels (hispec.engine.levels), each generation a stream of events.

Named presets:
- autoregressive: [full], the full model one token at a time;
- layerskip: [exit E, full], single-exit self-speculation, verified with layers [E, L);
- hispec: [exit d, exit v, full], draft at d, tentatively verify at v, verify with the full model
  once t tokens are tentative (lengths (k, t); Hierarchical Speculative Decoding); with the auto
  policy its list starts with the lookup level: [lookup, exit d, exit v, full];
- lookup: [lookup, full], prompt lookup verified by the full model.

Every list runs on a StageStack, so KV caches and hidden states of a shallower exit are reused by
the deeper one; a policy (hispec.engine.planning.policy) plans each round. Greedy selection throughout gives the
target's own greedy output; sampling stays lossless at every level.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import torch

from hispec.engine.config import DecodeConfig, check_prompt
from hispec.engine.planning.costs import CostLearner
from hispec.engine.device_drafts import DeviceDrafts
from hispec.engine.events import DoneEvent, Event, PassEvent, PolicyEvent, RoundEvent, TokenState
from hispec.engine.gate import give_way
from hispec.engine.lanes import Lanes, lane_layout
from hispec.engine.ledger import Ledger
from hispec.engine.levels import LOOKUP, build_levels
from hispec.engine.judging import Judge
from hispec.engine.lookup import LookupIndex
from hispec.engine.planning.policy import Plan, Policy, adapts, make_policy
from hispec.engine.planning.priors import acceptance_priors
from hispec.engine.sampling import SamplingParams, Selector, Verdict
from hispec.text import Detokenizer

if TYPE_CHECKING:
    from hispec.model.early_exit import EarlyExitModel

S = TokenState


class Decoder:
    """One generation: `events()` runs it and yields what happens, token by token. Its parts: the
    ledger (each token's text, holder and proposal, and its events), the device-held drafts, the
    lanes' stage stacks, the policy, and the cost learner that watches every pass and head."""

    def __init__(self, ee: EarlyExitModel, prompt_ids: list[int], config: DecodeConfig, eos_ids: Iterable[int] = (),
                 detok: Detokenizer | None = None, stop: threading.Event | None = None,
                 judge: Callable[[str, int], int] | None = None, defer_sync: bool | None = None):
        self.config = cfg = config.resolve_for(ee)  # as it is, when resolved for this model already
        check_prompt(len(prompt_ids), cfg.max_new_tokens, ee.context_limit)
        self.ee, self.prompt_ids, self.eos = ee, list(prompt_ids), frozenset(eos_ids)
        self.detok = detok or Detokenizer()
        self._stop = stop or threading.Event()
        self.ledger = Ledger(len(prompt_ids), self.eos, self.detok, cfg.max_new_tokens, cfg.stop_strings, self._clock)
        # Greedy drafts stay on the device until their block is complete (None: on accelerators).
        on_device = (ee.device.type != "cpu" if defer_sync is None else defer_sync) and cfg.temperature == 0
        self._device = DeviceDrafts(self.ledger, on_device)
        self.syncs = 0  # device-to-host transfers of decisions (drafts, verdicts, target tokens)
        self.selector = Selector(SamplingParams(float(cfg.temperature), cfg.top_k, float(cfg.top_p)), cfg.seed)
        self.levels = build_levels(cfg.levels, ee.num_layers)
        self._adapts, self._index = adapts(cfg.policy), {level: i for i, level in enumerate(self.levels)}
        # Where each level that runs layers stops: (its lane, i.e. its number format; the boundary index
        # in that lane's stack). The lookup level runs none. Each format's copy of the model and costs.
        self._layout, self._stops = lane_layout(self.levels)
        self._models = {None: ee, **{p: ee.in_format(p) for p in self._layout if p is not None}}
        self.costs = CostLearner({p: self._models[p] for p in self._layout}, self.levels, self._adapts, ee.sharing_with)
        self.policy: Policy = make_policy(cfg.policy, self.levels, cfg, self.costs.lanes,
                                          acceptance_priors(ee, self.levels))
        self.judge = Judge(self.selector, self.ledger, self.policy, judge)  # judge: timing-only decisions
        self._lookup = LookupIndex() if self.levels[0].kind == LOOKUP else None
        self.stack: Lanes | None = None

    @property
    def decisions(self) -> list[tuple[str, int, int]]:
        return self.judge.decisions

    # ---- the decode loop -------------------------------------------------------------------
    def events(self) -> Iterator[Event]:
        self._t0, self._waited = time.perf_counter(), 0.0
        led = self.ledger
        if self.config.max_new_tokens == 0:
            led.finish_reason = "max_new_tokens"
        else:
            try:
                yield from self._decode()
                if self._device.waiting:  # stopped while drafts were on the device
                    self._sync_drafts()
                led.reject_from(led.committed, S.DISCARDED, "stop")  # stopped mid-round: pending never commit
                yield from self._drain()
            finally:  # static KV buffers (CUDA graphs) go back for the next generation
                if self.stack is not None:
                    self.stack.release()
        yield self._done()

    def _decode(self) -> Iterator[Event]:
        """One loop for every level list: propose, judge level by level, verify with the full model."""
        led = self.ledger
        yield from self._prefill()
        stack = self.stack
        while not self._finished():
            led.round += 1
            t_round, committed = self._clock(), led.committed
            plan = self._plan()
            rnd, at = plan.round, self._index  # the round's levels -> their place in the list
            # 1. The proposer proposes: lookup copies, an exit drafts, the full model takes a plain step.
            first = len(stack)
            if rnd.proposer.kind == LOOKUP:  # a point mass on each copied token (lossless)
                led.place_copies(plan.tokens, f"lookup:{self._lookup_ngram}")
            elif not rnd.plain:
                yield from self._draft(at[rnd.proposer], rnd.count)
                if self._finished():
                    break
            # 2. Each intermediate level above the proposer judges this round's proposals, bottom up, from the
            #    saved hidden states of the level below (no layer runs twice).
            for j in (at[judge] for judge in rnd.judges):
                if len(stack) > first:
                    h = stack.run_to(self._stops[j], len(stack) - 1)
                    self._judge_at(j, first, self._logits(h[0, first - len(stack) :], j))
            #    With `then`, the last judge drafts on where the copy it judged ended (lookup, a cheap lane).
            if rnd.then and rnd.judges and stack.tokens[-1] not in self.eos:
                yield from self._draft(at[rnd.judges[-1]], min(rnd.then, led.room()))
                if self._finished():
                    break
            # 3. The full model, once enough tokens are pending, or the sequence must end.
            pending = stack.tokens[led.committed :]
            if (rnd.plain or len(pending) >= rnd.verify_at or led.room() == 0
                    or any(t in self.eos for t in pending)):
                self._verify_with_target()
            yield from self._end_round()
            self.policy.observe_round(plan, led.committed - committed, self.costs.on_round(self._clock() - t_round))

    def _plan(self) -> Plan:
        """The policy's plan for this round, and its PolicyEvent (fixed rounds too: the round is a value)."""
        led, match = self.ledger, ([], 0)
        if self._lookup is not None and led.room() > 0:
            if self._device.waiting:
                self._sync_drafts()
            self._lookup.extend(self.stack.tokens, led.committed)
            match = self._lookup.propose(self.stack.tokens, self.policy.lookup_limit(led.room()))
            cut = next((i for i, t in enumerate(match[0]) if t in self.eos), None)  # never copy past an EOS
            if cut is not None:
                match = (match[0][: cut + 1], match[1])
        self.policy.before_plan(self.stack.behind(), self.ee.sharing_with())  # lanes behind, visitors beside
        plan = self.policy.plan(led.room(), len(self.stack) - led.committed, match)
        if plan.tokens:
            self._lookup_ngram = match[1]
        led.out.append(PolicyEvent(led.round, plan.choice, plan.round.count, plan.round.verify_at, plan.reason,
                                   dict(plan.estimates), self._clock(), plan.round, plan.expected_gain, self._adapts))
        return plan

    # ---- stages ------------------------------------------------------------------------
    def _draft(self, j: int, n: int) -> Iterator[Event]:
        """Level j drafts up to n tokens, one at a time (its layers, then its exit head)."""
        origin, stack = self.levels[j].name, self.stack
        if self._device.enabled:  # greedy on an accelerator: the block stays on the device
            step = lambda: self._logits(stack.run_to(self._stops[j], len(stack))[0, -1:], j).argmax(-1)  # noqa: E731
            self._device.draft(n, origin, step, self._stop)
            yield from self._drain()
            return
        for _ in range(n):
            h = stack.run_to(self._stops[j], len(stack))
            token, q = self.selector.propose(self._logits(h[0, -1], j))
            self.syncs += 1
            self.ledger.place(token, S.DRAFTED, origin, q)
            yield from self._drain()
            if token in self.eos or self._stop.is_set():
                break

    def _sync_drafts(self, preds=None) -> list[int]:
        self.syncs += 1
        return self._device.sync(preds)

    def _judge_at(self, j: int, first: int, logits) -> None:
        """Intermediate level j tentatively accepts the proposals it agrees with and replaces the
        first one it rejects by its own token (also tentative); the rest are thrown away."""
        name = self.levels[j].name
        self.ledger.judged(first, self._judge_block(name, first, logits), name)

    def _verify_with_target(self) -> None:
        """Run the rest of the model on every pending token; commit the matching prefix,
        then the target's own token (a correction, or the bonus when all matched)."""
        stack, led = self.stack, self.ledger
        first, last = led.committed, stack.tokens[-1]
        # The bonus token needs the newest token run through every layer (its first time).
        # (A draft still on the device is assumed not EOS; if it is, the extra row goes unused.)
        want_bonus = led.room() > 0 and (isinstance(last, torch.Tensor) or last not in self.eos)
        end = len(stack) if want_bonus else len(stack) - 1
        top = len(self.levels) - 1
        h = stack.run_to(self._stops[top], end)
        verdict = self._judge_block("target", first, self._logits(h[0, first - 1 - end :], top))  # pending (+ bonus)
        for pos in range(first, first + verdict.accepted):
            if led.commit(pos, S.ACCEPTED):
                led.reject_from(pos + 1, S.DISCARDED, "target")
                return
        if first + verdict.accepted < len(stack):
            led.reject_from(first + verdict.accepted, S.TARGET_REJECTED, "target")
        led.write(verdict.token, "target")

    def _judge_block(self, stage: str, first: int, logits) -> Verdict:
        """The stage's verdict on the pending tokens from `first` on (engine.judging)."""
        preds, logits = self._device.with_verdict(logits, first)  # drafts on the device travel with it
        self.syncs += 1  # one transfer per verification decision
        return self.judge.block(stage, first, logits, preds)

    def _logits(self, hidden, j: int):
        """Level j's exit head on these hidden states (in that level's number format)."""
        level = self.levels[j]
        t0 = time.perf_counter()
        logits = self._models[level.precision].exit_logits(hidden, level.layer)
        self.costs.on_head(level, logits.shape[0] if logits.dim() > 1 else 1, time.perf_counter() - t0,
                           self.stack.head_work)  # its attention step, when it has one, is in head_work
        return logits

    # ---- start, events, end ------------------------------------------------------------
    def _prefill(self) -> Iterator[Event]:
        """Start the lanes' stacks and run the prompt through the full model; its token is the first."""
        capacity = len(self.prompt_ids) + self.config.max_new_tokens + 2 + self.config.lookup_len
        self.stack = self.ledger.stack = Lanes(self.ee, self._layout, self._models, capacity)
        for token in self.prompt_ids:
            self.stack.append(token)
        self.ledger.committed = len(self.prompt_ids)
        top = len(self.levels) - 1
        h = self.stack.run_to(self._stops[top], len(self.prompt_ids))
        self.stack.seed_cheap_lanes(len(self.prompt_ids))  # cheaper lanes start from the prompt's exact KV
        self.ledger.write(self.selector.propose(self._logits(h[0, -1], top))[0], "target")
        self.syncs += 1
        yield from self._drain(stage="prefill")

    def _finished(self) -> bool:
        if self.ledger.finish_reason is None and self._stop.is_set():
            self.ledger.finish_reason = "stopped"
        return self.ledger.finish_reason is not None

    def _drain(self, stage: str | None = None) -> Iterator[Event]:
        for p in self.stack.passes:
            if stage is None:
                self.costs.on_pass(p)
            yield PassEvent(stage or p.stage, p.start, p.end, p.serials, p.seconds, self.ledger.round, *p.beside)
        self.stack.passes.clear()
        yield from self.ledger.out
        self.ledger.out.clear()

    def _end_round(self) -> Iterator[Event]:
        yield from self._drain()
        led = self.ledger
        yield RoundEvent(led.round, led.committed - len(self.prompt_ids), len(self.stack) - led.committed,
                         tuple(self.stack.cache_lengths()), self._clock())
        self._waited += give_way()  # a shared model may run another job's round here (engine.gate)

    def _clock(self) -> float:
        """Seconds of this generation's own work so far (waits for a shared model's turn left out)."""
        return time.perf_counter() - self._t0 - self._waited

    def _done(self) -> DoneEvent:
        led = self.ledger
        new = self.stack.tokens[len(self.prompt_ids) : led.committed] if self.stack else []
        settings = _settings(self.config, self.ee, self.judge.timing_only)
        self.stack = None  # free the caches now, not when the consumer lets go
        return DoneEvent(led.finish_reason or "stopped", tuple(new), self.detok.decode(new, skip_special_tokens=True),
                         len(self.prompt_ids), self._clock(), settings, self.syncs, self.costs.frozen_ms())


def _settings(config: DecodeConfig, ee: EarlyExitModel, timing_only) -> dict:
    """What the DoneEvent reports of a run's settings: the configuration's, the judge's, the model's."""
    settings = config.settings()
    if timing_only is not None:
        settings["timing_only"] = timing_only.describe()
    settings.update(num_layers=ee.num_layers, dtype=str(ee.dtype).replace("torch.", ""), device=str(ee.device))
    if ee.graphs is not None:
        settings["graphs"] = ee.graphs.backend
    return settings


def decode(ee: EarlyExitModel, prompt_ids: list[int], config: DecodeConfig, **kwargs) -> Iterator[Event]:
    """Convenience: the event stream of one generation."""
    return Decoder(ee, prompt_ids, config, **kwargs).events()
