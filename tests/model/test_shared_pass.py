"""The shared pass (q4_layer.NativeLayers.run_shared, hispec_q4_layers_rows in csrc/q4_kernel.cpp): the rows of
several sequences, each with its own cache and positions, in one call of the native route. Batch invariance,
bit for bit, in each of the project's own arithmetics (q4, a8, and the exact float32 lane on the file's blocks):
a sequence's hidden states, the keys and values it writes and its logits are the same whichever sequences
share its pass (1, 2, 4, 8 and 16 of them, in random order, beside neighbours of every length), as when it
runs alone. And the check is shown to catch a kernel made row-dependent on purpose."""

import ctypes
import random

import pytest
import torch
from helpers import on_blocks, tiny_model

from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats import q4_kernel, q4_layer
from hispec.model.formats.q4 import to_q4

REASON = q4_kernel.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
L = 4
SEQS = 16
SIZES = (1, 2, 4, 8, 16)


def _model(mode: str) -> EarlyExitModel:
    if mode == "wide":
        model, matrices = on_blocks(tiny_model("llama", layers=L, seed=11))
        ee = EarlyExitModel(model)
        ee.use_blocks(matrices)
    else:
        ee = EarlyExitModel(to_q4(tiny_model("llama", layers=L, seed=11)))
        if mode == "a8":
            ee = q4_layer.a8_copy(ee)
    assert ee.lean.native is not None and ee.lean.native.mode == mode
    return ee


def _sequences(seed=0):
    """SEQS sequences: a prompt (2-30 tokens, so caches of many lengths) and the rows of their next pass (1-3)."""
    g = random.Random(seed)
    return [([g.randrange(3, 100) for _ in range(g.randrange(2, 31))], [g.randrange(3, 100) for _ in range(g.randrange(1, 4))])
            for _ in range(SEQS)]


def _prefilled(ee, prompt):
    cache = ee.new_cache(32)  # small: some passes grow it
    ee.run_layers(ee.embed(prompt), 0, L, cache)
    return cache


def _state(ee, cache, hidden):
    n = cache.lengths[0]
    return (hidden.clone(), ee.exit_logits(hidden, L).clone(), tuple(cache.lengths),
            [(cache.keys[i][..., :n, :].clone(), cache.values[i][..., :n, :].clone()) for i in range(L)])


def _alone(ee, seqs):
    out = []
    for prompt, rows in seqs:
        cache = _prefilled(ee, prompt)
        out.append(_state(ee, cache, ee.run_layers(ee.embed(rows), 0, L, cache)))
    return out


def _shared(ee, seqs, members):
    """The pass of the sequences `members` (indices, in this order) shared; each member's state."""
    caches = {i: _prefilled(ee, seqs[i][0]) for i in members}
    outs = ee.lean.native.run_shared([(ee.embed(seqs[i][1]), caches[i]) for i in members], 0, L)
    return {i: _state(ee, caches[i], h) for i, h in zip(members, outs)}


def _same(a, b) -> bool:
    (ha, la, na, kva), (hb, lb, nb, kvb) = a, b
    return (na == nb and torch.equal(ha, hb) and torch.equal(la, lb)
            and all(torch.equal(x, y) for pa, pb in zip(kva, kvb) for x, y in zip(pa, pb)))


def _differing(ee, seqs, alone, trials=2, seed=1):
    """Compositions of every size in SIZES, random members in random order: the (size, member) pairs whose
    state differs from the member's state alone."""
    g = random.Random(seed)
    bad = []
    for size in SIZES:
        for _ in range(trials if size < SEQS else 1):
            members = g.sample(range(SEQS), size)
            for i, state in _shared(ee, seqs, members).items():
                if not _same(state, alone[i]):
                    bad.append((size, i))
    return bad


@pytest.mark.parametrize("mode", ["q4", "a8", "wide"])
def test_a_sequences_bits_do_not_depend_on_who_shares_its_pass(mode):
    ee = _model(mode)
    seqs = _sequences()
    alone = _alone(ee, seqs)
    assert _differing(ee, seqs, alone) == []


def test_the_shared_pass_agrees_with_the_reference_route_within_rounding():
    """Not just self-consistent: the shared pass's hidden states are the Python route's (kernel.decoder_layer on
    the same 4-bit products) within float32 rounding (different sums: never bit for bit)."""
    ee = _model("q4")
    seqs = _sequences(seed=2)[:4]
    shared = _shared(ee, seqs, [3, 0, 2, 1])
    q4_layer.set_enabled(ee, False)
    reference = _alone(ee, seqs)
    for i, ref in enumerate(reference):
        torch.testing.assert_close(shared[i][0], ref[0], rtol=1e-4, atol=1e-4 * ref[0].abs().max().item())


def test_a_kernel_made_row_dependent_is_caught(monkeypatch):
    """The check above, against a kernel whose rows change in their last bit with the number of rows in the
    pass (as a kernel choosing its blocking by the row count would): it must report differing members."""
    ee = _model("q4")
    seqs = _sequences()
    alone = _alone(ee, seqs)
    lib = ee.lean.native.lib

    class RowDependent:
        def __getattr__(self, name):
            return getattr(lib, name)

        @staticmethod
        def hispec_q4_layers_rows(*args):
            lib.hispec_q4_layers_rows(*args)
            hidden_ptr, rows = args[3], args[4]
            if rows > 4:  # wider passes sum in another order: the last bit moves
                view = torch.frombuffer((ctypes.c_float * (rows * ee.config.hidden_size)).from_address(hidden_ptr),
                                        dtype=torch.float32)
                view.copy_(torch.nextafter(view, torch.full_like(view, float("inf"))))

    monkeypatch.setattr(ee.lean.native, "lib", RowDependent())
    bad = _differing(ee, seqs, alone)
    assert bad and all(size > 1 for size, _ in bad)


def test_a_shared_pass_refuses_one_cache_twice_and_leaves_nothing_half_written():
    ee = _model("q4")
    cache = _prefilled(ee, [5, 6, 7])
    lengths = tuple(cache.lengths)
    with pytest.raises(ValueError, match="each sequence's cache once"):
        ee.lean.native.run_shared([(ee.embed([8]), cache), (ee.embed([9]), cache)], 0, L)
    assert tuple(cache.lengths) == lengths
    assert ee.lean.native.run_shared([], 0, L) == []
