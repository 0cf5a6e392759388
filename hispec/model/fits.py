"""Whether a model fits before any weight is read: memory (weights + 20%) and disk."""

from __future__ import annotations

import shutil
from pathlib import Path

from hispec.errors import ModelLoadError


def model_bytes(source: str) -> int | None:
    """Size of a local model folder's weights, or None when it cannot be known without a download."""
    path = Path(source).expanduser()
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".gguf", ".pt"))


def check_fits(name: str, size: int | None, device: str, free_memory: int | None = None,
               free_disk: int | None = None) -> None:
    """Refuse a model that would not fit in memory (weights + 20%), instead of crashing the process."""
    if size is None:
        return
    if free_memory is None:
        if device.startswith("cuda"):
            import torch

            free_memory = torch.cuda.mem_get_info()[0]
        else:
            free_memory = _available_ram()
    if free_memory is not None and size * 1.2 > free_memory:
        raise ModelLoadError(f"model '{name}' needs about {size / 2**30:.1f} GiB but only "
                             f"{free_memory / 2**30:.1f} GiB of memory is free on {device}")
    if free_disk is not None and size > free_disk:
        raise ModelLoadError(f"model '{name}' needs about {size / 2**30:.1f} GiB of disk, "
                             f"only {free_disk / 2**30:.1f} GiB is free")


def _available_ram() -> int | None:
    try:
        import psutil

        return psutil.virtual_memory().available
    except ImportError:  # pragma: no cover
        return None


def free_disk_bytes(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free
