"""Generations holding one model together (serving.turns' seats, model.shared's board): where a model's passes
run on the batch-invariant native route, up to `seats` generations hold it at once and their passes share
calls; every other job holds it alone, and sharing jobs that arrive after it wait behind it (no one starves).
Each visitor's answer is what it gets alone; the timing pairs of a run give way while another job shares the
model (their figures must be the method's alone)."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

import pytest
from helpers import EOS, char_tokenizer, slow, tiny_model, tiny_server, wait_until

from hispec.engine.events import DoneEvent
from hispec.explain.why import sharing_words
from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats import q4_kernel
from hispec.model.formats.q4 import to_q4
from hispec.model.loading import LoadedModel
from hispec.model.shared import BOARD
from hispec.runs.record import from_json
from hispec.serving.answer import Generation
from hispec.serving.api import GenerateRequest
from hispec.serving.caller import Caller
from hispec.serving.jobs import Job
from hispec.serving.registry import ModelRegistry, seats
from hispec.serving.turns import Turns
from hispec.serving.updates import Output

REASON = q4_kernel.unavailable_reason()


def _job(i, who, shares=True) -> Job:
    return Job(i, f"s{i}", "generate" if shares else "compare", address=who, shares=shares)


def _take(turns, job) -> bool:
    """Whether `job` takes the model at once (its wait generator returns at the first step)."""
    waiting = turns.wait(job, float("inf"))
    try:
        next(waiting)
    except StopIteration as end:
        return bool(end.value)
    waiting.close()
    return False


def test_sharing_jobs_hold_the_model_together_up_to_its_seats():
    turns = Turns(seats=2)
    a, b, c = _job(1, "A"), _job(2, "B"), _job(3, "C")
    assert _take(turns, a) and _take(turns, b)
    assert turns.others_holding(a) and turns.others_holding(b)
    assert not _take(turns, c)  # the seats are full: it waits (and leaves, as a closed wait does)
    turns.release(a)
    assert _take(turns, c) and turns.others_holding(c)  # a free seat again: beside b


def test_a_job_that_does_not_share_holds_the_model_alone_and_nobody_overtakes_it():
    turns = Turns(seats=4)
    a, bench, late = _job(1, "A"), _job(2, "B", shares=False), _job(3, "C")
    assert _take(turns, a)
    waiting = turns.wait(bench, float("inf"))
    assert next(waiting) == 1  # it waits for the sharing holder to leave
    assert not _take(turns, late)  # a sharing job arriving after it does not slip into a free seat
    turns.release(a)
    with pytest.raises(StopIteration) as end:
        next(waiting)
    assert end.value.value is True and not turns.others_holding(bench)
    assert not _take(turns, _job(4, "D"))  # nobody beside a job that holds it alone


def test_seats_only_where_the_passes_are_shared_exactly(monkeypatch):
    float_model = tiny_model("llama", layers=2)
    plain = LoadedModel("t", float_model, char_tokenizer(), EarlyExitModel(float_model), "cpu", "float32", 0.0, "t")
    assert seats(plain) == 1  # torch's products: one generation at a time, as before
    if REASON is None:
        q4 = to_q4(tiny_model("llama", layers=2))
        native = LoadedModel("q", q4, char_tokenizer(), EarlyExitModel(q4), "cpu", "float32", 0.0, "t")
        assert seats(native) == 8
        monkeypatch.setenv("HISPEC_SEATS", "3")
        assert seats(native) == 3
        monkeypatch.setenv("HISPEC_SEATS", "many")
        assert seats(native) == 8  # an unreadable setting: the default, not a crash


def _q4_server():
    model = to_q4(tiny_model("llama", layers=8))
    model.generation_config.eos_token_id = EOS
    registry = ModelRegistry()
    registry.add("tiny", LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t"))
    return tiny_server(registry)


def _gen(prompt, max_new=24, baseline=0) -> dict:
    return {"prompt": prompt, "method": "hispec", "policy": "fixed", "draft_layer": 2, "verify_layer": 5,
            "draft_len": 2, "verify_threshold": 3, "max_new_tokens": max_new, "chat": True, "baseline": baseline}


def _answer(updates):
    items = [item for u in updates if isinstance(u, Output) for item in u.items]
    done = next(e for e in reversed(items) if isinstance(e, DoneEvent))
    vs = next((item["vs_plain"] for item in items if isinstance(item, dict) and "vs_plain" in item), None)
    return done.token_ids, vs


@pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
def test_visitors_at_once_share_passes_and_each_gets_its_solo_answer():
    server = _q4_server()
    prompts = ["hello there", "abc", "a longer prompt than the others", "xyz"]
    alone = [_answer(list(server.submit(Caller(f"solo-{i}", f"10.0.1.{i}"), GenerateRequest, _gen(p))))[0]
             for i, p in enumerate(prompts)]
    lm = server.registry.get("tiny")
    turns = server.registry.turns("tiny")
    held_together = []
    before = Counter(BOARD.counts.by_width)
    out: dict[int, list] = {}

    def visitor(i):
        out[i] = list(server.submit(Caller(f"tab-{i}", f"10.0.2.{i}"), GenerateRequest, _gen(prompts[i], baseline=1)))

    with slow(lm, 0.002):  # long enough that the four overlap
        threads = [threading.Thread(target=visitor, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(turns._holders) >= 2 or all(not t.is_alive() for t in threads))
        held_together.append(len(turns._holders))
        for t in threads:
            t.join(60)
    answers = [_answer(out[i]) for i in range(4)]
    assert [ids for ids, _ in answers] == alone
    assert held_together[0] >= 2  # several generations held the model at once
    shared = Counter(BOARD.counts.by_width) - before
    assert any(width > 1 for width in shared), shared  # and their passes shared calls
    # each run's timing pair gave way to the others sharing the model, or ran alone after they had finished
    for _, vs in answers:
        assert vs is not None and vs["runs"] + vs["yielded"] + vs["cut"] == 1
    assert any(vs["yielded"] for _, vs in answers)
    assert not turns.busy and server.jobs.of() == []
    # each record says what sharing did: the calls its passes shared, and the others' passes in them
    records = []
    for i in range(4):
        fold = Generation()
        for u in out[i]:
            if isinstance(u, Output):
                fold.add(u.items)
        records.append(fold.record())
    told = [r.shared for r in records if r.shared is not None]
    assert told and all(t.shared_calls >= 1 and t.others_passes >= t.shared_calls and t.most_members >= 2 for t in told)
    assert all(t.own_rows >= t.shared_calls and t.others_rows >= t.others_passes for t in told)  # rows, not only passes
    back = from_json(records[[r.shared is not None for r in records].index(True)].to_json())
    assert back.shared == told[0]
    # and what the machine wrote meanwhile: its own tokens among every visitor's, several at once for some
    paces = [r.machine for r in records]
    assert all(p is not None and p.own_tokens == len(r.token_ids) and p.tokens >= p.own_tokens
               for p, r in zip(paces, records))
    assert any(p.others and p.visitors >= 2 for p in paces), paces
    assert back.machine == paces[[r.shared is not None for r in records].index(True)]
    # the Why panel's sentence for it (tests/ui/test_sharing_views.py: the page's views of it)
    shown = next(r for r in records if r.machine.others and r.shared is not None)
    said = sharing_words(shown)
    assert said.startswith("This run shared the machine") and f"{shown.shared.others_rows} of their rows" in said
    assert sharing_words(dataclasses.replace(shown, shared=None, machine=None)) is None
