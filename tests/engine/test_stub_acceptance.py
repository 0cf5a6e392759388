"""Stub exits that force never / always / partial acceptance at each level.

The model's decoder layers add nothing to the residual stream, so every exit sees the current
token's embedding and the target's next token is a fixed table F[token]. Stub exit heads are
right (F), always wrong (F + 1) or wrong on some tokens. A model-free reference of the algorithm
predicts the exact event sequence, which the engine must reproduce.
"""

import pytest
import torch
from helpers import VOCAB, ee_of, identity_layer_model

from hispec.engine.config import preset
from hispec.engine.events import TokenEvent
from hispec.runs.runner import run


class StubHead(torch.nn.Module):
    """The final head, made wrong (argmax shifted by `shift`) wherever `wrong(pred)` holds."""

    def __init__(self, final_head, wrong, shift=1):
        super().__init__()
        self.final_head, self.wrong, self.shift = final_head, wrong, shift

    def forward(self, hidden):
        logits = self.final_head(hidden)
        bad = self.wrong(logits.argmax(-1))
        return torch.where(bad[..., None], logits.roll(self.shift, dims=-1), logits)


NEVER = lambda pred: torch.ones_like(pred, dtype=torch.bool)  # noqa: E731
ALWAYS = lambda pred: torch.zeros_like(pred, dtype=torch.bool)  # noqa: E731
PARTIAL = lambda pred: pred % 3 == 0  # noqa: E731
MODES = {"never": NEVER, "always": ALWAYS, "partial": PARTIAL}


@pytest.fixture(scope="module")
def model():
    return identity_layer_model(layers=6)


@pytest.fixture(scope="module")
def table(model):
    ee = ee_of(model)
    with torch.no_grad():
        hidden = ee.embed(list(range(VOCAB)))
        return ee.final_head(hidden).argmax(-1)[0].tolist()


def stage_fn(table, wrong, shift=1):
    def f(token):
        pred = table[token]
        return (pred + shift) % VOCAB if bool(wrong(torch.tensor(pred))) else pred
    return f


def reference(f_d, f_v, f_t, first, draft_len, threshold, budget, hierarchical=True):
    """The algorithm of DESIGN.md at token level: the expected (state, token) sequence."""
    out, committed, tentative = [("target_wrote", first)], [first], []
    while len(committed) < budget:
        seq = committed + tentative
        drafts, cur = [], seq[-1]
        for _ in range(min(draft_len, budget - len(seq))):
            cur = f_d(cur)
            drafts.append(cur)
            out.append(("drafted", cur))
        if hierarchical:
            prev, n_ok = seq[-1], 0
            for d in drafts:
                if f_v(prev) != d:
                    break
                out.append(("tentative", d))
                tentative.append(d)
                prev, n_ok = d, n_ok + 1
            if n_ok < len(drafts):
                out += [("verify_rejected", d) for d in drafts[n_ok:]]
                tentative.append(f_v(prev))
                out.append(("verify_wrote", tentative[-1]))
            if len(tentative) < threshold and len(committed) + len(tentative) < budget:
                continue
        else:
            tentative = drafts
        prev = committed[-1]
        for k, t in enumerate(tentative):
            if f_t(prev) != t:
                out += [("target_rejected", x) for x in tentative[k:]]
                break
            out.append(("accepted", t))
            committed.append(t)
            prev = t
        if len(committed) < budget:
            committed.append(f_t(prev))
            out.append(("target_wrote", committed[-1]))
        tentative = []
    return out, committed


def states(result_events):
    return [(ev.state.value, ev.token_id) for ev in result_events if isinstance(ev, TokenEvent)]


@pytest.mark.parametrize("draft_mode", MODES)
@pytest.mark.parametrize("verify_mode", MODES)
def test_hispec_event_sequence(model, table, draft_mode, verify_mode):
    ee = ee_of(model)
    d, v = 2, 4
    ee.exit_heads = {d: StubHead(ee.final_head, MODES[draft_mode]), v: StubHead(ee.final_head, MODES[verify_mode], shift=2)}
    events = []
    prompt = [7, 11, 13]
    config = preset("hispec", d, v, draft_len=2, verify_threshold=4, max_new_tokens=23, policy="fixed")
    result = run(ee, prompt, config, on_event=events.append)
    f_t = stage_fn(table, ALWAYS)
    want, committed = reference(stage_fn(table, MODES[draft_mode]), stage_fn(table, MODES[verify_mode], 2), f_t,
                                table[prompt[-1]], 2, 4, 23)
    assert states(events) == want
    assert result.token_ids == committed
    acc = result.stats["acceptance"]
    if draft_mode == "always" and verify_mode == "always":
        assert acc == {"draft->verify": 1.0, "verify->target": 1.0}
    if draft_mode == "never":
        assert acc["draft->verify"] == 0.0
    if verify_mode == "never":  # the verifier's wrong tokens differ from the draft's: all rejected
        assert acc["draft->verify"] in (0.0, None) and acc["verify->target"] == 0.0
    if verify_mode == "always":
        assert acc["verify->target"] == 1.0


def test_hispec_always_commits_a_full_block_per_full_pass(model, table):
    ee = ee_of(model)
    result = run(ee, [7], preset("hispec", 2, 4, draft_len=2, verify_threshold=4, max_new_tokens=21,
                                       policy="fixed"))
    # 1 token from prefill, then 4 tentative + 1 bonus per full verification.
    assert result.stats["full_passes"] == 4
    assert result.stats["tokens_per_full_pass"] == 5.0
    assert result.stats["layer_tokens"]["wasted"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_layerskip_event_sequence(model, table, mode):
    ee = ee_of(model)
    ee.exit_heads = {3: StubHead(ee.final_head, MODES[mode])}
    events = []
    result = run(ee, [5, 6], preset("layerskip", draft_layer=3, draft_len=3, max_new_tokens=17, policy="fixed"),
                 on_event=events.append)
    f_t = stage_fn(table, ALWAYS)
    want, committed = reference(stage_fn(table, MODES[mode]), None, f_t, table[6], 3, None, 17, hierarchical=False)
    assert states(events) == want
    assert result.token_ids == committed
    rate = result.stats["acceptance"]["draft->target"]
    assert rate == {"never": 0.0, "always": 1.0}.get(mode, rate)
    if mode == "partial":
        assert 0.0 < rate < 1.0


def test_trained_head_never_used_as_target(model, table):
    # Even a wrong head registered at the last layer index must not change the target.
    ee = ee_of(model)
    ee.exit_heads = {6: StubHead(ee.final_head, NEVER)}
    result = run(ee, [7], preset("autoregressive", max_new_tokens=5))
    f_t = stage_fn(table, ALWAYS)
    expected = [table[7]]
    for _ in range(4):
        expected.append(f_t(expected[-1]))
    assert result.token_ids == expected
