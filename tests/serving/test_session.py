"""The serving session's timing of a model's costs: under the model's lock, once per model and exit."""

import time

import pytest

from hispec.errors import HiSpecError
from hispec.serving.limits import Limits
from hispec.serving.registry import ModelRegistry
from hispec.serving.session import model_costs_under_lock


@pytest.fixture
def registry(tiny_loaded):
    reg = ModelRegistry(limits=Limits(rate_per_minute=0))
    reg.add("tiny", tiny_loaded)
    tiny_loaded.ee.cost_model = None  # every test times afresh
    return reg


def test_costs_are_timed_under_the_lock_and_only_once(registry):
    lock = registry.generation_lock("tiny")
    lock.acquire()  # another visitor's generation is running
    try:
        with pytest.raises(HiSpecError, match="busy with another visitor"):
            model_costs_under_lock(registry, "tiny", (2, 5), timeout_s=0.2)
    finally:
        lock.release()
    costs = model_costs_under_lock(registry, "tiny", (2, 5))
    assert costs.covers((2, 5)) and costs.head(2, 1) > 0 and costs.layer(1) > 0
    lock.acquire()
    try:  # timed before: returned at once, without waiting for the model
        t0 = time.monotonic()
        assert model_costs_under_lock(registry, "tiny", (2, 5), timeout_s=5) is costs
        assert time.monotonic() - t0 < 1
        with pytest.raises(HiSpecError):  # a new exit needs a timing, so it waits
            model_costs_under_lock(registry, "tiny", (3,), timeout_s=0.2)
    finally:
        lock.release()
    assert not lock.locked()
