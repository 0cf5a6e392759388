"""scripts/measure/q4_ab.py: two kernel builds in one process. Switching routes every product through the
build asked for, and the bit check tells builds with the same sums from builds with different ones."""

import pytest
import torch
from helpers import tiny_model

import q4_ab
from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats import q4_kernel
from hispec.model.formats.q4 import to_q4

REASON = q4_kernel.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")


def _ee():
    return EarlyExitModel(to_q4(tiny_model("llama", layers=4, seed=3)))


class _Counting:
    """A kernel library that counts the calls of each function, passing them on to the real one."""

    def __init__(self, lib):
        self.lib, self.calls = lib, {}

    def __getattr__(self, name):
        fn = getattr(self.lib, name)

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args)

        return counted


def test_use_routes_every_product_and_the_native_layers_through_the_build_given(monkeypatch):
    ee = _ee()
    monkeypatch.setattr(q4_kernel, "_host_lib", q4_kernel.lib())  # restored after the test
    counting = _Counting(q4_kernel.lib())
    ids = list(range(3, 12))
    with torch.inference_mode():
        ee.exit_logits(ee.run_layers(ee.embed(ids), 0, ee.num_layers, ee.new_cache(32)), ee.num_layers)  # bound
        q4_ab.use(ee, counting)
        ee.exit_logits(ee.run_layers(ee.embed(ids), 0, ee.num_layers, ee.new_cache(32)), ee.num_layers)
    assert counting.calls.get("hispec_q4_layers") == 1  # the native route, one call for the layers
    assert counting.calls.get("hispec_q80_matmul", 0) + counting.calls.get("hispec_q41_matmul", 0) >= 1  # the head


@pytest.mark.skipif(q4_kernel.host_isa() != "avx512", reason="needs a second build with other sums (AVX-512 host)")
def test_the_bit_check_holds_for_one_build_twice_and_fails_for_builds_with_other_sums(monkeypatch):
    ee = _ee()
    monkeypatch.setattr(q4_kernel, "_host_lib", q4_kernel.lib())
    context = list(range(3, 40))
    same = q4_ab.compare(ee, {"base": q4_kernel.load("avx512"), "new": q4_kernel.load("avx512")}, context, rounds=1,
                         per_turn=1)
    other = q4_ab.compare(ee, {"base": q4_kernel.load("avx512"), "new": q4_kernel.load("avx2")}, context, rounds=1,
                          per_turn=1)
    assert all(row["same_bits"] for row in same.values())
    assert not any(row["same_bits"] for row in other.values())  # 16 lanes' sums against 8 lanes'
    assert set(same) == {"1", "4", "8"} and same["1"]["base"]["steps"] == 1


def test_a_commit_without_the_kernel_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="no kernel source at 'no-such-commit'"):
        q4_ab.build_at("no-such-commit", "avx2", tmp_path)
