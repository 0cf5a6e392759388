"""Losslessness where it is used: the adaptive policy under unseeded sampling, every method through
its bonus token, on a 48-token vocabulary.

test_sampling.py compares the 2nd and 3rd tokens of seeded runs (fixed rounds) on an 8-token
model with their exact joint. Here:

- the auto policy runs on [lookup, d, v, full] unseeded (a seed turns it into fixed rounds), its
  cost model timed on this machine (afresh every CALIBRATE_EVERY runs; every third run as if
  compute-bound), so that its plans (lookup copies, exit drafts, the hierarchy, plain steps) follow
  timings and the acceptance it measures; the test asserts that all four kinds were chosen, and
  losslessness must hold whatever it planned;
- every method (hispec, layerskip, lookup, [lookup, d, v] fixed, and auto) generates long enough
  that whole blocks are accepted and the target's bonus token is drawn; each test asserts from
  the event stream (a TARGET_WROTE right after an ACCEPTED token of the same round) that it was,
  in most runs;
- the model has V = 48 tokens and sharp-ish rows (the top token holds ~0.57 of the mass on average).

The check is the chain rule. For every generated position, transformers' own forward pass and
warpers give the target's P(x_i | prompt, x_<i). Each token falls in a cell, a function of its
prefix and itself: the lookup continuation (the token that followed the latest earlier occurrence
of the last 3, 2 or 1 tokens), exit v's favourite, exit d's favourite (each of these when it is not
the target's top token), else its rank under P: 0, 1, 2, 3-4, 5+. Bonus positions are counted
apart: whether a position gets the bonus draw is settled before it is drawn. In each group the
observed counts O minus the expected counts E (the sum of P(cell) over its positions) are a
martingale with predictable covariance C (the sum of diag(P) - P P^T), so (O - E)' C^-1 (O - E),
one cell left out, is chi-square with cells - 1 degrees of freedom for a lossless rule, whatever
the plans, the length or the number of bonus draws; it tests the joint distribution of all the
generated tokens through those cells. Wrong rules show as too many copies (trusting them), too many
top tokens (a greedy bonus), too many of an exit's favourites (resampling from p, top-prediction
matching), and so on: test_the_check_rejects_broken_rules shows each case failing on its own.
"""

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from unittest import mock

import pytest
import torch
from helpers import tiny_model
from test_sampling import _resample_from_p, _top_prediction_matching  # two classic bugs, shared
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

import hispec.engine.sampling as sampling
from hispec.engine.planning import policy
from hispec.engine.planning.costs import CostModel
from hispec.engine.config import DecodeConfig, preset
from hispec.engine.decoding import Decoder
from hispec.engine.events import DoneEvent, PolicyEvent, TokenEvent, TokenState
from hispec.engine.levels import FULL, LOOKUP
from hispec.engine.planning.round import Round
from hispec.model.early_exit import EarlyExitModel

V = 48
LAYERS, D, VER = 4, 1, 2  # the full model, the draft exit, the verify exit
MAX_NEW = 8
# A lossless rule fails a test with probability ALPHA: the runs are unseeded (auto) or seeded by
# run index (fixed), and either way the p-value of a lossless rule is uniform, so 1e-5 keeps a
# correct engine's failures far below 1e-3 per test. Uniform, checked: the same statistic on
# sequences sampled from the target itself (a random fifth of the positions counted as
# bonus positions) gave p < 0.1, 0.01, 0.001 in 298, 31, 1 of 3000 replicates of 500 runs of 8 tokens,
# and in 212, 19, 2 of 2000 replicates of 250 runs of 12 tokens (temperature 0.7). The broken rules
# give p < 1e-8 at the runs they get (most p < 1e-50): the margin to ALPHA is what keeps them failing.
ALPHA = 1e-5
RUNS = 500
CALIBRATE_EVERY = 50  # the auto policy's cost model is timed afresh this often (fresh timings, new plans)
PER_TOKEN = 1.0  # every third auto run: a pass costs in proportion to its tokens (compute-bound)
RANK_CELLS = (1, 2, 3, 5)  # rank buckets [0], [1], [2], [3, 5), [5, V)
# Held-out agreement of the exits as a trained manifest states it: the auto policy's acceptance
# priors, high enough that it tries every kind of plan (with the neutral 0.3 it mostly steps plainly).
PRIORS = {"evaluation": {"agreement": {str(D): {"trained": 0.8}, str(VER): {"trained": 0.85}}}}


def cycle_model(seed: int = 1):
    """A 4-layer Llama whose next token depends mostly on the current one: one-hot embeddings and
    an LM head that maps each token to a successor on a cycle of 4 (logit +6), a second favourite
    (+4.5) and noise; the decoder layers add a small context-dependent term (their output
    projections scaled by 0.1), so the exits agree with the full model often but not always (about
    0.8 of the mass at exit 1, 0.83 at exit 2). Its text runs round short cycles and the prompt
    repeats one, so lookup copies are proposed and often accepted."""
    hidden = 64
    model = tiny_model("llama", layers=LAYERS, vocab=V, seed=seed, initializer_range=0.2, hidden_size=hidden,
                       intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(V, generator=g)
    succ = torch.empty(V, dtype=torch.long)
    for i in range(0, V, 4):
        succ[perm[i : i + 4]] = perm[i : i + 4].roll(-1)
    logits = torch.randn(V, V, generator=g)
    logits[torch.arange(V), succ] += 6.0
    logits[torch.arange(V), torch.randint(0, V, (V,), generator=g)] += 4.5
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[torch.arange(V), torch.arange(V)] = hidden**0.5  # unit RMS
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, :V] = logits.T / hidden**0.5
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
    a = int(succ[0])
    prompt = [0, a, int(succ[a]), int(succ[succ[a]]), 0, a]  # once round the cycle of token 0, and on
    return model, prompt


@pytest.fixture(scope="module")
def lm():
    return cycle_model()


@pytest.fixture(autouse=True)
def every_plan_the_estimate_prefers(monkeypatch):
    """The auto policy drafts wherever its estimate beats a plain step at all (policy.MIN_GAIN off): the
    margin only trades speculative rounds for plain ones, and this check needs many speculative rounds
    to see a broken rule (with the margin, resampling from p under auto scored p = 1.3e-5 > ALPHA)."""
    monkeypatch.setattr(policy, "MIN_GAIN", 1.0)
    monkeypatch.setattr(policy, "LOOKUP_MIN_GAIN", 1.0)


def fresh_ee(model) -> EarlyExitModel:
    ee = EarlyExitModel(model)
    ee.exit_info = PRIORS
    return ee


# ---- generating -------------------------------------------------------------------------------
@dataclass
class Sample:
    tokens: list[int]
    bonus: set[int]  # generated positions whose token was the target's bonus draw
    plans: list[str] = field(default_factory=list)  # the auto policy's plan kinds, round by round
    policy: str = ""
    rounds: list[Round] = field(default_factory=list)  # the rounds as the policy planned them


def plan_kind(r: Round) -> str:
    if r.plain:
        return "plain"
    return "lookup" if r.proposer.kind == "lookup" else "hierarchy" if r.judges else "exit"


def compute_bound(measured: CostModel) -> CostModel:
    """These timings as on a machine where a pass costs more with every token in it (each extra
    token PER_TOKEN of the first's cost, as for a large model on a CPU): drafts pay only when they
    are accepted often, so plain steps win whenever the acceptance measured so far drops."""
    figures = measured.figures_ms()
    one = figures["layer"]["1"] / 1e3
    return CostModel.given({int(n): one * (1 + PER_TOKEN * (int(n) - 1)) for n in figures["layer"]},
                           {tuple(map(int, k.split("x"))): ms / 1e3 for k, ms in figures["head"].items()})


def generate(ee, prompt, config: DecodeConfig, runs: int, seeded: bool, costs=None) -> list[Sample]:
    """`costs(ee, r)`: sets the auto policy's cost models before run r (default: this machine's timings)."""
    samples, measured = [], None
    for r in range(runs):
        if costs is not None:
            costs(ee, r)
        elif config.policy == "auto":
            # This machine's timings, measured afresh every CALIBRATE_EVERY runs and refined by every
            # run since; every third run, as if compute-bound.
            if r % CALIBRATE_EVERY == 0:
                measured = CostModel()
                measured.calibrate(ee, (D, VER))
            ee.cost_model = compute_bound(measured) if r % 3 == 2 else measured
        decoder = Decoder(ee, prompt, replace(config, seed=r if seeded else None))
        sample, prev = Sample([], set(), policy=decoder.config.policy), None
        for ev in decoder.events():
            if isinstance(ev, TokenEvent):
                # The bonus: the target writes right after accepting the whole block, in its round.
                if (ev.state == TokenState.TARGET_WROTE and prev is not None and prev.state == TokenState.ACCEPTED
                        and prev.index == ev.index - 1 and prev.round == ev.round):
                    sample.bonus.add(ev.index)
                prev = ev
            elif isinstance(ev, PolicyEvent):
                sample.plans.append(plan_kind(ev.plan))
                sample.rounds.append(ev.plan)
            elif isinstance(ev, DoneEvent):
                sample.tokens = list(ev.token_ids)
        assert len(sample.tokens) == config.max_new_tokens
        samples.append(sample)
    return samples


# ---- the chain-rule chi-square ----------------------------------------------------------------
def target_rows(model, prompt, outs, config: DecodeConfig):
    """The target's warped P(x_i | prompt, x_<i) of every generated position ([runs, positions, V]),
    by transformers' forward pass and warpers, and the argmax of each exit's row there
    ({exit: [runs, positions]}, the final norm and LM head on the exit's hidden state)."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(config.temperature)]
                                  + ([TopKLogitsWarper(config.top_k)] if config.top_k else [])
                                  + ([TopPLogitsWarper(config.top_p)] if config.top_p < 1 else []))
    ids = torch.tensor([prompt + out for out in outs])
    rows = slice(len(prompt) - 1, -1)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        favourites = {e: model.lm_head(model.model.norm(out.hidden_states[e][:, rows])).argmax(-1) for e in (VER, D)}
    logits = out.logits[:, rows].double()
    R, N, _ = logits.shape
    return warpers(ids, logits.reshape(R * N, V)).softmax(-1).reshape(R, N, V), favourites


def lookup_continuation(seq: list[int]) -> int | None:
    """The token that followed the latest earlier occurrence of the last 3, 2 or 1 tokens."""
    for n in (3, 2, 1):
        tail = seq[len(seq) - n :]
        for p in range(len(seq) - 1, n - 1, -1):
            if seq[p - n : p] == tail:
                return seq[p]
    return None


_BUCKET = torch.bucketize(torch.arange(V), torch.tensor(RANK_CELLS), right=True)  # rank -> rank cell
CELLS = len(RANK_CELLS) + 1 + 3  # the rank cells, then: the lookup continuation, exit VER's top, exit D's top


def cells(P: torch.Tensor, specials: torch.Tensor) -> torch.Tensor:
    """Each token's cell at each position ([..., V]) under the rows P ([..., V]). `specials`
    ([..., 3]): the lookup continuation, exit VER's and exit D's favourite after the prefix (-1:
    none); each that is not the target's own top token, nor an earlier special, has a cell of its
    own, the others their rank's."""
    rank = torch.empty_like(P, dtype=torch.long).scatter_(-1, P.argsort(-1, descending=True),
                                                          torch.arange(V).expand(P.shape))
    cell_of = _BUCKET[rank]
    for j in range(specials.shape[-1]):
        token = specials[..., j : j + 1].clamp(min=0)
        own = (specials[..., j : j + 1] >= 0) & (rank.gather(-1, token) > 0) & (cell_of.gather(-1, token) <= len(RANK_CELLS))
        cell_of.scatter_(-1, token, torch.where(own, len(RANK_CELLS) + 1 + j, cell_of.gather(-1, token)))
    return cell_of


def chain_rule_p_of(P: torch.Tensor, tokens: torch.Tensor, bonus: torch.Tensor, specials: torch.Tensor) -> float:
    """The chi-square p-value of generated `tokens` ([runs, positions]) against the target's rows P
    ([runs, positions, V]), positions grouped by `bonus` ([runs, positions], bool), cells by
    `specials` (see `cells`)."""
    cell_of = cells(P, specials)
    observed = cell_of.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    mass = torch.zeros(*P.shape[:-1], CELLS, dtype=torch.float64).scatter_add_(-1, cell_of, P)
    stat, df = 0.0, 0
    for group in (bonus, ~bonus):
        m = mass[group]
        O = torch.bincount(observed[group], minlength=CELLS).double()
        E = m.sum(0)
        C = torch.diag(E) - m.T @ m  # the predictable covariance: sum of diag(P) - P P^T
        keep = E >= 5  # cells expected too rarely are left out (the statistic stays chi-square, on fewer cells)
        if keep.sum() < 2:
            continue
        d = (O - E)[keep][:-1]
        stat += float(d @ torch.linalg.solve(C[keep][:, keep][:-1, :-1], d))
        df += int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def specials_of(prompt, outs, favourites) -> torch.Tensor:
    copies = torch.tensor([[c if (c := lookup_continuation(prompt + out[:i])) is not None else -1
                            for i in range(len(out))] for out in outs])
    return torch.stack([copies, favourites[VER], favourites[D]], dim=-1)


def chain_rule_p(model, prompt, samples: list[Sample], config: DecodeConfig) -> float:
    outs = [s.tokens for s in samples]
    P, favourites = target_rows(model, prompt, outs, config)
    bonus = torch.tensor([[i in s.bonus for i in range(len(s.tokens))] for s in samples])
    return chain_rule_p_of(P, torch.tensor(outs), bonus, specials_of(prompt, outs, favourites))


# ---- the cases ----------------------------------------------------------------------------------
def auto(**kw):
    return preset("hispec", levels=("lookup", D, VER), policy="auto", max_new_tokens=MAX_NEW, **kw)


# name: (configuration, seeded, least share of runs with a bonus draw)
CASES = {
    "auto": (auto(temperature=1.0), False, 0.5),
    "auto-warped": (auto(temperature=0.8, top_k=12, top_p=0.95), False, 0.5),
    "hispec": (preset("hispec", draft_layer=D, verify_layer=VER, draft_len=2, verify_threshold=2,
                            policy="fixed", max_new_tokens=MAX_NEW, temperature=1.0), True, 0.5),
    "layerskip": (preset("layerskip", draft_layer=VER, draft_len=2, policy="fixed", max_new_tokens=MAX_NEW,
                               temperature=1.0), True, 0.5),
    # Two copies both accepted, then the bonus: sharper rows (temperature 0.7) and a longer run.
    "lookup": (preset("lookup", lookup_len=2, policy="fixed", max_new_tokens=12, temperature=0.7), True, 0.4),
    "lookup-d-v": (preset("hispec", levels=("lookup", D, VER), draft_len=2, verify_threshold=2, lookup_len=2,
                                policy="fixed", max_new_tokens=MAX_NEW, temperature=1.0), True, 0.5),
}


def check(lm, name, runs=RUNS):
    model, prompt = lm
    config, seeded, _ = CASES[name]
    samples = generate(fresh_ee(model), prompt, config, runs, seeded)
    return chain_rule_p(model, prompt, samples, config), samples


def bonus_share(samples) -> float:
    return sum(bool(s.bonus) for s in samples) / len(samples)


@pytest.mark.parametrize("name", ["auto", "auto-warped"])
def test_auto_policy_is_lossless_under_unseeded_sampling(lm, name):
    p, samples = check(lm, name)
    assert {s.policy for s in samples} == {"auto"}, "unseeded sampling must keep the adaptive policy"
    kinds = Counter(k for s in samples for k in s.plans)
    for kind in ("lookup", "exit", "hierarchy", "plain"):
        assert kinds[kind] >= RUNS // 50, f"the auto policy chose {kind} plans only {kinds[kind]} times: {kinds}"
    mixed = sum(len(set(s.plans)) > 1 for s in samples)  # ~60% here: plans change within a run
    assert mixed >= RUNS // 4, f"only {mixed} runs changed their kind of plan"
    share = bonus_share(samples)
    assert share >= CASES[name][2], f"the bonus token was drawn in only {share:.0%} of the runs"
    assert p > ALPHA, f"{name}: the generated tokens are not distributed as the target's (p={p:.2e}); plans {kinds}"


@pytest.mark.parametrize("name", ["hispec", "layerskip", "lookup", "lookup-d-v"])
def test_every_method_is_lossless_through_its_bonus_token(lm, name):
    p, samples = check(lm, name)
    share = bonus_share(samples)
    assert share >= CASES[name][2], f"the bonus token was drawn in only {share:.0%} of the runs"
    assert p > ALPHA, f"{name}: the generated tokens are not distributed as the target's (p={p:.2e})"


# ---- negative controls: the check must reject deliberately broken rules --------------------------
_judge = sampling.Selector.judge


def _trusting_copies(self, tokens, proposals, logits, preds=None):
    """Judge a copied token as if drawn from the judge's own distribution (always accepted)."""
    probs = sampling.warp(logits, self.params)
    proposals = [probs[i] if isinstance(q, sampling.PointMass) else q for i, q in enumerate(proposals)]
    return _judge(self, tokens, proposals, logits, preds)


def _greedy_bonus(self, tokens, proposals, logits, preds=None):
    """The bonus token is the target's argmax instead of a draw from its row."""
    verdict = _judge(self, tokens, proposals, logits, preds)
    if tokens and verdict.accepted == len(tokens) and verdict.token is not None:
        return replace(verdict, token=int(verdict.dist.argmax()))
    return verdict


def _bonus_from_the_last_row(self, tokens, proposals, logits, preds=None):
    """Off by one: the bonus is drawn from the row of the last pending token, not the row after it."""
    verdict = _judge(self, tokens, proposals, logits, preds)
    if tokens and verdict.accepted == len(tokens) and verdict.token is not None:
        row = verdict.dists[len(tokens) - 1]
        return replace(verdict, token=self._draw(row), dist=row)
    return verdict


def _over_accepting(self, tokens, proposals, logits, preds=None):
    """A biased acceptance: each pending token accepted with probability min(1, 4 p/q), not min(1, p/q)."""
    probs = sampling.warp(logits, self.params)
    shrunk = [(q.over(probs[i]) if isinstance(q, sampling.PointMass) else q) / 4 for i, q in enumerate(proposals)]
    return _judge(self, tokens, shrunk, logits, preds)


BROKEN = {
    "resample_from_p": (sampling, "residual", _resample_from_p),
    "top_prediction_matching": (sampling.Selector, "judge", _top_prediction_matching),
    "trusting_copies": (sampling.Selector, "judge", _trusting_copies),
    "greedy_bonus": (sampling.Selector, "judge", _greedy_bonus),
    "bonus_from_the_last_row": (sampling.Selector, "judge", _bonus_from_the_last_row),
    "over_accepting": (sampling.Selector, "judge", _over_accepting),
}


@contextmanager
def broken(rule: str):
    owner, name, fn = BROKEN[rule]
    with mock.patch.object(owner, name, fn):
        yield


# Each case's broken rules: the ones that bear on what the case runs (copies only where lookup
# proposes; resampling where a judged level's distribution differs from the target's) and a wrong
# bonus draw for every case. Resampling from p moves the distribution least (exit 2 agrees with the
# full model on ~0.83 of the mass): it gets RUNS runs, the others CONTROL_RUNS.
CONTROL_RUNS = RUNS // 2
CONTROLS = [
    ("auto", "resample_from_p"), ("auto", "top_prediction_matching"), ("auto", "trusting_copies"),
    ("auto", "greedy_bonus"), ("auto", "bonus_from_the_last_row"),
    ("auto-warped", "resample_from_p"), ("auto-warped", "greedy_bonus"),
    ("hispec", "resample_from_p"), ("hispec", "greedy_bonus"), ("hispec", "bonus_from_the_last_row"),
    ("layerskip", "resample_from_p"), ("layerskip", "greedy_bonus"),
    ("lookup", "trusting_copies"), ("lookup", "greedy_bonus"), ("lookup", "bonus_from_the_last_row"),
    ("lookup-d-v", "resample_from_p"), ("lookup-d-v", "trusting_copies"), ("lookup-d-v", "greedy_bonus"),
]


@pytest.mark.parametrize("name, rule", CONTROLS, ids=[f"{n}-{r}" for n, r in CONTROLS])
def test_the_check_rejects_broken_rules(lm, name, rule):
    with broken(rule):
        p, samples = check(lm, name, RUNS if rule == "resample_from_p" else CONTROL_RUNS)
    if "bonus" in rule:  # the broken bonus was drawn, not avoided
        assert bonus_share(samples) >= CASES[name][2]
    assert p < ALPHA, f"the check failed to notice the broken rule {rule} in {name} (p={p:.2e})"


# ---- the default's levels: lookup -> the 4-bit model -> the exact model, adaptive --------------------
# The default list is lookup -> full@a8 (int8 activations) since 2026-12-05, lookup -> full@q4 where a8
# cannot run: both are tested, the negative controls on the default's a8.
# The default run's most common plan copies with lookup, has the copy judged by the 4-bit model, which
# then drafts on in the same round ('lookup k -> full@a8 +m'), and lets the exact model judge what
# survived. Seeded, the auto policy runs fixed rounds (DecodeConfig.resolve), so these runs are unseeded,
# and its costs are given rather than timed (the 4-bit kernel's speed on a 64-wide model says nothing
# about the default model's): the 4-bit copy's passes cost a fraction of the exact model's and grow
# slowly with their tokens, as on the default model. Within a run, the plans follow the acceptance
# measured so far: mostly drafts-on rounds and the 4-bit model drafting alone, now and then a judged copy
# without drafts, a copy checked by the exact model alone or a plain step. The test asserts that the
# drafts-on plan ran in many runs, beside other plans in the same runs, and losslessness must hold
# whatever was planned.
def priors(fmt: str) -> dict:
    return {"policy_priors": {"exits": {f"full@{fmt}-target": 0.95}, "lookup": {f"lookup:{n}": 0.5 for n in (1, 2, 3)}}}


EXACT_MS = {1: 1.0, 2: 1.3, 4: 1.8, 8: 2.8, 16: 5.0}  # per layer, by tokens in the pass
Q4_MS = {1: 0.3, 2: 0.35, 4: 0.45, 8: 0.7, 16: 1.2}
Q4_RUNS = 400


def given_costs(per_layer_ms: dict, head_ms: float) -> CostModel:
    return CostModel.given({n: ms / 1e3 for n, ms in per_layer_ms.items()},
                           {(LAYERS, n): head_ms / 1e3 * (1 + n / 8) for n in per_layer_ms})


def q4_costs(fmt: str):
    def given(ee, r: int) -> None:
        """Fresh given costs before every run (a run refines them with what it times)."""
        ee.cost_model = given_costs(EXACT_MS, 0.5)
        ee.in_format(fmt).cost_model = given_costs(Q4_MS, 0.1)
    return given


@pytest.fixture(scope="module", params=["a8", "q4"])
def q4_lm(lm, request):
    return with_4bit_level(lm, request.param)


@pytest.fixture(scope="module")
def a8_lm(lm):
    return with_4bit_level(lm, "a8")


def with_4bit_level(lm, fmt: str):
    """The exact cycle model with its 4-bit copy as a level: 'a8' (the default's: int8 activations) or 'q4'."""
    q4 = pytest.importorskip("hispec.model.formats.q4")
    if q4.q4_kernel.unavailable_reason():
        pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}")
    from hispec.model.formats.q4_layer import a8_copy

    model, prompt = lm
    # the 4-bit copy of a fresh model with the same weights: once target_rows has asked the shared model for
    # hidden states, transformers' output recorders hook its layers, and the lean path (a8 runs only there)
    # refuses hooked layers
    fresh = cycle_model()[0]
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    cheap = q4.q4_copy(fresh)
    ee = EarlyExitModel(model)
    ee.add_format(fmt, lambda: EarlyExitModel(cheap) if fmt == "q4" else a8_copy(EarlyExitModel(cheap)))
    ee.exit_info = priors(fmt)
    assert ee.in_format(fmt).arithmetic == fmt
    return model, cheap, ee, prompt[:4] * 3 + prompt[:2], fmt  # round the cycle three times: long copies


def auto_on(fmt: str):
    return preset("hispec", levels=("lookup", f"full@{fmt}"), policy="auto", max_new_tokens=MAX_NEW, lookup_len=6,
                  temperature=1.0)


def drafts_on(r: Round, fmt: str) -> bool:
    """A lookup copy judged by the 4-bit model, which drafts on ('lookup k -> full@a8 +m')."""
    return (r.proposer.kind == LOOKUP and [(j.kind, j.precision) for j in r.judges] == [(FULL, fmt)]
            and r.then > 0)


def check_q4(q4_lm, runs=Q4_RUNS):
    model, cheap, ee, prompt, fmt = q4_lm
    samples = generate(ee, prompt, auto_on(fmt), runs, seeded=False, costs=q4_costs(fmt))
    outs = [s.tokens for s in samples]
    P, favourites = target_rows(model, prompt, outs, auto_on(fmt))
    # the 4-bit blocks' favourite after each prefix (float32 activations; a8's mostly agrees): a cell of its own
    with torch.no_grad():
        favourites[VER] = cheap(torch.tensor([prompt + out for out in outs])).logits[:, len(prompt) - 1 : -1].argmax(-1)
    bonus = torch.tensor([[i in s.bonus for i in range(len(s.tokens))] for s in samples])
    return chain_rule_p_of(P, torch.tensor(outs), bonus, specials_of(prompt, outs, favourites)), samples


def test_auto_policy_with_the_4bit_level_is_lossless_through_its_drafts_on_plans(q4_lm):
    fmt = q4_lm[-1]
    p, samples = check_q4(q4_lm)
    assert {s.policy for s in samples} == {"auto"}, "unseeded sampling must keep the adaptive policy"
    kinds = Counter(r.kind.key for s in samples for r in s.rounds)
    runs_drafting_on = sum(any(drafts_on(plan, fmt) for plan in s.rounds) for s in samples)
    assert runs_drafting_on >= Q4_RUNS // 4, f"the drafts-on plan ran in only {runs_drafting_on} runs: {kinds}"
    mixed = sum(any(drafts_on(plan, fmt) for plan in s.rounds) and not all(drafts_on(plan, fmt) for plan in s.rounds)
                for s in samples)
    assert mixed >= Q4_RUNS // 10, f"only {mixed} runs chose other plans beside drafting on: {kinds}"
    assert bonus_share(samples) >= 0.3, f"the bonus token was drawn in only {bonus_share(samples):.0%} of the runs"
    assert p > ALPHA, f"the generated tokens are not distributed as the target's (p={p:.2e}); plans {kinds}"


@pytest.mark.parametrize("rule", ["over_accepting", "trusting_copies", "greedy_bonus"])
def test_the_4bit_check_rejects_a_broken_sampler(a8_lm, rule):
    """The negative controls, on the default's list (lookup -> full@a8)."""
    fmt = a8_lm[-1]
    with broken(rule):
        p, samples = check_q4(a8_lm, Q4_RUNS // 2)
    assert any(drafts_on(plan, fmt) for s in samples for plan in s.rounds)
    assert p < ALPHA, f"the check failed to notice the broken rule {rule} with lookup -> full@{fmt} (p={p:.2e})"
