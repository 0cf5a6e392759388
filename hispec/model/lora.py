"""Low-rank adapters (LoRA) on the linear projections of a decoder, saved, loaded and merged.

A wrapped projection computes ``base(x) + scale * (x @ A^T) @ B^T`` with ``A`` (rank x in) random
and ``B`` (out x rank) zero at the start, so a fresh adapter changes nothing. Merging writes
``W' = W + scale * B @ A`` into the base weight (in float32, then the model's dtype), after which
the engine runs a plain model. Adapters are stored as a safetensors file next to a JSON manifest
that names the base model (a fingerprint of its weights), the rank, the targets and the training
settings and figures.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from hispec.errors import ConfigError, ModelLoadError
from hispec.paths import ASSETS

ADAPTER_FILE = "adapter.safetensors"
MANIFEST_FILE = "manifest.json"
FORMAT = "hispec-lora"
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
ALL_TARGETS = ATTENTION_TARGETS + MLP_TARGETS


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update that can be switched off."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.rank = rank
        self.scale = alpha / rank
        self.enabled = True
        # Adapters train in float32 whatever the base dtype (bfloat16 on a GPU).
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    @property
    def weight(self) -> torch.Tensor:  # transformers reads .weight (dtype, device) of projections
        return self.base.weight

    @property
    def bias(self):
        return self.base.bias

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if not self.enabled:
            return y
        update = (x.to(self.lora_A.dtype) @ self.lora_A.t()) @ self.lora_B.t()
        return y + (update * self.scale).to(y.dtype)

    def delta(self) -> torch.Tensor:
        """The weight change this adapter stands for: scale * B @ A (float32)."""
        return self.scale * (self.lora_B.detach().float() @ self.lora_A.detach().float())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    backbone = getattr(model, "model", None)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise ModelLoadError("LoRA needs a decoder-only model with model.model.layers (Llama family)")
    return list(layers)


def parse_targets(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """'all', 'attention', 'mlp' or a comma list of projection names."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    out: list[str] = []
    for item in items:
        group = {"all": ALL_TARGETS, "attention": ATTENTION_TARGETS, "mlp": MLP_TARGETS}.get(item, (item,))
        for name in group:
            if name not in ALL_TARGETS:
                raise ConfigError(f"unknown LoRA target '{name}'; choose from all, attention, mlp, "
                                  f"{', '.join(ALL_TARGETS)}")
            if name not in out:
                out.append(name)
    if not out:
        raise ConfigError(f"no LoRA target given; choose from all, attention, mlp, {', '.join(ALL_TARGETS)}")
    return tuple(out)


def _find_projection(layer: nn.Module, name: str) -> tuple[nn.Module, str]:
    for parent_name in ("self_attn", "mlp"):
        parent = getattr(layer, parent_name, None)
        if parent is not None and hasattr(parent, name):
            return parent, name
    raise ModelLoadError(f"this model's decoder layers have no projection '{name}' (Llama layout expected)")


def attach_lora(model: nn.Module, rank: int, alpha: float | None = None,
                targets: tuple[str, ...] = ALL_TARGETS, layers: list[int] | None = None,
                seed: int = 0) -> dict[str, LoRALinear]:
    """Wrap the chosen projections of the chosen layers; freeze everything else.

    Returns the adapters by module path ("model.layers.3.self_attn.q_proj").
    """
    if not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"LoRA rank must be a whole number >= 1, got {rank!r}")
    alpha = float(alpha if alpha is not None else rank)
    all_layers = decoder_layers(model)
    chosen = list(range(len(all_layers))) if layers is None else sorted(set(layers))
    for i in chosen:
        if not 0 <= i < len(all_layers):
            raise ConfigError(f"LoRA layer {i} does not exist: this model has layers 0..{len(all_layers) - 1}")
    for p in model.parameters():
        p.requires_grad_(False)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # the A matrices are reproducible from the seed
    adapters: dict[str, LoRALinear] = {}
    try:
        for i in chosen:
            for name in targets:
                parent, attr = _find_projection(all_layers[i], name)
                base = getattr(parent, attr)
                if isinstance(base, LoRALinear):
                    raise ConfigError(f"layer {i} {name} already carries a LoRA adapter")
                wrapped = LoRALinear(base, rank, alpha)
                setattr(parent, attr, wrapped)
                adapters[f"model.layers.{i}.{parent_name(parent, all_layers[i])}.{attr}"] = wrapped
    finally:
        torch.random.set_rng_state(gen_state)
    return adapters


def parent_name(parent: nn.Module, layer: nn.Module) -> str:
    return "self_attn" if parent is getattr(layer, "self_attn", None) else "mlp"


def find_adapters(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in find_adapters(model).values() for p in (m.lora_A, m.lora_B)]


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """{"<module>.lora_A": A, "<module>.lora_B": B} of every adapter (detached, float32, CPU)."""
    out = {}
    for name, m in find_adapters(model).items():
        out[f"{name}.lora_A"] = m.lora_A.detach().float().cpu().contiguous()
        out[f"{name}.lora_B"] = m.lora_B.detach().float().cpu().contiguous()
    return out


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    adapters = find_adapters(model)
    expected = {f"{n}.lora_{ab}" for n in adapters for ab in "AB"}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state))[:3], sorted(set(state) - expected)[:3]
        raise ConfigError(f"adapter tensors do not match the model's adapters (missing {missing}, unexpected {extra})")
    with torch.no_grad():
        for name, m in adapters.items():
            for ab, param in (("A", m.lora_A), ("B", m.lora_B)):
                t = state[f"{name}.lora_{ab}"]
                if t.shape != param.shape:
                    raise ConfigError(f"adapter tensor {name}.lora_{ab} has shape {tuple(t.shape)}, "
                                      f"the model needs {tuple(param.shape)} (other rank or model?)")
                param.copy_(t.to(param.dtype))


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Run the original model: every adapter switched off inside the block."""
    adapters = list(find_adapters(model).values())
    before = [m.enabled for m in adapters]
    for m in adapters:
        m.enabled = False
    try:
        yield
    finally:
        for m, was in zip(adapters, before):
            m.enabled = was


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the base weights (names, shapes and a sample of every tensor, float32).

    Adapters are excluded, so it names the base model whatever is attached to it.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        if ".lora_" in name:
            continue
        name = name.replace(".base.", ".")
        flat = p.detach().reshape(-1)
        sample = torch.cat([flat[:256], flat[-256:]]).float().cpu().numpy().tobytes()
        h.update(f"{name}:{tuple(p.shape)}:".encode())
        h.update(sample)
    return h.hexdigest()[:16]


def base_identity(model: nn.Module, name: str) -> dict:
    config = model.config
    return {"name": name, "model_type": getattr(config, "model_type", "?"),
            "num_layers": int(config.num_hidden_layers), "hidden_size": int(config.hidden_size),
            "vocab_size": int(config.vocab_size), "fingerprint": model_fingerprint(model)}


def save_adapter(model: nn.Module, out_dir: str | Path, manifest: dict, dtype: str = "float32") -> Path:
    """Write adapter.safetensors and manifest.json into out_dir (each written atomically)."""
    from safetensors.torch import save_file

    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise ConfigError(f"unknown adapter dtype '{dtype}'; choose {', '.join(dtypes)}")
    adapters = find_adapters(model)
    if not adapters:
        raise ConfigError("the model carries no LoRA adapter to save")
    first = next(iter(adapters.values()))
    state = {k: v.to(dtypes[dtype]).contiguous() for k, v in adapter_state(model).items()}
    manifest = dict(manifest, format=FORMAT, version=1, rank=first.rank, alpha=first.rank * first.scale,
                    scale=first.scale, dtype=dtype, modules=sorted(adapters))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _atomic(out / ADAPTER_FILE, lambda p: save_file(state, str(p), metadata={"format": FORMAT}))
    _atomic(out / MANIFEST_FILE, lambda p: Path(p).write_text(json.dumps(manifest, indent=1, sort_keys=True)))
    return out


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_adapter(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The manifest and the float32 tensors of a saved adapter; clear errors if it is not one."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / MANIFEST_FILE).is_file() or not (folder / ADAPTER_FILE).is_file():
        raise ModelLoadError(f"no adapter in {folder}: it needs {ADAPTER_FILE} and {MANIFEST_FILE}")
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{folder / MANIFEST_FILE} is not valid JSON ({exc.msg})") from None
    if manifest.get("format") != FORMAT:
        raise ModelLoadError(f"{folder / MANIFEST_FILE} is not a HiSpec LoRA manifest (format {FORMAT!r} expected)")
    tensors = {k: v.float() for k, v in load_file(str(folder / ADAPTER_FILE)).items()}
    return manifest, tensors


def merge_adapter(model: nn.Module, manifest: dict, tensors: dict[str, torch.Tensor],
                  check_base: bool = True) -> int:
    """W <- W + scale * B @ A for every adapted projection of a plain (unwrapped) model.

    Returns how many weights were changed. Refuses an adapter made for another base model.
    """
    if check_base:
        want = manifest.get("base", {}).get("fingerprint")
        have = model_fingerprint(model)
        if want and want != have:
            raise ModelLoadError(f"this adapter was trained on another base model (fingerprint {want}, "
                                 f"this model has {have}); use the base it names: {manifest['base'].get('name')}")
    scale = float(manifest["scale"])
    modules = dict(model.named_modules())
    changed = 0
    with torch.no_grad():
        for module_name in manifest["modules"]:
            target = modules.get(module_name)
            if target is None or not isinstance(getattr(target, "weight", None), torch.Tensor):
                raise ModelLoadError(f"the adapter names {module_name}, which this model does not have")
            a, b = tensors[f"{module_name}.lora_A"], tensors[f"{module_name}.lora_B"]
            w = target.weight
            if (b.shape[0], a.shape[1]) != tuple(w.shape):
                raise ModelLoadError(f"adapter for {module_name} is {b.shape[0]}x{a.shape[1]}, the weight is "
                                     f"{tuple(w.shape)}")
            merged = w.float() + scale * (b.to(w.device) @ a.to(w.device))
            w.copy_(merged.to(w.dtype))
            changed += 1
    return changed


def merge_attached(model: nn.Module) -> nn.Module:
    """Fold every attached adapter into its base weight and unwrap it (training -> plain model)."""
    layers = decoder_layers(model)
    with torch.no_grad():
        for layer in layers:
            for parent_attr in ("self_attn", "mlp"):
                parent = getattr(layer, parent_attr, None)
                if parent is None:
                    continue
                for attr, child in list(parent.named_children()):
                    if isinstance(child, LoRALinear):
                        w = child.base.weight
                        w.copy_((w.float() + child.delta().to(w.device)).to(w.dtype))
                        setattr(parent, attr, child.base)
    return model


# ---- the shipped early-exit adapter of the default model ("--model default-ee") ---------------

DEFAULT_EE_NAME = "default-ee"


def default_ee_folder() -> Path:
    """assets/default-ee (HISPEC_DEFAULT_EE overrides it)."""
    env = os.environ.get("HISPEC_DEFAULT_EE")
    return Path(env) if env else ASSETS / "default-ee"


def shipped_adapter() -> tuple[dict, dict[str, torch.Tensor]]:
    """The default-ee adapter, or a clear error when this copy of HiSpec does not ship one."""
    folder = default_ee_folder()
    if not (folder / ADAPTER_FILE).is_file() or not (folder / MANIFEST_FILE).is_file():
        raise ModelLoadError(
            f"model '{DEFAULT_EE_NAME}' needs the early-exit adapter of the default model ({folder / ADAPTER_FILE} "
            f"and {MANIFEST_FILE}), and this copy does not ship one. Use '--model default' for the original "
            "model, or train an adapter with 'python -m hispec train-ee --out DIR' (or scripts/gpu/gpu_train_ee.py "
            "on a GPU) and put its adapter.safetensors and manifest.json in that folder.")
    return read_adapter(folder)


def exit_defaults(manifest: dict, num_layers: int) -> dict:
    """The trained default exits of an adapter as the engine's exit info ({'default_layers': ...})."""
    pair = manifest.get("exits") or {}  # by role, as the engine's exits_by_role names them
    d, v = pair.get("draft"), pair.get("verify")
    info = {"kind": FORMAT, "base": manifest.get("base", {}).get("name"), "rank": manifest.get("rank")}
    if isinstance(d, int) and isinstance(v, int) and 0 < d < v < num_layers:
        info["default_layers"] = {"draft": d, "verify": v}
    return info
