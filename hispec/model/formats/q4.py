"""The model in its own format: a transformers model whose projections keep a GGUF file's 4-bit weights.

The default model ships as ``SmolLM2-135M-Instruct.Q4_1.gguf``: every decoder-layer projection in
Q4_1 (blocks of 32 weights along the input dimension, 4-bit values q with a float16 scale d and
minimum m per block, w = d * q + m) and the embedding, tied to the LM head, in Q8_0 (signed 8-bit
q, a float16 scale d per block of 32, w = d * q). ``to_q4`` swaps the model's linear layers and its
embedding for modules that hold exactly those bytes and multiply through the 4-bit kernel
(``q4_kernel``, csrc/q4_kernel.cpp): no re-quantisation, and no float32 copy of a weight matrix is
ever made for a product (the kernel widens each block in registers).

What stays float32: activations, norms, rotary tables, the KV cache, trained exit heads (their own
weights, and the LM-head rows of a head's vocabulary subset, which are the file's rows dequantised
once, exactly).

Each widened weight is the float32 value of the file's weight rounded once (d * q is exact in float32),
the same value the float32 path gets from dequantising the file, so the two formats differ only in
the order of the sums inside each product (the float32 path's oneDNN vs this kernel's blocks). Each
format is exact to itself: the kernel gives a row the same bits whatever the number of rows in the
pass, so speculative decoding in 4-bit reproduces 4-bit plain decoding token for token.

The modules fit every path that runs the model: the lean path (``kernel.fused`` asks a 4-bit linear
for its fused product), transformers' own layers and ``generate()`` (their ``forward``), and code
that reads a weight's shape, dtype, device or a few rows (``weight`` is a ``WeightView``, which
dequantises only what is indexed, or everything when a torch function is applied to it).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from hispec.model.formats import q4_kernel

QK = 32  # weights per block, both formats
Q4_1, Q8_0 = "Q4_1", "Q8_0"
FORMATS = (Q4_1, Q8_0)


class QuantizedMatrix:
    """An [N, K] weight in a file block format, rows = output features, on the CPU.

    Q4_1: ``qs`` uint8 [N, K/2] (per block 16 bytes: weight j in the low nibble of byte j, weight
    j + 16 in its high nibble), ``d`` and ``m`` float16 [N, K/32] (stored as int16 bit patterns).
    Q8_0: ``qs`` int8 [N, K], ``d`` float16 [N, K/32]; ``m`` is None."""

    def __init__(self, kind: str, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, shape: tuple[int, int]):
        if kind not in FORMATS:
            raise ValueError(f"unknown block format {kind}; this kernel runs {', '.join(FORMATS)}")
        N, K = shape
        if K % QK:
            raise ValueError(f"{kind} rows must hold whole blocks of {QK} (got {K} input features)")
        nb = K // QK
        d, m = _bits(d), None if m is None else _bits(m)
        expect_qs = (N, K // 2) if kind == Q4_1 else (N, K)
        if tuple(qs.shape) != expect_qs or tuple(d.shape) != (N, nb) or (kind == Q4_1) != (m is not None) \
                or (m is not None and tuple(m.shape) != (N, nb)):
            raise ValueError(f"{kind} [{N}, {K}]: the block arrays have the wrong shapes")
        self.kind, self.shape = kind, (int(N), int(K))
        self.qs = qs.contiguous()
        self.d = d.contiguous()
        self.m = None if m is None else m.contiguous()
        self._calls = {}  # arithmetic (wide or not) -> the kernel call, bound at its first product

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)

    # ---- the product ----------------------------------------------------------------------------
    def matmul(self, x: torch.Tensor, wide: bool = False) -> torch.Tensor:
        """x (..., K) float32 -> x @ W.T (..., N) float32, through the kernel: in the 4-bit arithmetic, or
        `wide`, each weight widened to its float32 value first (the float32 model's products; the kernel's
        header says how the two sum)."""
        N, K = self.shape
        if x.dtype != torch.float32 or not x.is_cpu or x.shape[-1] != K:
            raise TypeError(f"the 4-bit kernel takes float32 inputs on the CPU with {K} features "
                            f"(got {x.dtype}, {tuple(x.shape)}, on {x.device})")
        if not x.is_contiguous():
            x = x.contiguous()
        M = x.numel() // K
        out = torch.empty(x.shape[:-1] + (N,), dtype=torch.float32)
        if M:
            call = self._calls.get(wide) or self._calls.setdefault(wide, self._bind(wide))
            call(x.data_ptr(), M, out.data_ptr(), torch.get_num_threads())
        return out

    def _bind(self, wide: bool):
        """The kernel call with this matrix's pointers fixed (its tensors live as long as it does)."""
        lib, (N, K) = q4_kernel.lib(), self.shape
        qs, d = self.qs.data_ptr(), self.d.data_ptr()
        if self.kind == Q4_1:
            fn, m = lib.hispec_q41_matmul_w if wide else lib.hispec_q41_matmul, self.m.data_ptr()
            return lambda x, M, out, t: fn(x, M, K, qs, d, m, N, out, N, t)
        fn = lib.hispec_q80_matmul_w if wide else lib.hispec_q80_matmul
        return lambda x, M, out, t: fn(x, M, K, qs, d, N, out, N, t)

    # ---- exact float32 values (rows for lookups and slices; everything only when asked) ----------
    def rows(self, ids) -> torch.Tensor:
        """Rows `ids` (int, slice, list or LongTensor) as float32: d * q (+ m), exactly the file's values."""
        N, K = self.shape
        single = isinstance(ids, int)
        if isinstance(ids, slice):
            ids = torch.arange(N)[ids]
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        ids = torch.where(ids < 0, ids + N, ids)
        d = self.d[ids].view(torch.float16).float().repeat_interleave(QK, dim=-1)
        if self.kind == Q8_0:
            values = self.qs[ids].float() * d  # exact: an 11-bit scale times an 8-bit integer
        else:
            packed = self.qs[ids].view(len(ids), K // QK, QK // 2)
            q = torch.cat([packed & 15, packed >> 4], dim=-1).reshape(len(ids), K).float()
            m = self.m[ids].view(torch.float16).float().repeat_interleave(QK, dim=-1)
            values = q * d + m  # d * q is exact, so this is the once-rounded value, as in the kernel
        return values[0] if single else values

    def dequantize(self) -> torch.Tensor:
        """The whole matrix as float32 (tests, and copies that code asks for explicitly)."""
        return self.rows(slice(None))

    # ---- building -----------------------------------------------------------------------------------
    @staticmethod
    def cat(matrices: list["QuantizedMatrix"]) -> "QuantizedMatrix":
        """Rows of several matrices of one format stacked (one fused product for q/k/v or gate/up)."""
        kinds = {m.kind for m in matrices}
        ks = {m.shape[1] for m in matrices}
        if len(kinds) != 1 or len(ks) != 1:
            raise ValueError("only matrices of one block format and one input size can be fused")
        if len(matrices) == 1:
            return matrices[0]
        first = matrices[0]
        return QuantizedMatrix(first.kind, torch.cat([m.qs for m in matrices]), torch.cat([m.d for m in matrices]),
                               None if first.m is None else torch.cat([m.m for m in matrices]),
                               (sum(m.shape[0] for m in matrices), first.shape[1]))

    def take_rows(self, index: torch.Tensor) -> "QuantizedMatrix":
        """Rows `index` of the matrix, reordered or a subset (whole rows: blocks run along the input dimension)."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        return QuantizedMatrix(self.kind, self.qs[index], self.d[index], None if self.m is None else self.m[index],
                               (len(index), self.shape[1]))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """float16 scales kept as their int16 bit patterns (nothing casts them by accident)."""
    return t.view(torch.int16) if t.dtype == torch.float16 else t


# ---- quantisers (tests and tiny models; the default model uses the file's own values) --------------------
def quantize_q4_1(weight: torch.Tensor) -> QuantizedMatrix:
    """ggml's reference Q4_1: per block min and (max - min) / 15, values rounded to 0..15."""
    w = weight.detach().float().cpu()
    N, K = w.shape
    blocks = w.reshape(N, K // QK, QK)
    lo, hi = blocks.min(-1).values, blocks.max(-1).values
    d = ((hi - lo) / 15).half()
    m = lo.half()
    inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(lo))
    q = ((blocks - m.float()[..., None]) * inv[..., None] + 0.5).floor().clamp(0, 15).to(torch.uint8)
    qs = (q[..., : QK // 2] | (q[..., QK // 2 :] << 4)).reshape(N, K // 2)
    return QuantizedMatrix(Q4_1, qs, d, m, (N, K))


def quantize_q8_0(weight: torch.Tensor) -> QuantizedMatrix:
    """ggml's reference Q8_0: per block scale max|w| / 127, values rounded to -127..127."""
    w = weight.detach().float().cpu()
    N, K = w.shape
    blocks = w.reshape(N, K // QK, QK)
    d = (blocks.abs().max(-1).values / 127).half()
    inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(d.float()))
    q = (blocks * inv[..., None]).round().clamp(-127, 127).to(torch.int8)
    return QuantizedMatrix(Q8_0, q.reshape(N, K), d, None, (N, K))


# ---- the weight as other code sees it -----------------------------------------------------------------
class WeightView:
    """What ``module.weight`` is for a 4-bit module: shape, dtype (float32, the compute dtype),
    device, and rows on indexing (``weight[ids]``, exact float32), without a float32 copy of the
    matrix. Any torch function applied to it (torch.cat, F.linear, ...) gets the dequantised matrix:
    an explicit copy for code that builds something from the weights (e.g. attention exit heads
    starting from a layer's attention), never the path of a product in the decode loop."""

    dtype = torch.float32
    device = torch.device("cpu")
    requires_grad = False
    is_quantized_view = True

    def __init__(self, matrix: QuantizedMatrix):
        self.matrix = matrix
        self.shape = torch.Size(matrix.shape)

    ndim = property(lambda self: 2)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def dim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def detach(self) -> "WeightView":
        return self

    def __getitem__(self, index):
        if isinstance(index, tuple):
            rows, rest = index[0], index[1:]
            return self.matrix.rows(rows)[(slice(None),) * (0 if isinstance(rows, int) else 1) + rest]
        if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            index = index.nonzero().reshape(-1)
        return self.matrix.rows(index)

    def dequantize(self) -> torch.Tensor:
        return self.matrix.dequantize()

    float = clone = contiguous = cpu = dequantize

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.dequantize().to(*args, **kwargs)

    def __repr__(self) -> str:
        return f"WeightView({self.matrix.kind}, shape={tuple(self.shape)})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        real = lambda a: a.dequantize() if isinstance(a, WeightView) else a  # noqa: E731
        return func(*tree_map(real, args), **tree_map(real, kwargs or {}))


class Q4Linear(nn.Module):
    """A linear layer on a file-format weight (Q4_1 or Q8_0): y = x @ W.T (+ bias), float32 in and out."""

    def __init__(self, matrix: QuantizedMatrix, bias: torch.Tensor | None = None):
        super().__init__()
        self.matrix = matrix
        self.out_features, self.in_features = matrix.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @property
    def weight(self) -> WeightView:
        return WeightView(self.matrix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matrix.matmul(x)
        return y if self.bias is None else y + self.bias

    @staticmethod
    def fuse(linears: list["Q4Linear"]) -> "Q4Projection":
        """One product for several linears (outputs concatenated): the lean path's fused q/k/v, gate/up."""
        bias = None
        if any(m.bias is not None for m in linears):
            bias = torch.cat([m.bias.detach() if m.bias is not None else torch.zeros(m.out_features)
                              for m in linears])
        return Q4Projection(QuantizedMatrix.cat([m.matrix for m in linears]), bias)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.matrix.kind}"


class Q4Projection:
    """The lean kernel's projection interface (kernel.Projection) over a file-format weight."""

    packed = False

    def __init__(self, matrix: QuantizedMatrix, bias: torch.Tensor | None):
        self.matrix, self.bias = matrix, bias
        self.out_features = matrix.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matrix.matmul(x)
        return y if self.bias is None else y + self.bias


class WideProjection(Q4Projection):
    """A float32 model's projection on the file's blocks its weights were dequantised from: the same
    values, widened in registers (``QuantizedMatrix.matmul(wide=True)``), so the product reads 4.5 bits
    per weight instead of 32 and gives each row the same bits whatever rows share the pass."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matrix.matmul(x, wide=True)
        return y if self.bias is None else y + self.bias


def blocks_of(model: nn.Module, matrices: dict[str, QuantizedMatrix]) -> dict[int, QuantizedMatrix]:
    """The float32 model's linear modules (by id) -> the file's blocks that hold exactly their weights.

    Every decoder-layer projection and the LM head must have one (a tied head shares the embedding's).
    Each is checked before use: shape, and three rows (first, middle, last) equal value for value to the
    module's float32 weight (the file dequantised: the very numbers, not a computation of them). A file
    that does not match the model raises ValueError, naming the tensor."""
    backbone, out = model.model, {}
    wanted = [(f"model.layers.{i}.{part}.{name}", getattr(getattr(layer, part), name))
              for i, layer in enumerate(backbone.layers) for part, names in PROJECTIONS.items() for name in names]
    head_key = "lm_head" if "lm_head" in matrices or model.lm_head.weight is not backbone.embed_tokens.weight \
        else "model.embed_tokens"
    wanted.append((head_key, model.lm_head))
    for key, module in wanted:
        matrix = matrices.get(key)
        if matrix is None:
            raise ValueError(f"{key}: the file has no blocks for this weight")
        _check(matrix, module, key)
        N = matrix.shape[0]
        rows = torch.tensor([0, N // 2, N - 1])
        if not torch.equal(matrix.rows(rows), module.weight.detach()[rows].float().cpu()):
            raise ValueError(f"{key}: the file's blocks are not the model's float32 weights (another file or conversion)")
        out[id(module)] = matrix
    return out


def wide_fuse(blocks: dict[int, QuantizedMatrix]):
    """``kernel.fused``'s twin for a float32 model on its file's blocks: several linears -> one
    WideProjection over their blocks stacked (q/k/v, gate/up)."""
    def fuse(linears: list[nn.Module], pack: bool) -> WideProjection:
        bias = None
        if any(m.bias is not None for m in linears):
            bias = torch.cat([m.bias.detach().float() if m.bias is not None else torch.zeros(m.out_features)
                              for m in linears])
        return WideProjection(QuantizedMatrix.cat([blocks[id(m)] for m in linears]), bias)
    return fuse


class Q8Embedding(nn.Module):
    """The token embedding in the file's Q8_0: a lookup dequantises only the rows it reads (exact)."""

    def __init__(self, matrix: QuantizedMatrix, padding_idx: int | None = None):
        super().__init__()
        self.matrix = matrix
        self.num_embeddings, self.embedding_dim = matrix.shape
        self.padding_idx = padding_idx

    @property
    def weight(self) -> WeightView:
        return WeightView(self.matrix)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.matrix.rows(ids.reshape(-1)).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.matrix.kind}"


# ---- a model in 4-bit -----------------------------------------------------------------------------------
PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def is_q4(model: nn.Module) -> bool:
    return isinstance(getattr(getattr(model, "model", None), "embed_tokens", None), Q8Embedding)


def to_q4(model: nn.Module, matrices: dict[str, QuantizedMatrix] | None = None) -> nn.Module:
    """Swap the decoder layers' projections, the embedding and the LM head for 4-bit modules, in place.

    `matrices`: weights by transformers parameter name without ``.weight`` (``model.layers.0.self_attn.q_proj``,
    ``model.embed_tokens``, ``lm_head``), e.g. from ``read_gguf``; names missing from it (or all, when
    None) are quantised here (Q4_1 for projections, Q8_0 for the embedding and LM head: tests and tiny models).
    A tied LM head shares the embedding's bytes. The float32 weights replaced are released."""
    matrices = dict(matrices or {})
    reason = q4_kernel.unavailable_reason()
    if reason:
        raise q4_kernel.KernelUnavailable(reason)
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("4-bit weights run on the CPU only (the kernel is x86 AVX2/AVX-512 code)")
    backbone = model.model
    with torch.no_grad():
        for i, layer in enumerate(backbone.layers):
            for part, names in PROJECTIONS.items():
                parent = getattr(layer, part)
                for name in names:
                    linear = getattr(parent, name)
                    key = f"model.layers.{i}.{part}.{name}"
                    matrix = matrices.get(key) or quantize_q4_1(linear.weight)
                    _check(matrix, linear, key)
                    setattr(parent, name, Q4Linear(matrix, linear.bias))
        embed = backbone.embed_tokens
        tied = model.lm_head.weight is embed.weight
        matrix = matrices.get("model.embed_tokens") or quantize_q8_0(embed.weight)
        _check(matrix, embed, "model.embed_tokens")
        backbone.embed_tokens = Q8Embedding(matrix, embed.padding_idx)
        if tied and "lm_head" not in matrices:
            head_matrix = matrix
        else:
            head_matrix = matrices.get("lm_head") or quantize_q8_0(model.lm_head.weight)
            _check(head_matrix, model.lm_head, "lm_head")
        model.lm_head = Q4Linear(head_matrix, getattr(model.lm_head, "bias", None))
    model.hispec_weights = "q4"
    return model


def q4_copy(model: nn.Module, matrices: dict[str, QuantizedMatrix] | None = None) -> nn.Module:
    """A 4-bit copy of a float32 model (``to_q4`` on a deep copy): the original keeps its weights. With a
    GGUF file's `matrices`, the copy holds the very values the float32 model was dequantised from."""
    import copy

    return to_q4(copy.deepcopy(model), matrices)


def _check(matrix: QuantizedMatrix, module: nn.Module, key: str) -> None:
    shape = tuple(module.weight.shape)
    if tuple(matrix.shape) != shape:
        raise ValueError(f"{key}: the file's weight is {list(matrix.shape)}, the model's {list(shape)}")


def step_bytes(ee) -> int:
    """Bytes of weights a plain step of an EarlyExitModel reads: a float32 model on its file's blocks reads
    the blocks (once each) and its float parameters other than the linears' (norms); others, weight_bytes."""
    if getattr(ee, "blocks", None) is None:
        return weight_bytes(ee.model)
    matrices = {id(m): m for m in ee.blocks.values()}
    # not read as float weights: the linears' (their blocks instead) and the embedding's (a lookup reads rows)
    skip = {id(p) for module in ee.model.modules() if id(module) in ee.blocks for p in module.parameters()}
    skip.add(id(ee.model.model.embed_tokens.weight))
    rest = sum(p.numel() * p.element_size() for p in ee.model.parameters() if id(p) not in skip)
    return sum(m.nbytes for m in matrices.values()) + rest


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every weight the model reads (4-bit blocks counted once, plus float parameters)."""
    seen, total = set(), 0
    for module in model.modules():
        matrix = getattr(module, "matrix", None)
        if isinstance(matrix, QuantizedMatrix) and id(matrix) not in seen:
            seen.add(id(matrix))
            total += matrix.nbytes
    return total + sum(p.numel() * p.element_size() for p in model.parameters())


def load_gguf_weights(model: nn.Module, path: str | Path, cache_dir: str | Path | None = None) -> nn.Module:
    """The model (loaded in float32 from the same file's conversion) on the file's own blocks.
    `cache_dir`: where the blocks are kept once read (``q4-blocks.safetensors``: the same bytes, in the
    arrays the kernel reads), so that later loads skip the GGUF's slow metadata parsing."""
    return to_q4(model, cached_gguf(path, model.config, cache_dir) if cache_dir else read_gguf(path, model.config))


BLOCKS_FILE = "q4-blocks.safetensors"


def cached_gguf(path: str | Path, config, cache_dir: str | Path) -> dict[str, QuantizedMatrix]:
    """read_gguf through a cache file beside the converted model (written once, atomically)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    target = Path(cache_dir) / BLOCKS_FILE
    source = Path(path)
    stamp = f"{source.name}:{source.stat().st_size}"
    if target.is_file():
        try:
            with safe_open(str(target), "pt") as f:
                meta = f.metadata() or {}
                if meta.get("source") == stamp:
                    kinds = json.loads(meta["kinds"])
                    out = {}
                    for key, (kind, n, k) in kinds.items():
                        m = f.get_tensor(f"{key}.m") if kind == Q4_1 else None
                        out[key] = QuantizedMatrix(kind, f.get_tensor(f"{key}.qs"), f.get_tensor(f"{key}.d"), m, (n, k))
                    return out
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            pass  # unreadable or stale: read the GGUF again and rewrite it
    matrices = read_gguf(source, config)
    tensors, kinds = {}, {}
    for key, matrix in matrices.items():
        kinds[key] = (matrix.kind, *matrix.shape)
        tensors[f"{key}.qs"], tensors[f"{key}.d"] = matrix.qs, matrix.d
        if matrix.m is not None:
            tensors[f"{key}.m"] = matrix.m
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=BLOCKS_FILE + ".", dir=target.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"source": stamp, "kinds": json.dumps(kinds)})
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return matrices


# ---- reading a GGUF file ---------------------------------------------------------------------------------
GGUF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}


def read_gguf(path: str | Path, config) -> dict[str, QuantizedMatrix]:
    """The projections, embedding and LM head of a Llama-family GGUF file, as stored (Q4_1 / Q8_0),
    under transformers' names. The q and k rows are put back in transformers' order (llama.cpp's
    converter permutes them for its rotary layout; the permutation moves whole rows, not blocks)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    out: dict[str, QuantizedMatrix] = {}
    for tensor in reader.tensors:
        name = tensor.name.removesuffix(".weight")
        if name == "token_embd":
            key = "model.embed_tokens"
        elif name == "output":
            key = "lm_head"
        elif name.startswith("blk.") and name.split(".", 2)[2] in GGUF_NAMES:
            layer, kind = name.split(".", 2)[1:]
            key = f"model.layers.{layer}.{GGUF_NAMES[kind]}"
        else:
            continue  # norms (float32) come from the converted model
        kind = tensor.tensor_type.name
        if kind not in FORMATS:
            raise ValueError(f"{path}: {tensor.name} is stored as {kind}; the 4-bit kernel runs {', '.join(FORMATS)}")
        K, N = (int(v) for v in tensor.shape[:2])
        raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8, copy=True)).reshape(N, K // QK, -1)
        if kind == Q4_1:  # block: d (f16), m (f16), 16 bytes of nibbles
            matrix = QuantizedMatrix(Q4_1, raw[..., 4:].reshape(N, K // 2), raw[..., 0:2].contiguous().view(torch.int16)[..., 0],
                                     raw[..., 2:4].contiguous().view(torch.int16)[..., 0], (N, K))
        else:  # block: d (f16), 32 signed bytes
            matrix = QuantizedMatrix(Q8_0, raw[..., 2:].reshape(N, K).view(torch.int8),
                                     raw[..., 0:2].contiguous().view(torch.int16)[..., 0], None, (N, K))
        if key.endswith("q_proj") or key.endswith("k_proj"):
            n = heads if key.endswith("q_proj") else kv_heads
            matrix = matrix.take_rows(torch.arange(N).reshape(n, N // n // 2, 2).transpose(1, 2).reshape(N))
        out[key] = matrix
    return out
