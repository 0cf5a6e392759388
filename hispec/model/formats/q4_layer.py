"""The 4-bit path's native route: a whole range of decoder layers in one call of the C++ kernel.

``kernel.decoder_layer`` runs a layer as about a dozen torch operations and four calls of the 4-bit
product, each a Python call and a dispatch; over 30 layers that per-operation overhead costs more than
the products themselves. ``NativeLayers.run_layers`` hands layers [start, end) to
``hispec_q4_layers`` (csrc/q4_kernel.cpp) in one ctypes call: RMSNorm, the fused q/k/v product,
per-head q/k norms (Qwen3), rotary (from the lean path's own cos/sin table), keys and values written
straight into the engine's ``LayerKVCache`` tensors (which torch allocated: a layer that needs room
grows through ``LayerKVCache.update`` first, whose placeholder rows the kernel then overwrites),
attention over the cache, o_proj + residual, RMSNorm, gate/up, SiLU, down + residual. Exits and the
cache are unchanged: a call stops after its last layer, and the next continues from the same cache.

Each row's bits are independent of the number of rows in the pass and of its place (the kernel's
header says why, phase by phase), so speculative decoding in 4-bit still equals 4-bit plain decoding.
The arithmetic is not the Python route's: the products are the very same kernel, but RMSNorm,
softmax and SiLU sum and round in their own fixed orders, so the two routes agree to float32 rounding,
not bit for bit. The Python route (``kernel.decoder_layer`` on ``Q4Projection``) stays as the fallback
(``HISPEC_Q4_NATIVE=0``, and layouts the native route does not cover: see ``support``) and as the
reference in the tests.
"""

from __future__ import annotations

import ctypes
import os

import torch
from torch import nn

from hispec.model.formats import q4_kernel
from hispec.model.formats.q4 import Q4_1, Q8_0, Q4Projection

_p, _i64, _f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Mat(ctypes.Structure):
    _fields_ = [("qs", _p), ("d", _p), ("m", _p), ("N", _i64), ("K", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Mat), ("o", _Mat), ("gate_up", _Mat), ("down", _Mat),
                ("qkv_bias", _p), ("o_bias", _p), ("gate_up_bias", _p), ("down_bias", _p),
                ("in_norm", _p), ("post_norm", _p), ("q_norm", _p), ("k_norm", _p),
                ("keys", _p), ("values", _p), ("cap", _i64)]


class _KV(ctypes.Structure):  # one layer's cache of one sequence in a shared pass (hispec_kv)
    _fields_ = [("keys", _p), ("values", _p), ("cap", _i64)]


class _Dims(ctypes.Structure):
    _fields_ = [("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64), ("inter", _i64),
                ("eps", _f), ("qk_eps", _f), ("scaling", _f), ("mode", ctypes.c_int32)]

# the products' arithmetic (hispec_dims.mode): the 4-bit one over float32 activations, int8 activations
# per block of 32, or the float32 model's own weights widened in registers (the exact float32 lane)
MODES = {"q4": 0, "a8": 1, "wide": 2}


def enabled_by_env() -> bool:
    return os.environ.get("HISPEC_Q4_NATIVE", "1").strip() != "0"


def _eps(norm: nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6))


def _norm_ok(norm) -> bool:
    w = getattr(norm, "weight", None)
    return (norm is not None and type(norm).__name__.endswith("RMSNorm") and isinstance(w, torch.Tensor)
            and w.dtype == torch.float32 and w.ndim == 1 and w.device.type == "cpu")


def support(lean) -> str | None:
    """None when the native route runs these layers exactly as laid out; otherwise why not."""
    if lean.dtype != torch.float32 or lean.device.type != "cpu":
        return "the native route runs float32 activations on the CPU"
    if not lean.layers:
        return "no layers"
    first = lean.layers[0]
    eps = _eps(first.input_norm)
    for w in lean.layers:
        for proj in (w.qkv, w.o, w.gate_up, w.down):
            if not isinstance(proj, Q4Projection) or proj.matrix.kind != Q4_1:
                return "a projection is not a Q4_1 matrix"
        if type(w.act).__name__ not in ("SiLU", "SiLUActivation"):
            return f"activation {type(w.act).__name__} is not covered (SiLU only)"
        if not (_norm_ok(w.input_norm) and _norm_ok(w.post_norm)):
            return "a layer norm is not an RMSNorm with float32 weights"
        if {_eps(w.input_norm), _eps(w.post_norm)} != {eps}:
            return "the layers' norms use different epsilons"
        if (w.q_norm is None) != (w.k_norm is None) or (w.q_norm is not None and not (
                _norm_ok(w.q_norm) and _norm_ok(w.k_norm) and _eps(w.q_norm) == _eps(w.k_norm))):
            return "per-head q/k norms the native route does not cover"
        dims = (w.n_heads, w.n_kv, w.head_dim, w.intermediate, w.scaling)
        if dims != (first.n_heads, first.n_kv, first.head_dim, first.intermediate, first.scaling):
            return "the layers differ in shape"
    E = first.input_norm.weight.shape[0]
    if first.head_dim % 2 or first.n_heads % first.n_kv or any(v % 32 for v in (E, first.n_heads * first.head_dim,
                                                                              first.intermediate)):
        return "shapes the kernel's blocks do not divide"
    return None


class NativeLayers:
    """Decoder layers of a 4-bit lean path, described once for ``hispec_q4_layers``."""

    def __init__(self, lean, isa: str | None = None, act8: bool = False, mode: str | None = None):
        """`isa`: the kernel build to run ('avx512', 'avx2'; default the host's, ``q4_kernel.host_isa``);
        `mode` (``MODES``): 'q4' float32 activations in the 4-bit arithmetic (the exact 4-bit route), 'a8'
        (or `act8`) int8 activations per block of 32 (the 'a8' precision level, a cheaper drafter of the
        same weights, integer dot products in one kernel for every pass width; the kernel's a8 section says
        how), 'wide' the float32 model's weights widened from the blocks (a float32 model on its file's
        blocks: the exact float32 lane). With a8 each matrix's blocks are repacked once for the build's
        column groups (``packed_a8``: a copy as large as the file's blocks)."""
        reason = support(lean)
        if reason:
            raise ValueError(f"the native 4-bit route cannot run this model: {reason}")
        self.lib = q4_kernel.lib() if isa is None else q4_kernel.load(isa)
        self.lean = lean
        first = lean.layers[0]
        self.E = first.input_norm.weight.shape[0]
        self.H, self.KV, self.D, self.I = first.n_heads, first.n_kv, first.head_dim, first.intermediate
        qk_eps = _eps(first.q_norm) if first.q_norm is not None else 0.0
        self.mode = mode or ("a8" if act8 else "q4")
        if self.mode not in MODES:
            raise ValueError(f"unknown native mode {self.mode!r}; modes: {', '.join(MODES)}")
        self.act8 = self.mode == "a8"
        self.dims = _Dims(self.E, self.H, self.KV, self.D, self.I, _eps(first.input_norm), qk_eps, first.scaling,
                          MODES[self.mode])
        self.table = (_Layer * len(lean.layers))()
        self.packed = (_p * (4 * len(lean.layers)))()  # act8: each layer's 4 packings (hispec_q4_layers' last argument)
        self.keep = []  # tensors whose pointers the tables hold
        for i, (slot, w) in enumerate(zip(self.table, lean.layers)):
            for j, (name, proj) in enumerate((("qkv", w.qkv), ("o", w.o), ("gate_up", w.gate_up), ("down", w.down))):
                m = proj.matrix
                setattr(slot, name, _Mat(m.qs.data_ptr(), m.d.data_ptr(), m.m.data_ptr(), *m.shape))
                self.keep += [m.qs, m.d, m.m]
                if self.act8:
                    packed = packed_a8(self.lib, m)
                    self.packed[4 * i + j] = packed.data_ptr()
                    self.keep.append(packed)
                if proj.bias is not None:
                    bias = proj.bias.detach().float().contiguous()
                    self.keep.append(bias)
                    setattr(slot, f"{name}_bias", bias.data_ptr())
            for name, norm in (("in_norm", w.input_norm), ("post_norm", w.post_norm), ("q_norm", w.q_norm),
                               ("k_norm", w.k_norm)):
                if norm is not None:
                    weight = norm.weight.detach().contiguous()
                    self.keep.append(weight)
                    setattr(slot, name, weight.data_ptr())
        self.stride = ctypes.sizeof(_Layer)

    def run_layers(self, hidden: torch.Tensor, start: int, end: int, cache) -> torch.Tensor:
        """Layers [start, end) on hidden (1, q, E), appending to each layer's cache (LeanPath.run_layers)."""
        past, q = cache.lengths[start], hidden.shape[1]
        self._check_rows(hidden)
        for idx in range(start, end):
            keys, values = self._room(cache, idx, past, q)
            slot = self.table[idx]
            # a freed cache's address can come back with another capacity: compare everything
            if slot.keys != keys.data_ptr() or slot.values != values.data_ptr() or slot.cap != keys.shape[-2]:
                self._check_layout(idx, keys, values)
                slot.keys, slot.values, slot.cap = keys.data_ptr(), values.data_ptr(), keys.shape[-2]
        rotary = self.lean.rotary
        rotary.ensure(past + q, hidden.device)
        out = hidden.clone(memory_format=torch.contiguous_format)
        row = self.D * 4  # bytes of one table row
        self.lib.hispec_q4_layers(ctypes.addressof(self.table) + start * self.stride, end - start,
                                  ctypes.addressof(self.dims), out.data_ptr(), q, past,
                                  rotary.cos.data_ptr() + past * row, rotary.sin.data_ptr() + past * row,
                                  q4_kernel.threads(), self._packed_at(start))
        for idx in range(start, end):
            cache.lengths[idx] = past + q
        return out

    def run_shared(self, parts: list[tuple[torch.Tensor, object]], start: int, end: int) -> list[torch.Tensor]:
        """A shared pass: layers [start, end) over the rows of several sequences at once, each part (hidden
        (1, q_i, E), its own cache) appending to its cache as ``run_layers`` would. The products run once
        over every row; attention reads each row's own cache. Each part's output has the bits it has alone
        (the kernel is batch-invariant: tests/model/test_shared_pass.py). The caches must be distinct."""
        if len({id(cache) for _, cache in parts}) != len(parts):
            raise ValueError("a shared pass takes each sequence's cache once")
        if not parts:
            return []
        pos, seq, rows = [], [], []
        n = end - start
        tables = (ctypes.POINTER(_KV) * len(parts))()
        keep = []
        for s, (hidden, cache) in enumerate(parts):
            self._check_rows(hidden)
            past, q = cache.lengths[start], hidden.shape[1]
            kv = (_KV * max(n, 1))()
            for j, idx in enumerate(range(start, end)):
                keys, values = self._room(cache, idx, past, q)
                self._check_layout(idx, keys, values)
                kv[j] = _KV(keys.data_ptr(), values.data_ptr(), keys.shape[-2])
            tables[s] = ctypes.cast(kv, ctypes.POINTER(_KV))
            keep.append(kv)
            pos += range(past, past + q)
            seq += [s] * q
            rows.append(hidden[0])
        hidden = torch.cat(rows).contiguous()
        total = hidden.shape[0]
        positions = torch.tensor(pos, dtype=torch.int64)
        owners = torch.tensor(seq, dtype=torch.int32)
        rotary = self.lean.rotary
        rotary.ensure(max(pos) + 1, hidden.device)
        self.lib.hispec_q4_layers_rows(ctypes.addressof(self.table) + start * self.stride, n,
                                       ctypes.addressof(self.dims), hidden.data_ptr(), total, positions.data_ptr(),
                                       owners.data_ptr(), ctypes.addressof(tables), rotary.cos.data_ptr(),
                                       rotary.sin.data_ptr(), q4_kernel.threads(), self._packed_at(start))
        outs, at = [], 0
        for part_hidden, cache in parts:
            q = part_hidden.shape[1]
            past = cache.lengths[start]
            for idx in range(start, end):
                cache.lengths[idx] = past + q
            outs.append(hidden[at : at + q][None])
            at += q
        return outs

    def _packed_at(self, start: int) -> int:
        return ctypes.addressof(self.packed) + start * 4 * ctypes.sizeof(_p)

    @staticmethod
    def _check_rows(hidden: torch.Tensor) -> None:
        if hidden.shape[0] != 1 or hidden.dtype != torch.float32 or not hidden.is_cpu:
            raise TypeError("the native 4-bit route runs float32 sequences on the CPU, one (1, q, E) tensor each")

    def _room(self, cache, idx: int, past: int, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer idx's key and value buffers, grown to hold q more positions after past."""
        if cache.lengths[idx] != past:  # the stack's invariant: one frontier per segment
            raise RuntimeError(f"layer {idx} cache holds {cache.lengths[idx]} positions, expected {past}")
        keys = cache.keys[idx]
        if keys is None or past + q > keys.shape[-2]:
            room = torch.zeros(1, self.KV, q, self.D)
            cache.update(room, room, idx)  # grows the layer's buffers; the kernel writes the rows
            cache.lengths[idx] = past  # update() counted the placeholder rows
            keys = cache.keys[idx]
        return keys, cache.values[idx]

    def _check_layout(self, idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        if keys.shape != (1, self.KV, keys.shape[-2], self.D) or not (keys.is_contiguous() and values.is_contiguous()) \
                or keys.dtype != torch.float32 or values.shape != keys.shape:
            raise RuntimeError(f"layer {idx}'s cache is not laid out as the native route writes it")


def packed_a8(lib, matrix) -> torch.Tensor:
    """A Q4_1 matrix's blocks repacked for `lib`'s int8-activation products (hispec_q41_pack_a8: groups of
    as many columns as the build's vector lanes, the same bytes in another order; csrc/q4_kernel.cpp)."""
    N, K = matrix.shape
    out = torch.empty(int(lib.hispec_q41_packed_bytes(N, K)), dtype=torch.uint8)
    lib.hispec_q41_pack_a8(matrix.qs.data_ptr(), matrix.d.data_ptr(), matrix.m.data_ptr(), N, K, out.data_ptr())
    return out


def set_enabled(ee, on: bool, isa: str | None = None) -> bool:
    """Turn the native route of an EarlyExitModel's 4-bit lean path on or off; whether it is on."""
    lean = ee.lean
    if lean is None:
        return False
    lean.native = NativeLayers(lean, isa) if on and support(lean) is None else None
    return lean.native is not None


def a8_copy(ee, why_not: str = "a8 levels"):
    """A second view of a 4-bit EarlyExitModel whose decoder layers run with int8 activations (the 'a8'
    level): the same modules and 4-bit blocks, its own lean path and native table in act8 mode, and its
    LM head in the same arithmetic (``A8Head``: int8 activations, integer dot products). Trained exit
    heads are as in `ee` (float32 activations). The packed blocks are the a8 view's own copy (as many
    bytes as the file's blocks). Serves as a level ('full@a8') or, loaded with --weights a8, as the exact
    model itself. Raises ConfigError where the native route cannot run (the a8 products exist only there),
    naming `why_not`, what asked for it."""
    from hispec.errors import ConfigError

    twin = type(ee)(ee.model)  # an EarlyExitModel (its class taken from `ee`: this module sits below it)
    if twin.lean is None or twin.lean.native is None:
        why = ("HISPEC_Q4_NATIVE=0" if not enabled_by_env() else
               support(twin.lean) if twin.lean is not None else "the lean path is off")
        raise ConfigError(f"{why_not}: int8 activations run only in the native 4-bit route, which cannot run "
                          f"here ({why})")
    twin.lean.native = NativeLayers(twin.lean, act8=True)
    head = twin.lean.lm_head
    if getattr(getattr(head, "matrix", None), "kind", None) in (Q4_1, Q8_0):
        twin.lean.lm_head = A8Head(twin.lean.native.lib, head.matrix, head.bias)
    return twin


class A8Head:
    """An LM head (Q8_0 or Q4_1 blocks) with int8 activations per block of 32 and integer dot products, as
    the a8 layers compute: x (..., K) float32 -> logits (..., N) float32, each row's bits independent of
    the rows beside it. Its blocks are packed once (``hispec_q80_pack_a8`` / ``hispec_q41_pack_a8``)."""

    def __init__(self, lib, matrix, bias: torch.Tensor | None = None):
        self.lib, self.shape, self.bias = lib, matrix.shape, bias
        N, K = matrix.shape
        if matrix.kind == Q8_0:
            self.packed = torch.empty(int(lib.hispec_q80_packed_bytes(N, K)), dtype=torch.uint8)
            lib.hispec_q80_pack_a8(matrix.qs.data_ptr(), matrix.d.data_ptr(), N, K, self.packed.data_ptr())
            self.fn = lib.hispec_q80_matmul_a8p
        else:
            self.packed, self.fn = packed_a8(lib, matrix), lib.hispec_q41_matmul_a8p

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        N, K = self.shape
        if x.dtype != torch.float32 or not x.is_cpu or x.shape[-1] != K:
            raise TypeError(f"the a8 LM head takes float32 inputs on the CPU with {K} features "
                            f"(got {x.dtype}, {tuple(x.shape)}, on {x.device})")
        rows = x.reshape(-1, K).contiguous()
        out = torch.empty(rows.shape[0], N)
        self.fn(rows.data_ptr(), rows.shape[0], K, self.packed.data_ptr(), N, out.data_ptr(), N, q4_kernel.threads())
        out = out.view(*x.shape[:-1], N)
        return out if self.bias is None else out + self.bias


def unavailable_reason() -> str | None:
    return q4_kernel.unavailable_reason()


# ---- the phase clock (scripts/measure/q4_profile.py) -----------------------------------------------------------
PHASES = ("products", "attention_rotary_cache", "norms_block_sums")


def profile_reset(mode: int = 1) -> None:
    """Zero the kernel's phase clock and run it (1 wall clock, 2 thread CPU time, 0 off)."""
    q4_kernel.lib().hispec_q4_profile(mode, 1, None)


def profile_read(stop: bool = False) -> dict[str, float]:
    """The phase clock in ms since the last reset (thread 0, barrier to barrier); `stop` turns it off."""
    buf = (ctypes.c_double * 8)()
    q4_kernel.lib().hispec_q4_profile(0 if stop else -1, 0, buf)
    return {name: buf[i] * 1e3 for i, name in enumerate(PHASES)}
