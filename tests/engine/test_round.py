"""A round as a value (engine.planning.round): its label, words and kind, read back from old traces, and
carried whole through the event stream."""

import pytest

from hispec.engine.events import PolicyEvent, event_from_dict, event_to_dict
from hispec.engine.levels import build_levels
from hispec.engine.planning.round import Round, event_kind, key_levels, kind_words

PRECISION = build_levels(("lookup", "full@q4"), 30)  # lookup, the 4-bit full model (verify), the full model
EXITS = build_levels(("lookup", 2, 4), 8)


def test_labels_words_and_kinds_of_each_shape():
    lookup, q4, top = PRECISION
    cases = [
        (Round.plain_step(top), "plain", "plain step (full model)", "plain"),
        (Round(lookup, top, 5), "lookup 5", "lookup copies 5", "lookup"),
        (Round(lookup, top, 5, (q4,), 1, 3), "lookup 5 -> full@q4 +3",
         "lookup copies 5, the 4-bit full model judges them and drafts 3 more", "lookup -> full@q4 (drafts on)"),
        (Round(lookup, top, 2, (q4,)), "lookup 2 -> full@q4", "lookup copies 2, the 4-bit full model judges them",
         "lookup -> full@q4"),
        (Round(q4, top, 12), "full@q4 x12", "the 4-bit full model drafts 12", "full@q4"),
    ]
    _, d, v, top8 = EXITS
    cases += [(Round(d, top8, 2, (v,), 4), "exit 2 x2 -> exit 4, full at 4",
               "exit 2 drafts 2, exit 4 judges, the full model runs at 4 pending", "exit 2 -> exit 4"),
              (Round(d, top8, 1, (v,), 1), "exit 2 x1 -> exit 4, full at 1",
               "exit 2 drafts 1, exit 4 judges", "exit 2 -> exit 4")]
    for r, label, words, key in cases:
        assert (r.label, r.words, r.kind.key) == (label, words, key)
        levels = PRECISION if r.top == top else EXITS
        assert Round.from_label(label, levels) == r  # the one reader of labels gives the round back
        assert r.kind.words == kind_words(key)


def test_a_round_travels_whole_through_the_json_trace_and_old_traces_are_read_by_their_label():
    lookup, q4, top = PRECISION
    r = Round(lookup, top, 4, (q4,), 1, 6)
    ev = PolicyEvent(3, r.label, r.count, r.verify_at, "why", {r.label: 2.0, "plain": 1.0}, 0.5, r, 2.0)
    back = event_from_dict(event_to_dict(ev))
    assert back == ev and back.plan == r and event_kind(back) == "lookup -> full@q4 (drafts on)"
    old = event_to_dict(ev)
    del old["plan"], old["expected_gain"], old["adaptive"]  # as a trace recorded before rounds were values
    legacy = event_from_dict(old)
    assert legacy.plan is None and event_kind(legacy) == "lookup -> full@q4 (drafts on)"
    assert Round.from_label(legacy.choice, PRECISION) == r


def test_a_label_naming_a_level_not_in_the_run_is_refused():
    with pytest.raises(ValueError, match="names a level not in"):
        Round.from_label("exit 3 x2", PRECISION)


def test_kind_keys_read_back_as_their_levels():
    assert key_levels("lookup -> full@q4 (drafts on)") == ("lookup", "full@q4")
    assert key_levels("exit 2 -> exit 4") == ("exit 2", "exit 4") and key_levels("plain") == ()
    assert kind_words("exit 4@q4") == "exit 4 in 4-bit → full model"
