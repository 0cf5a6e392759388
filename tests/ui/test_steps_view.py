"""One replayed round as numbered steps: labels, chips, escaping and the KV cache table."""

import re

from hispec.engine.events import DoneEvent, PassEvent, RoundEvent, TokenEvent
from hispec.engine.events import TokenState as S
from hispec.engine.levels import build_levels
from hispec.engine.planning.round import Round
from hispec.runs.replay import replay
from ui.render import COLORS
from ui.steps_view import cache_table_html, round_html, round_label

SETTINGS = (1, 2)  # exits 1 and 2 of a 4-layer model, as a run records its list (RunRecord.spec)

EVIL = "<script>alert(1)</script>"


def _tok(state, serial, index, token_id, text, origin, stage, r):
    return TokenEvent(state, serial, index, token_id, text, origin, stage, r, 0.001 * serial)


def events():
    """A hand-built HiSpec run on 4 layers (draft exit 1, verify exit 2), prompt of 3 tokens:
    the prefill, a round that commits, a round stopped with two tentative tokens pending."""
    return [
        PassEvent("prefill", 0, 4, (0, 1, 2), 0.004, 0),
        _tok(S.TARGET_WROTE, 3, 0, 10, EVIL, "target", "target", 0),
        # round 1: draft 2 at exit 1, the verifier keeps one and writes its own, the full model takes all + bonus
        PassEvent("draft", 0, 1, (3,), 0.001, 1),
        _tok(S.DRAFTED, 4, 1, 11, " a", "draft", "draft", 1),
        PassEvent("draft", 0, 1, (4,), 0.001, 1),
        _tok(S.DRAFTED, 5, 2, 12, " b", "draft", "draft", 1),
        PassEvent("verify", 1, 2, (3, 4), 0.002, 1),
        PassEvent("draft", 0, 1, (6,), 0.001, 1),
        PassEvent("verify", 1, 2, (6,), 0.001, 1),
        PassEvent("target", 2, 4, (3, 4, 6), 0.003, 1),
        _tok(S.TENTATIVE, 4, 1, 11, " a", "draft", "verify", 1),
        _tok(S.VERIFY_REJECTED, 5, 2, 12, " b", "draft", "verify", 1),
        _tok(S.VERIFY_WROTE, 6, 2, 13, " c", "verify", "verify", 1),
        _tok(S.ACCEPTED, 4, 1, 11, " a", "draft", "target", 1),
        _tok(S.ACCEPTED, 6, 2, 13, " c", "verify", "target", 1),
        _tok(S.TARGET_WROTE, 7, 3, 14, " <b>d</b>", "target", "target", 1),
        RoundEvent(1, 4, 0, (6, 6, 6, 6), 0.02),
        # round 2: drafts kept by the verifier, then Stop: they are discarded
        PassEvent("draft", 0, 1, (7,), 0.001, 2),
        _tok(S.DRAFTED, 8, 4, 15, " e", "draft", "draft", 2),
        PassEvent("draft", 0, 1, (8,), 0.001, 2),
        _tok(S.DRAFTED, 9, 5, 16, " f", "draft", "draft", 2),
        PassEvent("verify", 1, 2, (7, 8), 0.002, 2),
        _tok(S.TENTATIVE, 8, 4, 15, " e", "draft", "verify", 2),
        _tok(S.TENTATIVE, 9, 5, 16, " f", "draft", "verify", 2),
        _tok(S.DISCARDED, 8, 4, 15, " e", "draft", "stop", 2),
        _tok(S.DISCARDED, 9, 5, 16, " f", "draft", "stop", 2),
        DoneEvent("stopped", (10, 11, 13, 14), "", 3, 0.05, {"num_layers": 4}),
    ]


def rounds():
    return replay(events())


def _steps(fragment: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", li) for li in re.findall(r"<li[^>]*>(.*?)</li>", fragment, re.DOTALL)]


def test_the_replay_of_the_hand_built_run():
    rs = rounds()
    assert [r["round"] for r in rs] == [0, 1, 2]
    assert [[s["stage"] for s in r["steps"]] for r in rs] == [["prefill"], ["draft", "verify", "target"],
                                                             ["draft", "verify", "stop"]]
    assert rs[1]["cache_before"] == [3, 3, 3, 3] and rs[1]["cache_after"] == [6, 6, 6, 6]
    assert rs[2]["cache_after"] == [7, 7, 6, 6]  # the stack cut back to the 7 committed positions
    assert [r["committed_total"] for r in rs] == [1, 4, 4]
    assert [r["complete"] for r in rs] == [True, True, False]


def test_labels():
    rs = rounds()
    assert round_label(rs, 0) == "Prefill (round 0 of 2)"
    assert round_label(rs, 1) == "Round 1 of 2"
    assert round_label(rs, 99) == "Round 2 of 2"  # clamped
    assert round_label([], 0) == ""
    fragment = round_html(rs, 1, SETTINGS)
    assert 'id="hs-step"' in fragment and 'data-round="1"' in fragment
    assert "Round 1 of 2" in fragment
    assert 'data-round=""' in round_html([], 0, SETTINGS)


def test_steps_are_numbered_in_order_with_their_work():
    steps = _steps(round_html(rounds(), 1, SETTINGS))
    assert len(steps) == 3
    assert steps[0].startswith("① Draft at exit 1: layer 1 + exit head ran 2× on 1 token each, 2.0 ms — proposed")
    assert steps[1].startswith("② Intermediate verify at exit 2: layer 2 + exit head on 2 tokens, 2.0 ms — kept")
    assert steps[2].startswith("③ Full model: layers 3–4 on 3 tokens (after layers 1–2 on 1 token to catch up), "
                               "5.0 ms — committed")
    assert "wrote bonus" in steps[2]
    stopped = _steps(round_html(rounds(), 2, SETTINGS))
    assert stopped[-1].startswith("③ Stopped") and "discarded" in stopped[-1]
    assert "generation stopped inside this round" in round_html(rounds(), 2, SETTINGS)


def test_a_round_says_its_plan_and_a_cheaper_full_model_ends_at_its_lm_head_in_the_pages_words():
    """Seen on the page: 'plan: full@q4 x12' (the policy's own label) and 'layers 1-30 + exit head' for the
    4-bit full model drafting. The plan is said in words, and a full model in a cheaper format ends at its
    LM head. (The hand-built run's passes stand in for the 4-bit model's: the wording follows the roles.)"""
    rs = rounds()
    levels = build_levels(("1@q4", "full@q4"), 4)
    rs[1]["plan"] = {"choice": "full@q4 x12", "words": Round(levels[1], levels[2], 12).words,
                     "reason": "expected 2.81x a plain step"}
    fragment = round_html(rs, 1, ("1@q4", "full@q4"))
    assert "plan: the 4-bit full model drafts 12 (expected 2.81x a plain step)" in fragment
    steps = _steps(fragment)
    assert steps[0].startswith("① Draft by exit 1 in 4-bit: layer 1 + exit head ran 2×")  # an exit: its head
    assert steps[1].startswith("② Judged by the 4-bit full model: layer 2 + LM head on 2 tokens")
    exits = build_levels((2, 4), 8)
    rs[1]["plan"] = {"choice": "exit 2 x2 -> exit 4, full at 4", "words": Round(exits[0], exits[2], 2, (exits[1],), 4).words,
                     "reason": None}
    assert "plan: exit 2 drafts 2, exit 4 judges, the full model runs at 4 pending<" in round_html(rs, 1, SETTINGS)


def test_chips_use_the_trace_classes():
    fragment = round_html(rounds(), 1, SETTINGS)
    classes = re.findall(r'class="hs-tok hs-([a-z-]+)"', fragment)
    assert set(classes) <= set(COLORS)
    # drafted, kept, rejected by the verifier, the verifier's token, accepted drafts, the bonus
    assert {"drafted", "tentative", "verify-rejected", "verify-wrote", "accepted", "target-wrote"} <= set(classes)
    assert "hs-discarded" in round_html(rounds(), 2, SETTINGS)


def test_model_text_is_escaped():
    prefill = round_html(rounds(), 0, SETTINGS)
    assert EVIL not in prefill and "<script" not in prefill
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in prefill
    one = round_html(rounds(), 1, SETTINGS)
    assert "<b>d</b>" not in one and "&lt;b&gt;d&lt;/b&gt;" in one


def test_the_cache_table_compresses_runs_of_layers():
    fragment = round_html(rounds(), 2, SETTINGS)
    assert "KV cache length per layer: before → after" in fragment
    rows = [re.sub(r"<[^>]+>", "|", row).strip("|").replace("||", "|").split("|")
            for row in re.findall(r"<tr>(.*?)</tr>", fragment) if "<td" in row]
    assert rows == [["layers 1–2", "6 → 7", "+1"], ["layers 3–4", "6 → 6", "±0"]]
    single = cache_table_html([5, 5, 4], [5, 6, 6])
    assert "<td>layer 1</td><td>5 → 5</td>" in single and "<td>layer 2</td><td>5 → 6</td>" in single
    assert "<td>layer 3</td><td>4 → 6</td>" in single


def test_the_stepper_stays_inside_the_run_and_play_stops_at_its_end():
    from ui import stepper

    rounds = [{"round": r} for r in range(3)]
    assert stepper.step(rounds, 0, -1) == 0 and stepper.step(rounds, 1, 1) == 2 and stepper.step(rounds, 2, 1) == 2
    assert stepper.show_round(None, 0, None) == stepper.STEP_HINT
    playing, timer, label = stepper.play(False)
    assert playing is True and timer.active is True and label.startswith("Pause")
    assert stepper.tick(rounds, 0)[:2] == (1, True)
    at_end = stepper.tick(rounds, 2)
    assert at_end[1] is False and at_end[2].active is False and at_end[3] == "Play ▶"
