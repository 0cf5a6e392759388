"""The one fair order of runs (hispec/evaluation/order.py): balanced over a cycle, mirrored pass after pass."""

from collections import Counter

import pytest

from hispec.evaluation.order import Balanced, williams


@pytest.mark.parametrize("n", range(1, 9))
def test_every_method_runs_in_every_position_and_after_every_other_equally_often(n):
    names = [f"m{i}" for i in range(n)]
    order = Balanced(names)
    cycle = [order.of(i) for i in range(len(order.cycle))]
    assert len(cycle) == (n if n % 2 == 0 else 2 * n) if n > 1 else len(cycle) == 1
    assert all(sorted(p) == sorted(names) for p in cycle)  # each pass runs every method once
    positions = Counter((k, name) for p in cycle for k, name in enumerate(p))
    assert set(positions.values()) == {len(cycle) // n}, positions
    follows = Counter((a, b) for p in cycle for a, b in zip(p, p[1:]))
    if n > 1:
        assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1, follows


@pytest.mark.parametrize("n", range(2, 9))
def test_each_pass_is_followed_by_its_mirror_and_the_cycle_repeats(n):
    order = Balanced(range(n))
    for i in range(0, 2 * len(order.cycle), 2):
        assert order.of(i + 1) == order.of(i)[::-1]  # a linear drift costs every method alike over two passes
        assert order.of(i) == order.of(i + len(order.cycle))


def test_two_methods_alternate_and_any_values_can_be_ordered():
    assert [Balanced(["m", "p"]).of(i) for i in range(4)] == [["m", "p"], ["p", "m"], ["m", "p"], ["p", "m"]]
    configs = [object(), object(), object()]  # not hashable by value: ordered by position
    assert sorted(map(id, Balanced(configs).of(3))) == sorted(map(id, configs))
    assert Balanced([]).of(0) == []


def test_what_the_artifact_records():
    order = Balanced(["a", "b", "c"])
    record = order.describe([order.of(0), order.of(1)])
    assert record["design"] == "williams" and record["cycle"] == 6
    assert record["passes"] == [["a", "b", "c"], ["c", "b", "a"]]


def test_a_design_needs_a_treatment():
    with pytest.raises(ValueError):
        williams(0)
