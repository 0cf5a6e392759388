"""The race on one clock (issue 58): the run's committed tokens over time beside plain decoding's, as its timing
pairs measured it, and the live Speed chart's plain line."""

from __future__ import annotations

from ui import charts

PLAIN = {"runs": 3, "prefill_s": 0.5, "plain_decode_tokens_per_s": [9.0, 10.0, 11.0], "plain_tokens_per_s": [8.0]}


def history(*points):
    return [{"round": i, "t": t, "new_tokens": n, "tokens_per_s": n / t} for i, (t, n) in enumerate(points)]


def test_the_race_draws_both_on_one_clock_and_says_when_the_run_pulled_ahead():
    run = history((0.5, 1), (0.9, 4), (1.3, 12), (1.6, 20))  # plain: 1 token at 0.5 s, then 10 tokens/s
    fig = charts.race_figure(run, PLAIN)
    mine, plain = fig.data
    assert list(plain.x) == [0.0, 0.5, 0.5 + 19 / 10.0] and list(plain.y) == [0, 1, 20]
    assert list(mine.y) == [0, 1, 4, 12, 20]
    # at 0.9 s 4 tokens against plain's 5; at 1.3 s 12 against 9
    assert mine.name == "this run (ahead from 1.30 s)", mine.name
    slow = charts.race_figure(history((0.5, 1), (2.0, 5), (4.0, 20)), PLAIN)
    assert slow.data[0].name == "this run (never ahead)"


def test_no_race_without_a_measured_pair():
    run = history((0.5, 1), (0.9, 4))
    assert charts.race_figure(run, None) is None
    assert charts.race_figure(run, {**PLAIN, "runs": 0}) is None  # every pair cut short
    assert charts.race_figure([], PLAIN) is None


def test_the_stats_name_the_machines_load_beside_the_speed():
    from ui import render

    stats = {"new_tokens": 3, "wall_s": 1.0, "tokens_per_s": 3.0, "acceptance": {}, "kept": {}, "full_passes": 3,
             "tokens_per_full_pass": 1.0, "layer_tokens": {"useful": 1, "wasted": 0}}
    shown = render.stats_html(stats, load=([9.0, 5.0, 2.0], "now"))
    assert "machine load (now)" in shown and "busy" in shown and "ratio to plain decoding" in shown
    assert "machine load" not in render.stats_html(stats, load=(None, "now"))  # no load average on this system
    assert "quiet" in render.stats_html(stats, load=([0.0, 0.0, 0.0], "when recorded"))
