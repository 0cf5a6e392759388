"""The default model's weights in a compact, carriable form: the GGUF's raw quantized blocks.

The GPU machine takes at most 64 MiB of files per call and has no `gguf` package, while the
default model is a 98 MB GGUF (Q4_1 layers, Q8_0 embeddings) and 538 MB once dequantized to
float32. This module copies the GGUF's quantized blocks, byte for byte, into safetensors parts
of at most ``max_part_mb`` each (uint8 tensors; the quant type, shape and the row permutation of
q/k that transformers undoes are kept in the metadata), with the model's config.json. Unpacking
dequantizes them with torch (the same float32 arithmetic as gguf-py), so the rebuilt model is
bit-identical to ``load_model("default")`` - ``pack.json`` records its fingerprint to check.

    pack_default(folder)            # here, needs the gguf package: writes part files + config
    build_model(folder)             # anywhere with torch + transformers: the float32 model
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hispec.errors import ModelLoadError
from hispec.model.default_gguf import sha256_of

PACK_FILE = "pack.json"
# GGUF quant types used by the default model: (bytes per block of 32 weights)
TYPE_SIZE = {"Q8_0": 34, "Q4_1": 20, "F32": 4, "F16": 2}
BLOCK = 32


def _hf_name(gguf_name: str) -> tuple[str, str | None]:
    """GGUF tensor name -> (transformers Llama name, 'q' / 'k' when rows were permuted)."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if gguf_name in fixed:
        return fixed[gguf_name], None
    parts = gguf_name.split(".")
    if parts[0] != "blk" or len(parts) != 4:
        raise ModelLoadError(f"unexpected GGUF tensor {gguf_name}")
    i, kind = parts[1], parts[2]
    table = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    if kind not in table:
        raise ModelLoadError(f"unexpected GGUF tensor {gguf_name}")
    permute = {"attn_q": "q", "attn_k": "k"}.get(kind)
    return f"model.layers.{i}.{table[kind]}.{parts[3]}", permute


def pack_gguf(gguf_path: str | Path, config_folder: str | Path, out: str | Path, max_part_mb: float = 48.0,
              fingerprint: str | None = None) -> dict:
    """Copy the GGUF's tensors into safetensors parts (raw blocks) + config.json + pack.json."""
    import gguf  # only needed here, never on the GPU machine
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(gguf_path))
    limit = int(max_part_mb * 2**20)
    parts: list[dict[str, torch.Tensor]] = [{}]
    described: list[dict[str, dict]] = [{}]
    size = 0
    for t in reader.tensors:
        qtype = t.tensor_type.name
        if qtype not in TYPE_SIZE:
            raise ModelLoadError(f"GGUF tensor {t.name} has quant type {qtype}; supported: {', '.join(TYPE_SIZE)}")
        name, permute = _hf_name(t.name)
        cols, rows = (int(t.shape[0]), int(t.shape[1])) if len(t.shape) == 2 else (int(t.shape[0]), 1)
        raw = torch.from_numpy(t.data.view("uint8").reshape(-1).copy())
        if size and size + raw.numel() > limit:
            parts.append({})
            described.append({})
            size = 0
        parts[-1][name] = raw
        described[-1][name] = {"type": qtype, "shape": [rows, cols] if len(t.shape) == 2 else [cols],
                               "permute": permute}
        size += raw.numel()
    files = []
    for n, (tensors, desc) in enumerate(zip(parts, described), 1):
        path = out / f"base-part{n}.safetensors"
        save_file(tensors, str(path), metadata={"tensors": json.dumps(desc)})
        files.append({"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_of(path)})
    for name in ("config.json", "generation_config.json"):
        if (Path(config_folder) / name).is_file():
            shutil.copy(Path(config_folder) / name, out / name)
    pack = {"source": Path(gguf_path).name, "parts": files, "fingerprint": fingerprint}
    (out / PACK_FILE).write_text(json.dumps(pack, indent=1))
    return pack


def dequantize(raw: torch.Tensor, qtype: str, shape: list[int]) -> torch.Tensor:
    """float32 weights from GGUF blocks, with gguf-py's arithmetic (d * q + m in float32)."""
    numel = 1
    for s in shape:
        numel *= s
    if qtype == "F32":
        return raw.view(torch.float32).reshape(shape).clone()
    if qtype == "F16":
        return raw.view(torch.float16).float().reshape(shape)
    blocks = raw.reshape(-1, TYPE_SIZE[qtype])
    if qtype == "Q8_0":
        d = blocks[:, :2].contiguous().view(torch.float16).float()
        q = blocks[:, 2:].contiguous().view(torch.int8).float()
        values = q * d
    else:  # Q4_1: d, m, then 16 bytes: low nibbles are weights 0..15, high nibbles 16..31
        d = blocks[:, 0:2].contiguous().view(torch.float16).float()
        m = blocks[:, 2:4].contiguous().view(torch.float16).float()
        qs = blocks[:, 4:]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=1).float()
        values = (d * q) + m
    if values.numel() != numel:
        raise ModelLoadError(f"GGUF block data of {values.numel()} values does not fit shape {shape}")
    return values.reshape(shape)


def _reverse_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's row interleaving of q/k (as transformers' GGUF loader does)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def check_parts(folder: str | Path) -> dict:
    """pack.json of a folder whose part files are all there and intact (clear error otherwise)."""
    folder = Path(folder)
    if not (folder / PACK_FILE).is_file():
        raise ModelLoadError(f"{folder} holds no {PACK_FILE}: not a packed model")
    pack = json.loads((folder / PACK_FILE).read_text())
    for part in pack["parts"]:
        path = folder / part["file"]
        if not path.is_file():
            raise ModelLoadError(f"{path} is missing (carried in another call?): all parts are needed")
        if sha256_of(path) != part["sha256"]:
            raise ModelLoadError(f"{path} is damaged or incomplete (sha256 differs from {PACK_FILE})")
    return pack


def unpack_state(folder: str | Path, config) -> dict[str, torch.Tensor]:
    """The float32 state dict (transformers names) of a packed model."""
    from safetensors import safe_open

    folder = Path(folder)
    pack = check_parts(folder)
    state: dict[str, torch.Tensor] = {}
    heads = {"q": config.num_attention_heads, "k": config.num_key_value_heads or config.num_attention_heads}
    for part in pack["parts"]:
        with safe_open(str(folder / part["file"]), framework="pt") as f:
            desc = json.loads(f.metadata()["tensors"])
            for name, d in desc.items():
                w = dequantize(f.get_tensor(name), d["type"], d["shape"])
                if d["permute"]:
                    w = _reverse_permute(w, heads[d["permute"]])
                state[name] = w
    return state


def build_model(folder: str | Path, device: str = "cpu"):
    """The packed model as a float32 LlamaForCausalLM; checks the fingerprint recorded at packing."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hispec.model.lora import model_fingerprint

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    state = unpack_state(folder, config)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    if getattr(config, "tie_word_embeddings", False):
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"packed weights do not fit the config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    want = json.loads((folder / PACK_FILE).read_text()).get("fingerprint")
    if want and model_fingerprint(model) != want:
        raise ModelLoadError(f"the rebuilt model's fingerprint {model_fingerprint(model)} differs from the packed "
                             f"{want}: the dequantization is not exact here")
    return model.to(device).eval()
