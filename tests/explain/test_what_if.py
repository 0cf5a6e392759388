"""What a what-if replays of a finished run: its own levels, policy and lengths, or why it cannot."""

import pytest

from helpers import sketch_record as sketch

from hispec.errors import ConfigError
from hispec.explain.what_if import replay_of


def test_the_default_run_is_replayed_on_its_own_list_with_its_own_pairs():
    """Issue 49: What-if on the default run ran exit 2 -> exit 4 with fixed rounds, unnamed."""
    acceptance = {"verify->target": 1.0, "lookup->verify": 0.4, "lookup->target": 0.1}
    record = sketch(("lookup", "full@q4"), "auto", acceptance=acceptance)
    replay = replay_of(record)
    assert replay.request_fields() == {"method": "hispec", "levels": "lookup,full@q4", "lengths": None}
    assert replay.policy == "auto" and replay.words == "lookup → the 4-bit full model → the full model, adaptive"
    assert replay.sliders(record) == (0.4, 1.0)


def test_a_fixed_run_keeps_its_lengths_and_a_single_level_has_no_middle_slider():
    record = sketch((2, 4), "fixed", (2, 4), {"draft->verify": 0.6, "verify->target": 0.4})
    teaching = replay_of(record)
    assert teaching.request_fields()["lengths"] == "2,4" and "fixed (2 drafts a round, the full model at 4" in teaching.words
    assert teaching.sliders(record) == (0.6, 0.4)
    record = sketch((4,), "fixed", (3, 1), {"draft->target": 0.3})
    single = replay_of(record)
    assert single.dv_pair is None and single.sliders(record) == (None, 0.3)


@pytest.mark.parametrize("levels, words", [
    (None, "Generate once"),
    ((), "drafted nothing"),
    (("lookup", 2, 4), "cannot be modelled"),
])
def test_a_list_it_cannot_model_is_said_not_swapped_for_another(levels, words):
    with pytest.raises(ConfigError, match=words):
        replay_of(None if levels is None else sketch(levels, "auto"))


def test_a_what_if_runs_the_plan_the_sliders_vary_on_the_pairs_they_name():
    """Issue 58: a 90/90 what-if of the default run timed lookup copies of the chat template, not the 4-bit drafts
    the sliders named. Given the plan the sliders vary, it runs that plan in fixed rounds at its lengths: the
    4-bit model drafting 11, the full model judging them at the right slider's acceptance."""
    from hispec.engine.planning.round import Round

    record = sketch(("lookup", "full@a8"), "auto")
    lookup, a8, top = record.levels
    replay = replay_of(record, Round(a8, top, 11, (), 1))
    assert replay.request_fields() == {"method": "hispec", "levels": "full@a8", "lengths": "11,1"}
    assert replay.policy == "fixed" and replay.dv_pair is None and replay.vt_pair == (a8, top)
    assert replay.words.startswith("the 4-bit, int8-activation full model → the full model, fixed (11 drafts")
    copied = replay_of(record, Round(lookup, top, 5, (a8,), 8, then=3))  # a copy judged by the 4-bit model
    assert copied.request_fields()["levels"] == "lookup,full@a8" and copied.dv_pair == (lookup, a8)
    assert "without the judge's drafts after judging" in copied.words, "the deviation is said"
    assert replay_of(record, Round.plain_step(top)).policy == "auto", "no plan to vary: the run's own list"
    copy = replay_of(record, Round(lookup, top, 4, (), 1))  # a copy, judged by the full model alone
    assert "lookup copies its whole match a round" in copy.words and copy.dv_pair is None
