"""Every stopping rule of a real generator, also inside draft blocks and tentative buffers."""

import threading

import pytest
from helpers import EOS, ee_of, hf_greedy, identity_layer_model

from hispec.engine.config import preset
from hispec.engine.events import TokenEvent, TokenState
from hispec.runs.runner import run
from hispec.text import Detokenizer

METHODS = [preset("autoregressive"), preset("layerskip", draft_layer=2, draft_len=4, policy="fixed"),
           preset("hispec", draft_layer=1, verify_layer=3, draft_len=3, verify_threshold=5)]


def with_(config, **kw):
    from dataclasses import replace
    return replace(config, **kw)


@pytest.mark.parametrize("config", METHODS, ids=lambda c: c.method)
@pytest.mark.parametrize("budget", [0, 1, 2, 5, 13])
def test_budget_is_exact(tiny_llama, config, budget):
    r = run(ee_of(tiny_llama), [5, 6, 7], with_(config, max_new_tokens=budget))
    assert len(r.token_ids) == budget
    assert r.token_ids == hf_greedy(tiny_llama, [5, 6, 7], budget) if budget else True
    assert r.stats["finish_reason"] == "max_new_tokens"


@pytest.fixture(scope="module")
def eos_chain():
    """The identity model and a start token whose greedy chain reaches EOS after a few steps."""
    model = identity_layer_model(layers=6)
    ee = ee_of(model)
    table = ee.final_head(ee.embed(list(range(100)))).argmax(-1)[0].tolist()
    for start in range(3, 100):
        chain, t = [], start
        for _ in range(12):
            t = table[t]
            chain.append(t)
            if t == EOS:
                break
        if chain[-1] == EOS and 4 <= len(chain) <= 12:
            return model, start, chain
    pytest.skip("no EOS chain in this random table")


@pytest.mark.parametrize("config", METHODS, ids=lambda c: c.method)
def test_eos_inside_a_block_ends_generation(eos_chain, config):
    model, start, chain = eos_chain
    events = []
    r = run(ee_of(model), [start], with_(config, max_new_tokens=40), eos_ids=[EOS], on_event=events.append)
    assert r.token_ids == chain
    assert r.stats["finish_reason"] == "eos"
    # nothing is ever drafted past an EOS token
    drafted = [ev.token_id for ev in events if isinstance(ev, TokenEvent) and ev.state is TokenState.DRAFTED]
    assert drafted.count(EOS) <= 1


@pytest.mark.parametrize("config", METHODS, ids=lambda c: c.method)
def test_stop_string(tiny_llama, config):
    full = run(ee_of(tiny_llama), [5, 6, 7], with_(config, max_new_tokens=20))
    target = full.token_ids[6]
    stop = f"<{target}>"
    r = run(ee_of(tiny_llama), [5, 6, 7], with_(config, max_new_tokens=20, stop_strings=(stop,)),
            detok=Detokenizer())
    first = full.token_ids.index(target)
    assert r.token_ids == full.token_ids[: first + 1]
    assert r.stats["finish_reason"] == "stop_string"


@pytest.mark.parametrize("config", METHODS, ids=lambda c: c.method)
def test_stop_event_ends_generation(tiny_llama, config):
    stop = threading.Event()
    seen = []

    def on_event(ev):
        seen.append(ev)
        if isinstance(ev, TokenEvent) and ev.index >= 4:
            stop.set()

    r = run(ee_of(tiny_llama), [5, 6, 7], with_(config, max_new_tokens=100), on_event=on_event, stop=stop)
    assert r.stats["finish_reason"] == "stopped"
    assert len(r.token_ids) < 20
    assert r.token_ids == hf_greedy(tiny_llama, [5, 6, 7], 100)[: len(r.token_ids)]


def test_context_limit_is_checked_before_running(tiny_llama):
    from hispec.errors import ConfigError

    with pytest.raises(ConfigError, match=r"prompt \(250 tokens\) \+ max_new_tokens \(7\) exceeds"):
        run(ee_of(tiny_llama), [5] * 250, preset("hispec", max_new_tokens=7))
    r = run(ee_of(tiny_llama), [5] * 250, preset("hispec", max_new_tokens=6))
    assert len(r.token_ids) == 6


def test_stop_discards_pending_tokens(tiny_llama):
    """Drafts and tentative tokens pending when Stop lands end up discarded, never shown as live."""
    stop = threading.Event()
    events = []

    def on_event(ev):
        events.append(ev)
        if isinstance(ev, TokenEvent) and ev.state is TokenState.DRAFTED and ev.index >= 6:
            stop.set()  # lands in the middle of a draft block

    config = preset("hispec", draft_layer=1, verify_layer=3, draft_len=3, verify_threshold=8, max_new_tokens=60,
                          policy="fixed")
    r = run(ee_of(tiny_llama), [5, 6, 7], config, on_event=on_event, stop=stop)
    final = {t.serial: t.state for t in r.trace}
    assert not {TokenState.DRAFTED, TokenState.TENTATIVE, TokenState.VERIFY_WROTE} & set(final.values())
    assert TokenState.DISCARDED in final.values()
    assert r.token_ids == hf_greedy(tiny_llama, [5, 6, 7], 60)[: len(r.token_ids)]
