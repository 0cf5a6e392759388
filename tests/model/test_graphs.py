"""Graph-replayed layer passes (hispec/graphs.py): the static-shape path gives the same events and
output as the eager one, static buffers are lent to one generation at a time, and graphs outlive a
generation. On CPU the "emulate" backend replays by calling the captured function; the CUDA
backend is checked in test_gpu.py."""

from dataclasses import replace

import pytest
import torch
from helpers import hf_greedy, tiny_model

from hispec.engine.config import preset
from hispec.engine.decoding import Decoder
from hispec.engine.events import DoneEvent, PassEvent, RoundEvent, TokenEvent
from hispec.errors import ConfigError
from hispec.model.early_exit import EarlyExitModel

SETTINGS = [
    preset("autoregressive", policy="fixed"),
    preset("layerskip", draft_layer=3, draft_len=4, policy="fixed"),
    preset("hispec", draft_layer=2, verify_layer=5, draft_len=3, verify_threshold=4, policy="fixed"),
    preset("hispec", draft_layer=1, verify_layer=2, draft_len=1, verify_threshold=1, policy="fixed"),
]


def _events(ee, prompt, config, defer=False):
    return list(Decoder(ee, prompt, config, defer_sync=defer).events())


def _shape(events):
    """What a run did, without timings: tokens and states, passes, per-round cache lengths."""
    out = []
    for ev in events:
        if isinstance(ev, TokenEvent):
            out.append(("token", ev.serial, ev.index, ev.token_id, ev.state, ev.origin, ev.stage, ev.round))
        elif isinstance(ev, PassEvent):
            out.append(("pass", ev.stage, ev.start, ev.end, ev.serials, ev.round))
        elif isinstance(ev, RoundEvent):
            out.append(("round", ev.round, ev.committed, ev.tentative, ev.cache_lengths))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("config", SETTINGS, ids=lambda c: f"{c.method}-{c.preset and c.preset.draft_layer}-{c.preset and c.preset.draft_len}")
def test_replayed_passes_give_the_same_events_and_greedy_output(arch, config):
    model = tiny_model(arch, seed=3)
    config = replace(config, max_new_tokens=40)
    prompt = [5, 17, 33, 2, 9, 41]
    ref = hf_greedy(model, prompt, 40)
    eager = _events(EarlyExitModel(model), prompt, config)
    ee = EarlyExitModel(model)
    ee.set_graphs("emulate")
    for defer in (False, True):
        replays = ee.graphs.replays
        graphed = _events(ee, prompt, config, defer)
        assert list(graphed[-1].token_ids) == ref
        if not defer:
            assert _shape(graphed) == _shape(eager)
        # Every pass but the prefill's (one per stage, no cache yet) was a replay.
        passes = [ev.stage for ev in graphed if isinstance(ev, PassEvent)]
        assert ee.graphs.replays - replays == len(passes) - passes.count("prefill") > 0
    assert graphed[-1].settings["graphs"] == "emulate"


def test_graphs_are_captured_once_and_reused_by_the_next_generation():
    ee = EarlyExitModel(tiny_model("llama", seed=3))
    ee.set_graphs("emulate")
    config = preset("hispec", draft_layer=2, verify_layer=5, draft_len=3, verify_threshold=4,
                          max_new_tokens=30, policy="fixed")
    first = _events(ee, [5, 17, 33], config)
    captured, storage = ee.graphs.captures, ee.graphs.storage
    assert captured == len(ee.graphs.graphs) > 0
    again = _events(ee, [5, 17, 33], config)
    assert ee.graphs.captures == captured and ee.graphs.storage is storage
    assert again[-1].token_ids == first[-1].token_ids
    assert not storage.in_use()  # given back when the generation ended


def test_a_second_generation_while_the_first_holds_the_buffers_runs_eagerly():
    model = tiny_model("llama", seed=4)
    ee = EarlyExitModel(model)
    ee.set_graphs("emulate")
    config = preset("layerskip", draft_layer=3, draft_len=2, max_new_tokens=24, policy="fixed")
    a_prompt, b_prompt = [7, 3, 19], [11, 40, 2, 8]
    a = Decoder(ee, a_prompt, config).events()
    a_events = [next(a) for _ in range(30)]  # A is mid-generation and holds the static buffers
    assert ee.graphs.storage.in_use()
    replays = ee.graphs.replays
    b_events = list(Decoder(ee, b_prompt, config).events())
    assert ee.graphs.replays == replays  # B ran on its own cache, eagerly
    a_events += list(a)
    assert list(b_events[-1].token_ids) == hf_greedy(model, b_prompt, 24)
    assert list(a_events[-1].token_ids) == hf_greedy(model, a_prompt, 24)
    assert ee.graphs.replays > replays


def test_stopping_early_gives_the_buffers_back():
    ee = EarlyExitModel(tiny_model("llama", seed=4))
    ee.set_graphs("emulate")
    gen = Decoder(ee, [7, 3, 19], preset("hispec", max_new_tokens=24, policy="fixed")).events()
    next(gen), next(gen)
    assert ee.graphs.storage.in_use()
    gen.close()  # a consumer that walks away (the app's Stop, a closed connection)
    assert not ee.graphs.storage.in_use()


def test_a_longer_generation_gets_bigger_buffers_and_fresh_graphs():
    model = tiny_model("llama", seed=4, max_position_embeddings=1024)
    ee = EarlyExitModel(model)
    ee.set_graphs("emulate")
    config = preset("layerskip", draft_layer=3, draft_len=2, policy="fixed")
    _events(ee, [7, 3, 19], replace(config, max_new_tokens=16))
    small, captures = ee.graphs.storage, ee.graphs.captures
    assert small.capacity == 256
    prompt = list(range(3, 90)) * 3  # 261 tokens: more than the first buffers hold
    done = _events(ee, prompt, replace(config, max_new_tokens=16))[-1]
    assert ee.graphs.storage is not small and ee.graphs.storage.capacity == 512
    # the old graphs were dropped: every graph held now was captured on the new buffers
    assert len(ee.graphs.graphs) == ee.graphs.captures - captures >= captures
    assert isinstance(done, DoneEvent) and list(done.token_ids) == hf_greedy(model, prompt, 16)


def test_released_cache_refuses_to_grow_on_lost_contents():
    ee = EarlyExitModel(tiny_model("llama", seed=4))
    ee.set_graphs("emulate")
    cache = ee.new_cache(32)
    assert cache.storage is ee.graphs.storage
    ee.run_layers(ee.embed([5, 6, 7]), 0, ee.num_layers, cache)
    cache.release()
    assert cache.lengths[0] == 3 and not ee.graphs.storage.in_use()
    with pytest.raises(RuntimeError, match="released"):
        ee.run_layers(ee.embed([8]), 0, 1, cache)


def test_graphs_need_the_lean_path_and_a_known_backend():
    ee = EarlyExitModel(tiny_model("llama", seed=4), lean=False)
    with pytest.raises(ConfigError, match="lean path"):
        ee.set_graphs("emulate")
    ee = EarlyExitModel(tiny_model("llama", seed=4))
    with pytest.raises(ConfigError, match="allowed: cuda, emulate"):
        ee.set_graphs("tape")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA device"):
            ee.set_graphs("cuda")
    ee.set_graphs("emulate")
    ee.set_lean(False)  # graphs were captured on the lean path: switching it off drops them
    assert ee.graphs is None


def test_a_failed_capture_falls_back_to_eager_passes_with_the_reason(monkeypatch):
    model = tiny_model("llama", seed=4)
    ee = EarlyExitModel(model)
    ee.set_graphs("emulate")

    def refuse(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(ee.graphs, "_capture", refuse)
    config = preset("hispec", draft_layer=2, verify_layer=5, draft_len=2, max_new_tokens=20, policy="fixed")
    done = _events(ee, [7, 3, 19], config)[-1]
    assert list(done.token_ids) == hf_greedy(model, [7, 3, 19], 20)
    assert ee.graphs.replays == 0 and "not permitted" in ee.graphs.disabled and "[0, 2) x 1" in ee.graphs.disabled


def test_generations_on_threads_share_the_buffers_one_at_a_time():
    import threading

    model = tiny_model("llama", seed=4)
    ee = EarlyExitModel(model)
    ee.set_graphs("emulate")
    prompts = [[7, 3, 19], [11, 40, 2, 8], [5, 5, 6], [9, 1, 30, 4, 4]]
    config = preset("hispec", draft_layer=2, verify_layer=5, draft_len=2, max_new_tokens=24, policy="fixed")
    results = {}

    def work(i):
        results[i] = list(_events(ee, prompts[i], config)[-1].token_ids)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == hf_greedy(model, p, 24) for i, p in enumerate(prompts))
    assert not ee.graphs.storage.in_use()


def test_a_generation_asking_for_buffers_while_others_are_made_never_replays_their_graphs(monkeypatch):
    """CI caught this once: while one thread made the static buffers, a second made its own and
    captured graphs on them; the first then replayed those graphs over buffers it did not hold.
    Here the first construction is held up on purpose, and the second thread asks meanwhile."""
    import threading
    import time

    import hispec.model.graphs as graphs_module

    model = tiny_model("llama", seed=4)
    ee = EarlyExitModel(model)
    ee.set_graphs("emulate")
    making = threading.Event()
    real = graphs_module.StaticKV

    class SlowFirst(real):
        def __init__(self, *args):
            if not making.is_set():
                making.set()
                time.sleep(0.3)
            super().__init__(*args)

    monkeypatch.setattr(graphs_module, "StaticKV", SlowFirst)
    prompts = [[7, 3, 19], [11, 40, 2, 8]]
    config = preset("hispec", draft_layer=2, verify_layer=5, draft_len=2, max_new_tokens=24, policy="fixed")
    results = {}

    def work(i):
        results[i] = list(_events(ee, prompts[i], config)[-1].token_ids)

    first = threading.Thread(target=work, args=(0,))
    first.start()
    assert making.wait(30)
    second = threading.Thread(target=work, args=(1,))
    second.start()
    first.join()
    second.join()
    assert [results[i] for i in range(2)] == [hf_greedy(model, p, 24) for p in prompts]
    assert ee.graphs.replays > 0 and not ee.graphs.storage.in_use()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_graph_passes_with_attention_exit_heads_equal_generate(device):
    """Trained-style attention exit heads (their own KV caches, a vocabulary slice) run eagerly
    between replayed layer passes; greedy output stays the target's, on CPU and on CUDA."""
    from hispec.model.heads import make_heads

    model = tiny_model("llama", seed=2).to(device)
    ee = EarlyExitModel(model)
    heads = make_heads(ee, [2, 5], head_type="attention", vocab_ids=torch.arange(3, 70))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for head in heads.values():
            head.attention.o.copy_(torch.randn(head.attention.o.shape, generator=g))
            head.to(device)
    ee.attach_exit_heads(heads)
    ee.set_graphs("cuda" if device == "cuda" else "emulate")
    prompt = [5, 17, 33, 2, 9, 41]
    x = torch.tensor([prompt], device=device)
    ref = model.generate(x, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(x))[0, len(prompt):].tolist()
    for config in (preset("layerskip", draft_layer=2, draft_len=3, policy="fixed"),
                   preset("hispec", draft_layer=2, verify_layer=5, draft_len=2, verify_threshold=3,
                                policy="fixed")):
        for defer in (False, True):
            done = _events(ee, prompt, replace(config, max_new_tokens=32), defer)[-1]
            assert list(done.token_ids) == ref, (config.method, defer)
    assert ee.graphs.replays > 0 and ee.graphs.disabled is None
