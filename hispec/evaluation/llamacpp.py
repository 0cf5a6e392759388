"""llama.cpp as a benchmark baseline: plain greedy decoding of the same GGUF file, same token ids.

An optional extra (``pip install -r requirements-llamacpp.txt``: llama-cpp-python compiles llama.cpp
from source, 15-40 minutes on 2 cores). Without it the ``llamacpp`` bench method fails with a clear
message before any prompt runs (``check``). The model is the default model's own file (Q4_1 layers,
Q8_0 embedding), loaded once per process with as many threads as torch uses; each generation starts
from a reset cache, is timed from the prompt's evaluation to the last token (as our methods are),
and stops at the budget or an end-of-text token.
"""

from __future__ import annotations

import importlib.util
import time

import torch

from hispec.errors import ConfigError

INSTALL = "pip install -r requirements-llamacpp.txt  (llama-cpp-python; it compiles llama.cpp, 15-40 min on 2 cores)"
_models: dict[tuple, object] = {}


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def check(lm) -> None:
    """Raise ConfigError unless the llamacpp method can run for this loaded model."""
    if not available():
        raise ConfigError(f"the llamacpp method needs llama-cpp-python, which is not installed: {INSTALL}")
    if lm.name != "default":
        raise ConfigError(f"the llamacpp method runs the default model's GGUF file; '{lm.name}' has none")


def model(n_ctx: int = 2048):
    """The default model's GGUF in llama.cpp, one per (context, threads)."""
    from llama_cpp import Llama

    from hispec.model.loading import default_gguf_path

    threads = torch.get_num_threads()
    key = (n_ctx, threads)
    if key not in _models:
        _models[key] = Llama(model_path=str(default_gguf_path()), n_ctx=n_ctx, n_threads=threads,
                             n_threads_batch=threads, n_batch=512, verbose=False)
    return _models[key]


def version() -> str | None:
    if not available():
        return None
    import llama_cpp

    return getattr(llama_cpp, "__version__", "?")


def run(lm, ids: list[int], max_new_tokens: int) -> dict:
    """Greedy decoding of `ids` by llama.cpp: the bench record (token ids, wall time, tokens/s)."""
    check(lm)
    llm = model()
    eos = set(lm.eos_ids)
    out: list[int] = []
    t0 = time.perf_counter()
    if max_new_tokens > 0:
        for token in llm.generate(list(ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if token in eos or len(out) >= max_new_tokens:
                break
    wall = time.perf_counter() - t0
    return {"token_ids": out, "wall_s": wall, "tokens_per_s": len(out) / wall if wall > 0 else 0.0,
            "engine": f"llama-cpp-python {version()}"}
