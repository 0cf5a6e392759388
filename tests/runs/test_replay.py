"""Replaying a finished generation round by round from its events, on real tiny-model runs."""

import itertools
import json
import math
import threading

import pytest
from helpers import ee_of

from hispec.engine.config import preset
from hispec.engine.decoding import decode
from hispec.engine.events import DoneEvent, PassEvent, RoundEvent, TokenEvent, event_from_dict, event_to_dict
from hispec.engine.events import TokenState as S
from hispec.runs.record import build, from_json
from hispec.runs.replay import replay, rounds_of


def replay_from_dicts(dicts):
    """The replay of a JSON trace, read as every recorded run is (runs.record.from_json), and of the record's
    own JSON too (RunRecord.to_json)."""
    rounds = rounds_of(from_json({"events": dicts}))
    again = rounds_of(from_json(json.loads(json.dumps(build(from_json({"events": dicts}).events, {}).to_json()))))
    assert again == rounds
    return rounds

PROMPT = [3, 14, 15, 92, 65, 3, 14, 15]  # repeats itself: the lookup level finds matches
CASES = {
    "hispec": preset("hispec", draft_layer=2, verify_layer=4, draft_len=2, verify_threshold=4,
                           max_new_tokens=20, policy="fixed"),
    "layerskip": preset("layerskip", draft_layer=2, draft_len=3, max_new_tokens=16, policy="fixed"),
    "autoregressive": preset("autoregressive", max_new_tokens=8),
    "lookup-2-4": preset("hispec", levels=("lookup", 2, 4), draft_len=2, verify_threshold=3,
                               max_new_tokens=16, policy="fixed"),
}


@pytest.fixture(scope="module", params=list(CASES))
def generation(request, tiny_llama):
    events = list(decode(ee_of(tiny_llama), PROMPT, CASES[request.param]))
    return request.param, events, replay(events)


def _done(events) -> DoneEvent:
    return next(ev for ev in events if isinstance(ev, DoneEvent))


def test_one_entry_per_round_prefill_included(generation):
    _, events, rounds = generation
    round_events = [ev for ev in events if isinstance(ev, RoundEvent)]
    assert len(rounds) == len(round_events) + 1
    assert [r["round"] for r in rounds] == list(range(len(rounds)))
    assert [s["stage"] for s in rounds[0]["steps"]] == ["prefill"]
    assert rounds[0]["plan"] is None
    for r, ev in zip(rounds[1:], round_events, strict=True):
        assert r["complete"]
        assert r["committed_total"] == ev.committed
        assert r["tentative"] == ev.tentative


def test_committed_tokens_are_the_output_in_order(generation):
    _, events, rounds = generation
    committed = [t["token_id"] for r in rounds for s in r["steps"] for t in s["committed"]]
    assert tuple(committed) == _done(events).token_ids
    texts = "".join(t["text"] for r in rounds for s in r["steps"] for t in s["committed"])
    assert texts == "".join(f"<{i}>" for i in committed)  # the tokenizer-less detokenizer


def test_steps_hold_the_passes_in_order(generation):
    _, events, rounds = generation
    passes = [ev for ev in events if isinstance(ev, PassEvent)]
    flat = [p for r in rounds for s in r["steps"] for p in s["passes"]]
    assert [(p["stage"], p["layers"], p["tokens"], p["seconds"]) for p in flat] == [
        (ev.stage, [ev.start, ev.end], len(ev.serials), ev.seconds) for ev in passes]
    for r in rounds:
        for s in r["steps"]:
            if s["passes"]:
                starts, ends = [p["layers"][0] for p in s["passes"]], [p["layers"][1] for p in s["passes"]]
                assert s["layers"] == [min(starts), max(ends)]
                assert math.isclose(s["seconds"], sum(p["seconds"] for p in s["passes"]))
            else:
                assert s["stage"] in ("lookup", "stop") and s["layers"] is None and s["seconds"] == 0
        assert math.isclose(r["seconds"], sum(s["seconds"] for s in r["steps"]))
    assert math.isclose(sum(r["seconds"] for r in rounds), sum(ev.seconds for ev in passes))


def test_stages_follow_the_method(generation):
    name, events, rounds = generation
    L = _done(events).settings["num_layers"]
    for r in rounds[1:]:
        stages = [s["stage"] for s in r["steps"]]
        if name == "autoregressive":
            assert stages == ["target"] and r["steps"][0]["layers"] == [0, L]
            assert len(r["steps"][0]["wrote"]) == 1
        elif name == "layerskip":
            assert stages == ["draft", "target"]
            draft = r["steps"][0]
            assert draft["exit"] == 2 and draft["layers"] == [0, 2] and draft["title"] == "Draft at exit 2"
            assert draft["runs"] == len(draft["proposed"]) == len(draft["passes"])
            assert all(p["tokens"] == 1 for p in draft["passes"])
        elif name == "hispec":
            assert stages[:2] == ["draft", "verify"] and stages[2:] in ([], ["target"])
            assert r["steps"][1]["title"] == "Intermediate verify at exit 4"
            assert r["steps"][1]["passes"][-1]["layers"] == [2, 4]
        survivors = len(r["steps"][0]["proposed"])
        for s in r["steps"]:
            if s["stage"] == "verify":  # each judge decides every token of the round still pending
                assert len(s["kept"]) + len(s["rejected"]) == survivors
                survivors = len(s["kept"]) + len(s["wrote"])
            if s["stage"] == "target":
                assert s["passes"][-1]["stage"] == "target" and s["passes"][-1]["layers"][1] == L
    if name == "lookup-2-4":
        assert any(s["stage"] == "lookup" for r in rounds for s in r["steps"])


def test_cache_lengths_chain_and_match_the_engine(generation):
    _, events, rounds = generation
    done = _done(events)
    L = done.settings["num_layers"]
    assert rounds[0]["cache_before"] == [0] * L
    assert rounds[0]["cache_after"] == [done.prompt_len] * L
    assert rounds[1]["cache_before"] == [done.prompt_len] * L
    for a, b in itertools.pairwise(rounds):
        assert b["cache_before"] == a["cache_after"]
    for r, ev in zip(rounds[1:], [ev for ev in events if isinstance(ev, RoundEvent)], strict=True):
        assert r["cache_after"] == list(ev.cache_lengths)


def test_without_round_events_the_same_caches_are_recomputed(generation):
    """The pass-to-stage matching is right: replaying the passes and cuts stage by stage gives
    the engine's cache lengths and pending counts."""
    _, events, rounds = generation
    bare = replay([ev for ev in events if not isinstance(ev, RoundEvent)])
    assert [r["cache_after"] for r in bare] == [r["cache_after"] for r in rounds]
    assert [r["tentative"] for r in bare] == [r["tentative"] for r in rounds]
    assert [r["committed_total"] for r in bare] == [r["committed_total"] for r in rounds]


def test_json_round_trip(generation):
    _, events, rounds = generation
    dicts = json.loads(json.dumps([event_to_dict(ev) for ev in events]))
    back = [event_from_dict(d) for d in dicts]
    assert back == events  # the DoneEvent too: its settings' tuples (levels) come back as tuples
    assert replay_from_dicts(dicts) == rounds
    assert json.loads(json.dumps(rounds)) == rounds  # JSON-ready


def test_auto_policy_plans_are_attached(tiny_llama):
    config = preset("hispec", draft_layer=2, verify_layer=4, policy="auto", max_new_tokens=10)
    events = list(decode(ee_of(tiny_llama), PROMPT, config))
    rounds = replay(events)
    assert all(r["plan"] and r["plan"]["choice"] for r in rounds[1:])
    assert tuple(t["token_id"] for r in rounds for s in r["steps"] for t in s["committed"]) == _done(events).token_ids
    bare = replay([ev for ev in events if not isinstance(ev, RoundEvent)])
    assert [r["cache_after"] for r in bare] == [r["cache_after"] for r in rounds]


def test_a_stopped_generation_replays(tiny_llama):
    stop = threading.Event()
    events = []
    config = preset("hispec", draft_layer=1, verify_layer=3, draft_len=3, verify_threshold=8,
                          max_new_tokens=60, policy="fixed")
    for ev in decode(ee_of(tiny_llama), [5, 6, 7], config, stop=stop):
        events.append(ev)
        if isinstance(ev, TokenEvent) and ev.state is S.DRAFTED and ev.index >= 6:
            stop.set()  # lands inside a draft block, with tentative tokens pending
    done = _done(events)
    assert done.reason == "stopped"
    rounds = replay(events)
    last = rounds[-1]
    assert not last["complete"]
    assert len(rounds) == sum(isinstance(ev, RoundEvent) for ev in events) + 2
    assert last["steps"][-1]["stage"] == "stop" and last["steps"][-1]["discarded"]
    assert last["tentative"] == 0
    assert all(n <= done.prompt_len + last["committed_total"] for n in last["cache_after"])
    assert tuple(t["token_id"] for r in rounds for s in r["steps"] for t in s["committed"]) == done.token_ids
    dicts = json.loads(json.dumps([event_to_dict(ev) for ev in events]))
    assert replay_from_dicts(dicts) == rounds


def test_nothing_to_replay(tiny_llama):
    assert replay([]) == []
    events = list(decode(ee_of(tiny_llama), PROMPT, preset("hispec", max_new_tokens=0)))
    assert replay(events) == []
    one = replay(list(decode(ee_of(tiny_llama), PROMPT, preset("hispec", max_new_tokens=1))))
    assert len(one) == 1 and len(one[0]["steps"][0]["committed"]) == 1


def test_a_level_that_judged_then_drafted_on_is_listed_in_that_order(tiny_llama):
    """A round "lookup 5 -> exit 4 +2": exit 4 judges lookup's copy first, then drafts on where the copy
    ended; the replay lists its verdicts before its drafts (issue 49: the step-through listed the drafting
    first, and gave the judging pass to the drafting step)."""
    from dataclasses import replace

    from hispec.engine.decoding import Decoder
    from hispec.engine.planning.policy import FixedPolicy

    class DraftsOn(FixedPolicy):
        def plan(self, room, pending, match):
            plan = super().plan(room, pending, match)
            copies = plan.round.proposer.kind == "lookup"
            return replace(plan, round=replace(plan.round, then=2)) if copies else plan

    config = preset("hispec", levels=("lookup", 4), draft_len=2, verify_threshold=1, max_new_tokens=16,
                    policy="fixed")
    decoder = Decoder(ee_of(tiny_llama), PROMPT * 2, config)
    decoder.policy = decoder.judge.policy = DraftsOn(decoder.levels, (2, 1), decoder.config.lookup_len)
    rounds = replay(list(decoder.events()))
    on = [r for r in rounds if any(s["stage"] == "lookup" for s in r["steps"])
          and any(s["stage"] == "draft" for s in r["steps"]) and any(s["stage"] == "verify" for s in r["steps"])]
    assert on, [[s["stage"] for s in r["steps"]] for r in rounds]
    for r in on:
        stages = [(s["stage"], s["level"]) for s in r["steps"]]
        assert stages.index(("verify", "verify")) < stages.index(("draft", "verify")), stages
        judged = next(s for s in r["steps"] if s["stage"] == "verify")
        drafted = next(s for s in r["steps"] if s["stage"] == "draft")
        # the judging pass ran over the copy (and one more); each draft is a pass of its own
        assert judged["passes"] and judged["passes"][-1]["tokens"] >= 1
        assert drafted["runs"] == len(drafted["proposed"]) >= 1
