"""Acceptance as the stats count it: per token proposed (papers' token acceptance) and per token
up to each verdict's first rejection (the speed model's a)."""

from __future__ import annotations

from hispec.engine.events import TokenEvent
from hispec.engine.events import TokenState as S
from hispec.runs.metrics import StatsCollector, stats_rows


def tok(state, serial, index, round_, origin="draft", stage="target"):
    return TokenEvent(state, serial, index, 100 + serial, f"t{serial}", origin, stage, round_, 0.01 * serial)


def events():
    """Round 1: 4 drafts, the full model keeps 1, rejects the 2nd (the 3rd and 4th fall with it) and
    writes its own. Round 2: 2 drafts, both kept, plus a bonus token."""
    out = [tok(S.DRAFTED, s, s, 1, stage="draft") for s in range(4)]
    out += [tok(S.ACCEPTED, 0, 0, 1)] + [tok(S.TARGET_REJECTED, s, s, 1) for s in (1, 2, 3)]
    out += [tok(S.TARGET_WROTE, 4, 1, 1, origin="target")]
    out += [tok(S.DRAFTED, s, s - 3, 2, stage="draft") for s in (5, 6)]
    out += [tok(S.ACCEPTED, s, s - 3, 2) for s in (5, 6)] + [tok(S.TARGET_WROTE, 7, 4, 2, origin="target")]
    return out


def test_acceptance_by_position_counts_each_blocks_ith_verdict_up_to_its_first_rejection():
    """Round 1 keeps its 1st draft and rejects its 2nd (the 3rd and 4th fall unjudged); round 2 keeps both:
    position 1 was kept in 2 of 2 blocks, position 2 in 1 of 2, nothing past it was judged in order."""
    stats = StatsCollector()
    for ev in events():
        stats.add(ev)
    assert stats.by_position == {"draft->target": [[2, 2], [1, 2]]}


def test_acceptance_stops_at_the_first_rejection_and_kept_counts_every_proposal():
    """One figure is called acceptance (per token, up to each block's first rejection: the speed
    model's a); the share of all proposals kept has another name."""
    stats = StatsCollector("layerskip")
    for ev in events():
        stats.add(ev)
    s = stats.summary()
    assert s["acceptance"] == {"draft->target": 3 / 4}  # 3 kept, 1 first rejection
    assert s["kept"] == {"draft->target": 3 / 6}  # 3 kept of 6 drafted
    assert "acceptance_per_token" not in s
    rows = dict(stats_rows(s))
    assert rows["acceptance draft → full model"] == "75%"
    assert rows["drafts kept draft → full model (of all proposed)"] == "50%"
    assert sum(label.startswith("acceptance") for label in rows) == 1


def test_the_two_agree_when_no_block_loses_a_tail():
    stats = StatsCollector("layerskip")
    for ev in [tok(S.DRAFTED, 0, 0, 1, stage="draft"), tok(S.TARGET_REJECTED, 0, 0, 1),
               tok(S.TARGET_WROTE, 1, 0, 1, origin="target"), tok(S.DRAFTED, 2, 1, 2, stage="draft"),
               tok(S.ACCEPTED, 2, 1, 2)]:
        stats.add(ev)
    s = stats.summary()
    assert s["acceptance"] == s["kept"] == {"draft->target": 0.5}
    assert not any("kept" in label for label, _ in stats_rows(s))


def test_a_level_in_a_cheaper_format_is_named_in_the_acceptance_rows():
    """Seen after a default run: 'acceptance lookup → verify 40%', 'verify → full model 100%', where the
    verifier was the 4-bit full model. Exits are named by their layer, like every level."""
    from hispec.engine.levels import levels_by_role
    from hispec.runs.metrics import pair_name

    precision = levels_by_role(("lookup", "full@q4"))
    assert pair_name("lookup->verify", precision) == "lookup → 4-bit full model"
    assert pair_name("verify->target", precision) == "4-bit full model → full model"
    assert pair_name("verify->target") == "verify → full model"  # roles unknown: the role
    exits = levels_by_role(("lookup", 2, 4))
    assert pair_name("draft->verify", exits) == "exit 2 → exit 4"  # every level by what it is (issue 56)
    assert pair_name("draft->verify", levels_by_role(("2@q4", "full@q4"))) == "exit 2 in 4-bit → 4-bit full model"
