"""The one timed-pair helper (evaluation.pairs): ranges that hold, what too few pairs may say, the
interleaved order, cut pairs never counted, and every comparison's runs timed by it."""

from __future__ import annotations

import threading

import pytest

from hispec.engine.config import preset
from hispec.evaluation import compare, pairs
from hispec.runs import runner
from hispec.explain import what_if
from hispec.runs.runner import plain_config


def test_a_range_is_never_narrower_than_the_noise_floor():
    s = pairs.summary([1.30, 1.31, 1.32])
    assert s["median"] == pytest.approx(1.31)
    assert s["spread"] == (1.30, 1.32), "the pairs' own spread is kept apart"
    assert s["low"] == pytest.approx(1.31 * (1 - pairs.NOISE_FLOOR))
    assert s["high"] == pytest.approx(1.31 * (1 + pairs.NOISE_FLOOR))
    wide = pairs.summary([0.8, 1.5, 2.4])
    assert (wide["low"], wide["high"]) == (0.8, 2.4), "a spread wider than the floor is stated as it is"


@pytest.mark.parametrize("ratios, words", [
    ([1.5], "not enough to tell (1 pair; 3 are needed)"),
    ([1.5, 1.6], "not enough to tell (2 pairs; 3 are needed)"),
    ([1.05, 1.06, 1.07], "no measurable difference"),  # 1x is inside the floor around 1.06x
    ([0.6, 1.4, 2.0], "no measurable difference"),
    ([1.5, 1.52, 1.55], "52% faster"),
    ([0.5, 0.52, 0.55], "48% slower"),
])
def test_what_the_pairs_let_one_say(ratios, words):
    assert pairs.verdict(pairs.summary(ratios)) == words


def test_no_percentage_without_enough_pairs_or_with_1x_in_range():
    for ratios in ([2.0], [1.0, 1.02, 1.04]):
        assert "%" not in pairs.verdict(pairs.summary(ratios))
    assert "no range" in pairs.range_words(pairs.summary([2.0]))


def test_the_order_reverses_every_other_pass():
    assert [pairs.order(["m", "p"], i) for i in range(4)] == [["m", "p"], ["p", "m"], ["m", "p"], ["p", "m"]]


@pytest.fixture(scope="module")
def lm(tiny_loaded):
    return tiny_loaded


def test_a_pair_cut_by_a_stop_is_not_counted(lm, monkeypatch):
    ids = lm.encode("hello")
    method = preset("hispec", 2, 4, 2, 2, 12, policy="fixed").resolve_for(lm.ee)
    plain = plain_config(method).resolve_for(lm.ee)
    stop = threading.Event()
    runs = []
    real = runner.Decoder

    def counted(*a, **k):
        runs.append(1)
        if len(runs) == 4:  # the second pair's second run: stopped from its start
            stop.set()
        return real(*a, **k)

    monkeypatch.setattr(runner, "Decoder", counted)
    out = list(compare.vs_plain(lm, ids, method, 12, 3, stop))
    measured = out[-1]["vs_plain"]
    assert measured["runs"] == 1 and measured["asked"] == 3 and measured["cut"] == 2, measured
    assert "not enough to tell" in measured["verdict"]
    assert len(measured["plain_tokens_per_s"]) == 1, "the cut pair's runs are nowhere in the figures"


def test_every_comparison_times_its_runs_with_the_one_helper(lm, monkeypatch):
    """compare, vs_plain (the page's pairs and the API's baseline) and what-if: every decoder they build
    is built by evaluation.pairs.timed, nowhere else."""
    built, through_helper = [], []
    real_decoder, real_timed = runner.Decoder, pairs.timed_events

    def decoder(*a, **k):
        built.append(1)
        return real_decoder(*a, **k)

    def timed(*a, **k):
        through_helper.append(1)
        return (yield from real_timed(*a, **k))

    monkeypatch.setattr(runner, "Decoder", decoder)
    monkeypatch.setattr(pairs, "timed_events", timed)
    ids, stop = lm.encode("hello"), threading.Event()
    config = preset("hispec", 2, 4, 2, 2, 10, policy="fixed").resolve_for(lm.ee)
    list(compare.vs_plain(lm, ids, config, 10, 2, stop))
    list(compare.compare(lm, ids, compare.compare_configs(config, ["autoregressive"], lm.ee), 2, stop))
    list(what_if.what_if(lm, ids, config, (0.5, 0.5), 2, stop))
    assert len(built) == 4 + 4 + 4 and len(through_helper) == len(built), (len(built), len(through_helper))


def test_a_what_if_take_says_where_each_runs_time_went(lm):
    ids = lm.encode("hello")
    config = preset("hispec", 2, 4, 2, 2, 10, policy="fixed").resolve_for(lm.ee)
    take = next(i for i in what_if.what_if(lm, ids, config, (0.5, 0.5), 1, threading.Event())
                if isinstance(i, what_if.TakeDone))
    for split in (take.synthetic_split, take.plain_split):
        parts = split["setup_s"] + split["prefill_s"] + split["passes_s"] + split["other_s"]
        assert parts == pytest.approx(split["wall_s"], rel=0.05), split
