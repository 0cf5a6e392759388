"""One decode loop over a list of levels (hispec.engine.levels), each generation a stream of events.

Named presets:
- autoregressive: [full], the full model one token at a time;
- layerskip: [exit E, full], single-exit self-speculation, verified with layers [E, L);
- hispec: [exit d, exit v, full], draft at d, tentatively verify at v, verify with the full model
  once `verify_threshold` tokens are tentative (Hierarchical Speculative Decoding); with the auto
  policy its list starts with the lookup level: [lookup, exit d, exit v, full];
- lookup: [lookup, full], prompt lookup verified by the full model.

Every list runs on a StageStack, so KV caches and hidden states of a shallower exit are reused by
the deeper one; a policy (hispec.engine.policy) plans each round. Greedy selection throughout gives the
target's own greedy output; sampling stays lossless at every level.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import torch

from hispec.engine.costs import model_costs
from hispec.engine.events import DoneEvent, Event, PassEvent, PolicyEvent, RoundEvent, TokenEvent, TokenState
from hispec.engine.gate import give_way
from hispec.engine.levels import EXIT, LOOKUP, build_levels, exits_by_role, parse_levels
from hispec.engine.lookup import LookupIndex
from hispec.engine.policy import DEFAULT_POLICY, POLICIES, Plan, Policy, make_policy
from hispec.engine.sampling import PointMass, Proposal, SamplingParams, Selector, Verdict
from hispec.engine.lanes import Lanes, lane_layout
from hispec.errors import ConfigError
from hispec.text import Detokenizer

if TYPE_CHECKING:
    from hispec.model.early_exit import EarlyExitModel

METHODS = ("autoregressive", "layerskip", "hispec", "lookup")
S = TokenState


# The settings used when a model's trained exits recommend none (the paper's defaults). The CLI's
# help, the app and the sweep's marked default point read them from here.
DEFAULT_DRAFT_LEN = 2  # hispec: tokens drafted per block
DEFAULT_VERIFY_THRESHOLD = 4  # hispec: tentative tokens that call the full model; layerskip's draft_len
DEFAULT_LAYERS = {"draft_layer": "L/8", "verify_layer": "L/4", "layerskip_exit": "L/4"}  # as default_*_layer


def default_draft_layer(num_layers: int) -> int:
    return max(1, round(num_layers / 8))


def default_verify_layer(num_layers: int) -> int:
    return max(default_draft_layer(num_layers) + 1, round(num_layers / 4))


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one generation. None means: the default for the method and model depth."""

    method: str = "hispec"
    # None: the model's recommended setting (from its trained exits' manifest), else the default.
    draft_layer: int | None = None  # hispec: draft exit d (default L/8); layerskip: exit E (default L/4)
    verify_layer: int | None = None  # hispec only: intermediate verifier exit v (default L/4)
    draft_len: int | None = None  # tokens drafted per block (hispec 2, layerskip verify_threshold)
    verify_threshold: int | None = None  # hispec: tentative tokens that trigger the full model (default 4)
    max_new_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    temperature: float = 0.0  # 0 = greedy (exactly the target's greedy output)
    top_k: int = 0  # 0 = no top-k
    top_p: float = 1.0  # 1 = no top-p
    seed: int | None = None  # for reproducible sampling
    # The level list, bottom first, the full model implied: e.g. ("lookup", 2, 4); None: the
    # method's preset (see the module docstring). Exit layers here take precedence over
    # draft_layer / verify_layer.
    levels: tuple | None = None
    policy: str = DEFAULT_POLICY  # auto: planned per round (hispec.engine.policy); fixed: the settings above
    lookup_len: int = 8  # the lookup level proposes at most this many tokens per round

    def validate(self) -> None:
        """Check every value that does not depend on the model."""
        if self.method not in METHODS:
            raise ConfigError(f"unknown method '{self.method}'; choose from {', '.join(METHODS)}")
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy '{self.policy}'; choose from {', '.join(POLICIES)}")
        if not isinstance(self.lookup_len, int) or isinstance(self.lookup_len, bool) or self.lookup_len < 1:
            raise ConfigError(f"lookup_len must be a whole number >= 1 (got {self.lookup_len!r})")
        if self.levels is not None:
            parse_levels(self.levels)
        for name in ("draft_layer", "verify_layer", "draft_len", "verify_threshold", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{name} must be a whole number (got {value!r})")
        if self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be 0 or more (got {self.max_new_tokens})")
        if self.verify_threshold is not None and self.verify_threshold < 1:
            raise ConfigError(f"verify_threshold must be at least 1 (got {self.verify_threshold})")
        if self.draft_len is not None and self.draft_len < 1:
            raise ConfigError(f"draft_len must be at least 1 (got {self.draft_len})")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"temperature must be 0 (greedy) or a positive number (got {self.temperature!r})")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError(f"top_k must be 0 (off) or a positive whole number (got {self.top_k!r})")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (got {self.top_p!r})")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise ConfigError(f"seed must be a whole number >= 0 (got {self.seed!r})")

    def resolve(self, num_layers: int, recommended: dict | None = None) -> DecodeConfig:
        """Fill the defaults for a model of `num_layers` layers and check every value.
        `recommended`: the model's own settings (see `recommended_settings`), used for what is None."""
        self.validate()
        if self.policy == "auto" and self.temperature > 0 and self.seed is not None:
            # A seed asks for a reproducible run; the auto policy's plans follow timings, which
            # differ from run to run, and the draws follow the plans. Seeded sampling runs fixed rounds.
            return replace(self, policy="fixed").resolve(num_layers, recommended)
        L, rec = num_layers, recommended or {}
        threshold = self.verify_threshold or rec.get("verify_threshold") or DEFAULT_VERIFY_THRESHOLD
        if self.levels is not None:  # an explicit list: its exits are the layers
            return self._resolve_list(parse_levels(self.levels), L, rec, threshold)
        if self.method == "autoregressive":
            return replace(self, draft_layer=None, verify_layer=None, draft_len=None, verify_threshold=threshold,
                           levels=())
        if self.method == "lookup":
            return replace(self, draft_layer=None, verify_layer=None, draft_len=None, verify_threshold=threshold,
                           levels=("lookup",))
        if self.method == "layerskip":
            exit_layer = _first(self.draft_layer, rec.get("layerskip_exit"), default_verify_layer(L))
            _check_layers(L, exit_layer)
            draft_len = _first(self.draft_len, rec.get("layerskip_draft_len"), self.verify_threshold,
                               DEFAULT_VERIFY_THRESHOLD)
            return replace(self, draft_layer=exit_layer, verify_layer=None, draft_len=draft_len,
                           verify_threshold=threshold, levels=(exit_layer,))
        d = _first(self.draft_layer, rec.get("draft"), default_draft_layer(L))
        v = self.verify_layer
        if v is None:
            v = rec["verify"] if self.draft_layer is None and "verify" in rec else max(d + 1, default_verify_layer(L))
        _check_layers(L, d, v)
        levels = ("lookup", d, v) if self.policy == "auto" else (d, v)
        return replace(self, draft_layer=d, verify_layer=v,
                       draft_len=_first(self.draft_len, rec.get("draft_len"), DEFAULT_DRAFT_LEN),
                       verify_threshold=threshold, levels=levels)

    def resolve_for(self, ee: EarlyExitModel) -> DecodeConfig:
        """This configuration resolved for a loaded model: its depth and its trained exits'
        recommended settings (the one constructor of a runnable configuration)."""
        return self.resolve(ee.num_layers, recommended_settings(ee))

    def exit_layer(self, role: str) -> int | None:
        """The exit layer of a role ("draft", "verify") in the resolved level list (None: none)."""
        return exits_by_role(self.levels or ()).get(role)

    def _resolve_list(self, levels: tuple, L: int, rec: dict, threshold: int) -> DecodeConfig:
        middle = [x for x in levels if x != LOOKUP]  # the levels below the full model that run layers
        exits = [x for x in middle if isinstance(x, int)]  # ... in the exact format: the paper's layers
        build_levels(levels, L)  # checks the layers
        draft_len = _first(self.draft_len, rec.get("draft_len") if len(exits) == 2 else rec.get("layerskip_draft_len"),
                           DEFAULT_DRAFT_LEN)
        return replace(self, draft_layer=exits[0] if exits else None, verify_layer=exits[1] if len(exits) > 1 else None,
                       draft_len=draft_len if middle else None, verify_threshold=threshold, levels=levels)


def _first(*values):
    return next(v for v in values if v is not None)


def recommended_settings(ee: EarlyExitModel) -> dict:
    """Settings recommended by the model's trained exits (their manifest's `default_layers`:
    draft, verify, draft_len, verify_threshold, layerskip_exit, layerskip_draft_len), where valid."""
    info = getattr(ee, "exit_info", None) or {}
    rec = {k: v for k, v in (info.get("default_layers") or {}).items()
           if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    L = ee.num_layers
    if not (0 < rec.get("draft", 0) < rec.get("verify", 0) < L):
        rec.pop("draft", None), rec.pop("verify", None)
    if not 0 < rec.get("layerskip_exit", 1) < L:
        rec.pop("layerskip_exit")
    return rec


def _priors(ee: EarlyExitModel, levels) -> dict[tuple[str, str], float]:
    """Acceptance priors for the auto policy, all measured and shipped in the trained exits' manifest.
    First choice, `policy_priors` (scripts/measure_priors.py: acceptance in generations on the tuning
    split): "D-target" for exit D judged by the full model, "D-V" for exit D judged by exit V, and
    "lookup:N" for a lookup copy after an n-token match. Where a pair has none of those (heads a user
    trained), the heads' own evaluation: an exit's agreement with the final layer (`agreement`), two
    exits' agreement with each other (`pairs`, not the lower exit's with the final layer). A level in a
    cheaper format has only its measured figures, keyed by its spec ("full@q4-target", "4@q4-full@q4").
    A pair with nothing measured gets policy.UNKNOWN_PRIOR."""
    info = getattr(ee, "exit_info", None) or {}
    evaluation, measured = info.get("evaluation") or {}, info.get("policy_priors") or {}
    agreement, pairs = evaluation.get("agreement") or {}, evaluation.get("pairs") or {}
    exits = measured.get("exits") or {}
    priors = {}
    for i, level in enumerate(levels):
        if level.kind == LOOKUP or level.name == "target":
            continue
        for above in levels[i + 1 :]:
            judge = "target" if above.name == "target" else str(above.spec)
            rate = exits.get(f"{level.spec}-{judge}")  # e.g. "2-4", "2-target", "full@q4-target", "4@q4-full@q4"
            if level.precision is not None or above.precision is not None:
                pass  # a level in a cheaper format: only what was measured for it (policy_priors)
            elif rate is None and above.name != "target":
                rate = (pairs.get(f"{level.layer}-{above.layer}") or {}).get("trained")
            elif rate is None:
                rate = (agreement.get(str(level.layer)) or {}).get("trained")
            if rate is not None:
                priors[(level.name, above.name)] = float(rate)
    if levels and levels[0].kind == LOOKUP:
        for holder, rate in (measured.get("lookup") or {}).items():
            priors[(holder, "target")] = float(rate)
    return priors


def _check_layers(num_layers: int, *exits: int) -> None:
    names = ("draft layer", "verify layer")
    for name, layer in zip(names, exits):
        if not 0 < layer < num_layers:
            raise ConfigError(
                f"{name} {layer} is impossible: this model has {num_layers} layers, "
                f"so exits must satisfy 0 < draft layer < verify layer < {num_layers}"
            )
    if len(exits) == 2 and exits[0] >= exits[1]:
        raise ConfigError(
            f"draft layer {exits[0]} must be below verify layer {exits[1]} "
            f"(0 < draft layer < verify layer < {num_layers})"
        )


class Decoder:
    """One generation: `events()` runs it and yields what happens, token by token."""

    def __init__(
        self,
        ee: EarlyExitModel,
        prompt_ids: list[int],
        config: DecodeConfig,
        eos_ids: Iterable[int] = (),
        detok: Detokenizer | None = None,
        stop: threading.Event | None = None,
        judge: Callable[[str, int], int] | None = None,
        defer_sync: bool | None = None,
    ):
        self.config = config.resolve_for(ee)
        if not prompt_ids:
            raise ConfigError("the prompt is empty: give at least one token of text")
        if len(prompt_ids) + self.config.max_new_tokens > ee.context_limit:
            raise ConfigError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({self.config.max_new_tokens}) "
                f"exceeds the model's context of {ee.context_limit} tokens"
            )
        self.ee, self.prompt_ids = ee, list(prompt_ids)
        self.eos = frozenset(eos_ids)
        self.detok = detok or Detokenizer()
        self._stop = stop or threading.Event()
        self._judge = judge  # timing-only acceptance decisions; None = the real comparison
        cfg = self.config
        # Greedy drafts stay on the device until their block is complete (None: on accelerators).
        if defer_sync is None:
            defer_sync = ee.device.type != "cpu"
        self._defer_sync = defer_sync and cfg.temperature == 0
        self._unsynced = None  # (first position, device tensors) of drafts not yet on the host
        self.syncs = 0  # device-to-host transfers of decisions (drafts, verdicts, target tokens)
        self.decisions: list[tuple[str, int, int]] = []  # every verdict: (stage, pending tokens, accepted)
        self.selector = Selector(SamplingParams(float(cfg.temperature), cfg.top_k, float(cfg.top_p)), cfg.seed)
        self._proposal: dict[int, Proposal] = {}  # serial -> what the token was drawn from (sampling)
        self.levels = build_levels(cfg.levels, ee.num_layers)
        # Where each level that runs layers stops: (its lane, i.e. its number format; the boundary index
        # in that lane's stack). The lookup level runs none. Each format's copy of the model and costs.
        self._layout, self._stops = lane_layout(self.levels)
        self._models = {None: ee, **{p: ee.in_format(p) for p in self._layout if p is not None}}
        self._lane_costs = {p: self._costs_of(p) for p in self._layout}
        self.policy: Policy = make_policy(cfg.policy, self.levels, cfg, self._lane_costs, _priors(ee, self.levels))
        self._lookup = LookupIndex() if self.levels[0].kind == LOOKUP else None
        self._holder: dict[int, str] = {}  # serial -> the level that last proposed, wrote or passed it
        self.stack: Lanes | None = None
        self.committed = 0  # positions [0, committed) are final (prompt included)
        self.round = 0
        self.finish_reason: str | None = None
        self._out: list[Event] = []
        self._texts: dict[int, tuple[str, str]] = {}  # serial -> (text, origin)
        self._text = ""  # committed text, for stop strings

    # ---- the decode loop -------------------------------------------------------------------
    def events(self) -> Iterator[Event]:
        self._t0, self._waited = time.perf_counter(), 0.0
        if self.config.max_new_tokens == 0:
            self.finish_reason = "max_new_tokens"
        else:
            try:
                yield from self._decode()
                if self._unsynced is not None:  # stopped while drafts were on the device
                    self._sync_drafts()
                if len(self.stack) > self.committed:  # stopped mid-round: pending tokens are never committed
                    self._reject_from(self.committed, S.DISCARDED, "stop")
                yield from self._drain()
            finally:  # static KV buffers (CUDA graphs) go back for the next generation
                if self.stack is not None:
                    self.stack.release()
        yield self._done()

    def _decode(self) -> Iterator[Event]:
        """One loop for every level list: propose, judge level by level, verify with the full model."""
        levels, top = self.levels, len(self.levels) - 1
        stack = self._start()
        yield from self._prefill()
        while not self._finished():
            self.round += 1
            t_round, committed = self._clock(), self.committed
            plan = self._plan()
            # 1. The proposer proposes: lookup copies, an exit drafts, the full model takes a plain step.
            first = len(stack)
            if levels[plan.proposer].kind == LOOKUP:
                self._propose_lookup(plan.tokens)
            elif plan.proposer != top:
                yield from self._draft(plan.proposer, plan.count)
                if self._finished():
                    break
            # 2. Each intermediate level above the proposer judges this round's proposals, bottom up,
            #    from the saved hidden states of the level below (no layer runs twice).
            for j in plan.judges:
                if len(stack) > first:
                    h = stack.run_to(self._stops[j], len(stack) - 1)
                    self._judge_at(j, first, self._logits(h[0, first - len(stack) :], j))
            #    With `then`, the last judge drafts on where the copy it judged ended (lookup, a cheap lane).
            if plan.then and plan.judges and stack.tokens[-1] not in self.eos:
                yield from self._draft(plan.judges[-1], min(plan.then, self._room()))
                if self._finished():
                    break
            # 3. The full model, once enough tokens are pending, or the sequence must end.
            pending = stack.tokens[self.committed :]
            if (plan.proposer == top or len(pending) >= plan.verify_at or self._room() == 0
                    or any(t in self.eos for t in pending)):
                self._verify_with_target()
            yield from self._end_round()
            self.policy.observe_round(plan, self.committed - committed, self._clock() - t_round)

    def _plan(self) -> Plan:
        """The policy's plan for this round (and its PolicyEvent when the policy is adaptive)."""
        match = ([], 0)
        if self._lookup is not None and self._room() > 0:
            if self._unsynced is not None:
                self._sync_drafts()
            self._lookup.extend(self.stack.tokens, self.committed)
            match = self._lookup.propose(self.stack.tokens, self.policy.lookup_limit(self._room()))
            cut = next((i for i, t in enumerate(match[0]) if t in self.eos), None)  # never copy past an EOS
            if cut is not None:
                match = (match[0][: cut + 1], match[1])
        plan = self.policy.plan(self._room(), len(self.stack) - self.committed, match)
        if plan.tokens:
            self._lookup_ngram = match[1]
        if self.config.policy == "auto":
            self._out.append(PolicyEvent(self.round, plan.choice, plan.count, plan.verify_at, plan.reason,
                                         dict(plan.estimates), self._clock()))
        return plan

    def _propose_lookup(self, tokens) -> None:
        """The lookup level's proposal: a point mass on each copied token (lossless under sampling)."""
        for token in tokens:
            self._place(token, S.DRAFTED, "lookup", PointMass(token))
            self._holder[self.stack.serials[-1]] = f"lookup:{self._lookup_ngram}"

    # ---- stages ------------------------------------------------------------------------
    def _draft(self, j: int, n: int) -> Iterator[Event]:
        """Level j drafts up to n tokens, one at a time (its layers, then its exit head)."""
        origin = self.levels[j].name
        if self._defer_sync:
            yield from self._draft_on_device(j, n, origin)
            return
        for _ in range(n):
            h = self.stack.run_to(self._stops[j], len(self.stack))
            token, q = self.selector.propose(self._logits(h[0, -1], j))
            self.syncs += 1
            self._place(token, S.DRAFTED, origin, q)
            yield from self._drain()
            if token in self.eos or self._stop.is_set():
                break

    def _draft_on_device(self, j: int, n: int, origin: str = "draft") -> Iterator[Event]:
        """Greedy drafting on an accelerator without host-device syncs: each draft token stays on
        the device and feeds the next draft step directly. The block reaches the host together
        with the next verdict (`_sync_drafts`). (Deviation from a token-by-token loop: an EOS
        drafted mid-block is found only then, and the drafts after it are discarded.)"""
        stack = self.stack
        if n == 0:
            return
        self._unsynced = (len(stack), [], origin)
        for _ in range(n):
            h = stack.run_to(self._stops[j], len(stack))
            token = self._logits(h[0, -1:], j).argmax(-1)
            stack.append(token)
            self._unsynced[1].append(token)
            if self._stop.is_set():
                break
        yield from self._drain()

    def _sync_drafts(self, preds=None) -> list[int] | None:
        """Bring the device-held drafts (and a verifier's predictions `preds`, rows predicting
        positions from the verifier's first one on) to the host in one transfer; place the
        drafts' events, cut after a drafted EOS, and return the predictions still relevant."""
        first, drafted, origin = self._unsynced
        self._unsynced = None
        values = torch.cat(drafted + ([preds] if preds is not None else [])).tolist()
        self.syncs += 1
        tokens, preds = values[: len(drafted)], values[len(drafted) :]
        self.stack.resolve(first, tokens)
        for i in range(len(tokens)):
            self._record(first + i, S.DRAFTED, origin)
        cut = next((i for i, t in enumerate(tokens) if t in self.eos), None)
        if cut is not None and cut + 1 < len(tokens):
            self._reject_from(first + cut + 1, S.DISCARDED, "draft")
        return preds

    def _judge_at(self, j: int, first: int, logits) -> None:
        """Intermediate level j tentatively accepts the proposals it agrees with and replaces the
        first one it rejects by its own token (also tentative); the rest are thrown away."""
        name = self.levels[j].name
        verdict = self._judge_block(name, first, logits)
        for pos in range(first, first + verdict.accepted):
            serial = self.stack.serials[pos]
            self._proposal[serial] = verdict.dists[pos - first]  # now drawn, in effect, from this level's p
            self._holder[serial] = name
            self._emit(pos, S.TENTATIVE, name)
        if first + verdict.accepted < len(self.stack):
            self._reject_from(first + verdict.accepted, S.VERIFY_REJECTED, name)
            self._place(verdict.token, S.VERIFY_WROTE, name, verdict.dist)

    def _verify_with_target(self) -> None:
        """Run the rest of the model on every pending token; commit the matching prefix,
        then the target's own token (a correction, or the bonus when all matched)."""
        stack, first = self.stack, self.committed
        last = stack.tokens[-1]
        # The bonus token needs the newest token run through every layer (its first time).
        # (A draft still on the device is assumed not EOS; if it is, the extra row goes unused.)
        want_bonus = self._room() > 0 and (isinstance(last, torch.Tensor) or last not in self.eos)
        end = len(stack) if want_bonus else len(stack) - 1
        top = len(self.levels) - 1
        h = stack.run_to(self._stops[top], end)
        logits = self._logits(h[0, first - 1 - end :], top)  # rows for pending (+ bonus)
        verdict = self._judge_block("target", first, logits)
        for pos in range(first, first + verdict.accepted):
            if self._commit(pos, S.ACCEPTED):
                self._reject_from(pos + 1, S.DISCARDED, "target")
                return
        if first + verdict.accepted < len(stack):
            self._reject_from(first + verdict.accepted, S.TARGET_REJECTED, "target")
        self._write(verdict.token, "target")

    # ---- bookkeeping -------------------------------------------------------------------
    def _start(self) -> Lanes:
        capacity = len(self.prompt_ids) + self.config.max_new_tokens + 2 + self.config.lookup_len
        self.stack = Lanes(self.ee, self._layout, self._models, capacity)
        return self.stack

    def _costs_of(self, precision: str | None):
        """The cost model of one lane's copy of the model (calibrated once, for the exits it runs),
        or None when nothing needs it (the fixed policy, on a model never calibrated)."""
        model = self._models[precision]
        exits = tuple(lv.layer for lv in self.levels if lv.kind == EXIT and lv.precision == precision)
        return model_costs(model, exits) if self.config.policy == "auto" else getattr(model, "cost_model", None)

    def _prefill(self) -> Iterator[Event]:
        for token in self.prompt_ids:
            self.stack.append(token)
        self.committed = len(self.prompt_ids)
        top = len(self.levels) - 1
        h = self.stack.run_to(self._stops[top], len(self.prompt_ids))
        self.stack.seed_cheap_lanes(len(self.prompt_ids))  # cheaper lanes start from the prompt's exact KV
        self._write(self.selector.propose(self._logits(h[0, -1], top))[0], "target")
        self.syncs += 1
        yield from self._drain(stage="prefill")

    def _judge_block(self, stage: str, first: int, logits) -> Verdict:
        """The stage's verdict on the pending tokens from `first` on (the timing-only judge's
        acceptance count instead, when one is given); every judged token is observed by the policy."""
        preds = None
        if self._unsynced is not None:  # drafts still on the device: they travel with this verdict
            preds = self._sync_drafts(logits.argmax(-1))
            # Row j predicts position first + j; after a cut at a drafted EOS fewer rows matter.
            keep = len(self.stack) - first + 1
            preds, logits = preds[:keep], logits[:keep]
        else:
            self.syncs += 1  # the verdict: one transfer per verification decision
        tokens = self.stack.tokens[first:]
        serials = self.stack.serials[first:]
        proposals = [self._proposal.get(s) for s in serials]
        verdict = self.selector.judge(tokens, proposals, logits, preds)
        key = "target" if stage == "target" else "verify"  # the timing-only judges' two stages
        if self._judge is not None and tokens:  # timing only: the verdict comes from hispec.evaluation.timing_only
            n_ok = self._judge(key, len(tokens))
            row = preds if preds is not None else logits.argmax(-1).tolist()
            verdict = replace(verdict, accepted=n_ok, token=row[n_ok] if n_ok < len(row) else None)
        self.decisions.append((key, len(tokens), verdict.accepted))
        for i, serial in enumerate(serials[: verdict.accepted + 1]):  # judged in order, up to the first rejection
            self.policy.observe(self._holder.get(serial, "draft"), stage, i < verdict.accepted)
        return verdict

    def _logits(self, hidden, j: int):
        """Level j's exit head on these hidden states (in that level's number format)."""
        level = self.levels[j]
        layer, costs = level.layer, self._lane_costs[level.precision]
        t0 = time.perf_counter()
        logits = self._models[level.precision].exit_logits(hidden, layer)
        if costs is not None:  # refine the cost model: this head, its attention step included
            attend = sum(seconds for at, _, seconds in self.stack.head_work if at == layer)
            costs.observe_head(layer, logits.shape[0] if logits.dim() > 1 else 1, time.perf_counter() - t0 + attend)
        self.stack.head_work.clear()
        return logits

    def _room(self) -> int:
        return self.config.max_new_tokens - (len(self.stack) - len(self.prompt_ids))

    def _finished(self) -> bool:
        if self.finish_reason is None and self._stop.is_set():
            self.finish_reason = "stopped"
        return self.finish_reason is not None

    def _place(self, token: int, state: TokenState, origin: str, dist=None) -> None:
        self._holder[self.stack.append(token)] = origin
        self._record(len(self.stack) - 1, state, origin, dist)

    def _record(self, pos: int, state: TokenState, origin: str, dist=None) -> None:
        """Text and proposal of the token placed at `pos`, and its first event."""
        serial = self.stack.serials[pos]
        self._texts[serial] = (self.detok.piece(self.stack.tokens[:pos], self.stack.tokens[pos]), origin)
        if dist is not None:
            self._proposal[serial] = dist
        self._emit(pos, state, origin)

    def _write(self, token: int, stage: str) -> None:
        """A token written by a verifier itself (the target's is committed at once)."""
        self._place(token, S.TARGET_WROTE, stage)
        self._check_finish(len(self.stack) - 1)

    def _commit(self, pos: int, state: TokenState) -> bool:
        self._emit(pos, state, "target")
        return self._check_finish(pos)

    def _check_finish(self, pos: int) -> bool:
        self.committed = pos + 1
        token = self.stack.tokens[pos]
        self._text += self._texts[self.stack.serials[pos]][0]
        if token in self.eos:
            self.finish_reason = "eos"
        elif self.committed - len(self.prompt_ids) >= self.config.max_new_tokens:
            self.finish_reason = "max_new_tokens"
        elif any(s in self._text[-(len(s) + 64) :] for s in self.config.stop_strings):
            self.finish_reason = "stop_string"
        return self.finish_reason is not None

    def _reject_from(self, pos: int, state: TokenState, stage: str) -> None:
        for p in range(pos, len(self.stack)):
            self._emit(p, state, stage)
        self.stack.truncate(pos)

    def _emit(self, pos: int, state: TokenState, stage: str) -> None:
        serial = self.stack.serials[pos]
        text, origin = self._texts[serial]
        self._out.append(TokenEvent(state, serial, pos - len(self.prompt_ids), self.stack.tokens[pos], text,
                                    origin, stage, self.round, self._clock()))

    def _drain(self, stage: str | None = None) -> Iterator[Event]:
        for p in self.stack.passes:
            costs = self._lane_costs[p.precision]
            if costs is not None and stage is None and len(p.serials) <= 16:
                costs.observe_pass(p.end - p.start, len(p.serials), p.seconds)
            yield PassEvent(stage or p.stage, p.start, p.end, p.serials, p.seconds, self.round)
        self.stack.passes.clear()
        yield from self._out
        self._out.clear()

    def _end_round(self) -> Iterator[Event]:
        yield from self._drain()
        yield RoundEvent(self.round, self.committed - len(self.prompt_ids),
                         len(self.stack) - self.committed, tuple(self.stack.cache_lengths()),
                         self._clock())
        self._waited += give_way()  # a shared model may run another job's round here (engine.gate)

    def _clock(self) -> float:
        """Seconds of this generation's own work so far (waits for a shared model's turn left out)."""
        return time.perf_counter() - self._t0 - self._waited

    def _done(self) -> DoneEvent:
        new = self.stack.tokens[len(self.prompt_ids) : self.committed] if self.stack else []
        settings = {k: v for k, v in asdict(self.config).items() if k != "stop_strings"}
        if self._judge is not None:
            settings["timing_only"] = self._judge.describe()
        settings.update(num_layers=self.ee.num_layers, dtype=str(self.ee.dtype).replace("torch.", ""),
                        device=str(self.ee.device))
        if self.ee.graphs is not None:
            settings["graphs"] = self.ee.graphs.backend
        self.stack = None  # free the caches now, not when the consumer lets go
        return DoneEvent(self.finish_reason or "stopped", tuple(new),
                         self.detok.decode(new, skip_special_tokens=True), len(self.prompt_ids),
                         self._clock(), settings, host_syncs=self.syncs)


def decode(ee: EarlyExitModel, prompt_ids: list[int], config: DecodeConfig, **kwargs) -> Iterator[Event]:
    """Convenience: the event stream of one generation."""
    return Decoder(ee, prompt_ids, config, **kwargs).events()
