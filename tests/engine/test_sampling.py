"""Lossless sampling: hispec and layerskip sample exactly from the (warped) target distribution.

A tiny model with an 8-token vocabulary; the exact distribution of the 2nd and 3rd generated tokens
(the first speculative ones; the first token comes from the prefill) is computed from the full
model with transformers' own logits warpers, and compared with many seeded runs by a chi-square
test at a fixed significance level. The same test must reject deliberately broken rules.
"""

import itertools
import math
from collections import Counter

import pytest
import torch
from helpers import tiny_model
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

import hispec.engine.sampling as sampling
from hispec.engine.config import preset
from hispec.model.early_exit import EarlyExitModel
from hispec.errors import ConfigError
from hispec.runs.runner import run

ALPHA = 0.001
RUNS = 1600
V = 8
PROMPT = [3, 5, 1]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", layers=4, vocab=V, seed=1, initializer_range=0.1, hidden_size=32,
                      intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)


def hf_probs(model, prefixes, temperature, top_k, top_p):
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)]
                                  + ([TopKLogitsWarper(top_k)] if top_k else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
    ids = torch.tensor(prefixes)
    with torch.no_grad():
        logits = model(ids).logits[:, -1].float()
    return warpers(ids, logits).softmax(-1)


def exact_joint(model, temperature, top_k=0, top_p=1.0, prompt=PROMPT):
    """P(x2, x3) of the target with the warps, marginalised over x1."""
    p1 = hf_probs(model, [prompt], temperature, top_k, top_p)[0]
    p2 = hf_probs(model, [prompt + [a] for a in range(V)], temperature, top_k, top_p)
    p3 = hf_probs(model, [prompt + [a, b] for a in range(V) for b in range(V)], temperature, top_k, top_p)
    joint = torch.zeros(V, V)
    for a, b in itertools.product(range(V), range(V)):
        joint[b] += p1[a] * p2[a, b] * p3[a * V + b]
    return joint


def chi_square_p(counts: Counter, expected: torch.Tensor, n: int) -> float:
    """p-value of a chi-square goodness-of-fit test; cells expecting < 5 are pooled."""
    cells = sorted(itertools.product(range(V), range(V)), key=lambda c: float(expected[c]))
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for c in cells:
        e = float(expected[c]) * n
        if e < 5:
            pool_o, pool_e = pool_o + counts[c], pool_e + e
        else:
            obs.append(counts[c])
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    return float(1 - torch.special.gammainc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))


def sample_joint(model, method, **kw):
    ee = EarlyExitModel(model)
    layers = dict(draft_layer=1, verify_layer=2, draft_len=2, verify_threshold=2) if method == "hispec" \
        else dict(draft_layer=2, draft_len=3)
    counts = Counter()
    for seed in range(RUNS):
        r = run(ee, PROMPT, preset(method, max_new_tokens=3, seed=seed, **layers, **kw))
        counts[tuple(r.token_ids[1:3])] += 1
    return counts


CASES = [
    ("hispec", dict(temperature=1.0)),
    ("hispec", dict(temperature=0.7, top_k=5)),
    ("hispec", dict(temperature=1.3, top_p=0.8)),
    ("layerskip", dict(temperature=1.0)),
    ("layerskip", dict(temperature=0.8, top_k=4, top_p=0.9)),
]


@pytest.mark.parametrize("method, kw", CASES, ids=lambda c: str(c))
def test_speculative_sampling_matches_the_target(model, method, kw):
    expected = exact_joint(model, kw["temperature"], kw.get("top_k", 0), kw.get("top_p", 1.0))
    p = chi_square_p(sample_joint(model, method, **kw), expected, RUNS)
    assert p > ALPHA, f"{method} {kw}: sampled distribution differs from the target's (p={p:.2e})"


def test_autoregressive_sampling_matches_the_target(model):
    expected = exact_joint(model, 1.0)
    assert chi_square_p(sample_joint(model, "autoregressive", temperature=1.0), expected, RUNS) > ALPHA


def _resample_from_p(p, q):  # the classic bug: ignore what was already accepted
    return p


def _top_prediction_matching(self, tokens, proposals, logits, preds=None):
    """Top-prediction matching under sampling (what the paper's verifier does): accept a pending
    token iff it is the stage's argmax, else sample the stage's own token. Not lossless."""
    probs = sampling.warp(logits, self.params)
    for i, x in enumerate(tokens):
        if x != int(probs[i].argmax()):
            return sampling.Verdict(i, self._draw(probs[i]), probs[i], tuple(probs))
    if len(probs) > len(tokens):
        return sampling.Verdict(len(tokens), self._draw(probs[len(tokens)]), probs[len(tokens)], tuple(probs))
    return sampling.Verdict(len(tokens), None, None, tuple(probs))


@pytest.mark.parametrize("broken", ["resample_from_p", "top_prediction_matching"])
def test_the_test_rejects_broken_rules(model, monkeypatch, broken):
    if broken == "resample_from_p":
        monkeypatch.setattr(sampling, "residual", _resample_from_p)
    else:
        monkeypatch.setattr(sampling.Selector, "judge", _top_prediction_matching)
    expected = exact_joint(model, 1.0)
    p = chi_square_p(sample_joint(model, "hispec", temperature=1.0), expected, RUNS)
    assert p < ALPHA, f"the chi-square test failed to notice the broken rule {broken} (p={p:.3f})"


# The lookup level proposes deterministically (a point mass). A prompt that repeats itself gives
# it matches for most first tokens, so the 2nd and 3rd tokens are often copied proposals.
LOOKUP_PROMPT = [3, 5, 1, 3, 5, 1, 3, 5]
LOOKUP_LISTS = {"lookup": ("lookup",), "lookup+1+2": ("lookup", 1, 2)}


def sample_lookup_joint(model, levels, runs=RUNS, **kw):
    ee = EarlyExitModel(model)
    counts, copied = Counter(), 0
    for seed in range(runs):
        r = run(ee, LOOKUP_PROMPT, preset("hispec", levels=levels, max_new_tokens=3, seed=seed, draft_len=2,
                                                verify_threshold=2, lookup_len=3, **kw))
        counts[tuple(r.token_ids[1:3])] += 1
        copied += r.stats["drafted"] > 0
    return counts, copied


@pytest.mark.parametrize("name", list(LOOKUP_LISTS))
def test_lookup_level_sampling_matches_the_target(model, name):
    expected = exact_joint(model, 1.0, prompt=LOOKUP_PROMPT)
    counts, copied = sample_lookup_joint(model, LOOKUP_LISTS[name], temperature=1.0)
    assert copied > RUNS // 4, f"the lookup level proposed in only {copied} of {RUNS} runs: the test would be weak"
    p = chi_square_p(counts, expected, RUNS)
    assert p > ALPHA, f"{name}: sampled distribution differs from the target's (p={p:.2e})"


def test_the_test_rejects_a_lookup_rule_that_trusts_copies(model, monkeypatch):
    """Broken: judge a copied token as if it had been drawn from the judge's own distribution
    (p/q = 1, always accepted) instead of from a point mass on it."""
    judge = sampling.Selector.judge

    def trusting(self, tokens, proposals, logits, preds=None):
        probs = sampling.warp(logits, self.params)
        proposals = [probs[i] if isinstance(q, sampling.PointMass) else q for i, q in enumerate(proposals)]
        return judge(self, tokens, proposals, logits, preds)

    monkeypatch.setattr(sampling.Selector, "judge", trusting)
    expected = exact_joint(model, 1.0, prompt=LOOKUP_PROMPT)
    counts, _ = sample_lookup_joint(model, ("lookup",), temperature=1.0)
    p = chi_square_p(counts, expected, RUNS)
    assert p < ALPHA, f"the chi-square test failed to notice copies trusted blindly (p={p:.3f})"


@pytest.mark.parametrize("method", ["autoregressive", "layerskip", "hispec"])
def test_seeded_runs_are_reproducible(model, method):
    ee = EarlyExitModel(model)
    config = preset(method, max_new_tokens=20, temperature=1.0, seed=7)
    a, b = run(ee, PROMPT, config), run(ee, PROMPT, config)
    assert a.token_ids == b.token_ids
    assert [(t.serial, t.state) for t in a.trace] == [(t.serial, t.state) for t in b.trace]
    outs = {tuple(run(ee, PROMPT, preset(method, max_new_tokens=20, temperature=1.0, seed=s)).token_ids)
            for s in range(5)}
    assert len(outs) > 1


def test_temperature_zero_is_greedy(model):
    ee = EarlyExitModel(model)
    greedy = run(ee, PROMPT, preset("hispec", max_new_tokens=10, draft_layer=1, verify_layer=2))
    seeded = run(ee, PROMPT, preset("hispec", max_new_tokens=10, draft_layer=1, verify_layer=2,
                                          temperature=0.0, top_k=3, top_p=0.5, seed=1))
    assert greedy.token_ids == seeded.token_ids


def test_warp_matches_transformers_warpers():
    torch.manual_seed(0)
    logits = torch.randn(5, 50) * 3
    for t, k, p in [(1.0, 0, 1.0), (0.5, 7, 1.0), (1.5, 0, 0.6), (0.9, 10, 0.75), (1.0, 1, 1.0)]:
        ours = sampling.warp(logits, sampling.SamplingParams(t, k, p))
        torch.testing.assert_close(ours, hf_probs_from_logits(logits, t, k, p), rtol=1e-5, atol=1e-6)


def hf_probs_from_logits(logits, t, k, p):
    warpers = LogitsProcessorList([TemperatureLogitsWarper(t)] + ([TopKLogitsWarper(k)] if k else [])
                                  + ([TopPLogitsWarper(p)] if p < 1 else []))
    return warpers(torch.zeros(len(logits), 1, dtype=torch.long), logits.clone()).softmax(-1)


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=-1), "temperature must be 0 (greedy) or a positive number"),
    (dict(temperature=math.inf), "temperature must be 0"),
    (dict(top_k=-2), "top_k must be 0 (off) or a positive whole number"),
    (dict(top_p=0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(seed=-1), "seed must be a whole number >= 0"),
])
def test_bad_sampling_settings(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        preset("hispec", **kw).validate()


# Levels in a cheaper format of the same weights (levels are (depth, precision)): the 4-bit copy and its
# int8-activation view propose from their own distributions (the weights quantised: partial agreement),
# judged by the exact model, so the rule must still give the target's distribution.
PRECISION_LISTS = {"full@q4": ("full@q4",), "lookup+full@q4": ("lookup", "full@q4"),
                   "full@a8+full@q4": ("full@a8", "full@q4"), "lookup+full@a8": ("lookup", "full@a8")}


def sample_precision_joint(model, name):
    q4 = pytest.importorskip("hispec.model.formats.q4")
    if q4.q4_kernel.unavailable_reason():
        pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}")
    from hispec.model.formats import q4_layer

    ee = EarlyExitModel(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    ee.add_format("a8", lambda: q4_layer.a8_copy(ee.in_format("q4")))
    prompt = LOOKUP_PROMPT if name.startswith("lookup") else PROMPT
    counts, proposed, rejected = Counter(), 0, 0
    for seed in range(RUNS):
        r = run(ee, prompt, preset("hispec", levels=PRECISION_LISTS[name], max_new_tokens=3, seed=seed,
                                         draft_len=2, verify_threshold=2, lookup_len=3, temperature=1.0))
        counts[tuple(r.token_ids[1:3])] += 1
        proposed += r.stats["drafted"] > 0
        rejected += any(rate < 1 for rate in r.stats["acceptance"].values())
    assert proposed > RUNS // 2 and rejected > RUNS // 50, (proposed, rejected)  # the cheap level proposed, was judged
    return counts, exact_joint(model, 1.0, prompt=prompt)


@pytest.mark.parametrize("name", list(PRECISION_LISTS))
def test_precision_level_sampling_matches_the_target(model, name):
    counts, expected = sample_precision_joint(model, name)
    p = chi_square_p(counts, expected, RUNS)
    assert p > ALPHA, f"{name}: sampled distribution differs from the target's (p={p:.2e})"


def test_the_precision_test_rejects_a_broken_rule(model, monkeypatch):
    """The same check with the verifier's rule broken (top-prediction matching) must fail."""
    monkeypatch.setattr(sampling.Selector, "judge", _top_prediction_matching)
    counts, expected = sample_precision_joint(model, "full@q4")
    p = chi_square_p(counts, expected, RUNS)
    assert p < ALPHA, f"the chi-square test failed to notice the broken rule with a precision level (p={p:.3f})"
