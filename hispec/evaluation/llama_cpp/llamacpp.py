"""llama.cpp as a benchmark peer: greedy decoding of the same GGUF file, same token ids.

Two peers: ``llamacpp``, its plain decoding, and ``llamacpp_lookup``, its own n-gram prompt lookup
(llama-cpp-python's ``LlamaPromptLookupDecoding`` draft model at its defaults, ``max_ngram_size`` 2 and
``num_pred_tokens`` 10; ``llamacpp_lookup:N`` drafts N). An optional extra (``pip install -r
requirements-llamacpp.txt``: llama-cpp-python compiles llama.cpp from source, 15-40 minutes on 2
cores). Without it these bench methods fail with a clear message before any prompt runs (``check``).
The model is the default model's own file (Q4_1 layers, Q8_0 embedding), loaded once per process and
peer with as many threads as torch uses. The peers' names and counts are the bench's peer table's
(hispec/evaluation/peers.py). Each generation starts from an empty cache (``Llama.reset``:
``generate(reset=True)`` alone keeps the longest prefix shared with the previous prompt, the chat
template's opening, which would time the next prompt's evaluation short), is timed from the prompt's
evaluation to the last token (as our methods are), and stops at the budget or an end-of-text token.
"""

from __future__ import annotations

import importlib.util
import time

import torch

from hispec.errors import ConfigError
from hispec.evaluation.timing import timed_record

PLAIN, LOOKUP = "llamacpp", "llamacpp_lookup"
LOOKUP_DEFAULTS = {"max_ngram_size": 2, "num_pred_tokens": 10}  # LlamaPromptLookupDecoding's own defaults
INSTALL = "pip install -r requirements-llamacpp.txt  (llama-cpp-python; it compiles llama.cpp, 15-40 min on 2 cores)"
_models: dict[tuple, object] = {}


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def missing() -> str | None:
    """Why the llama.cpp peers cannot run on this machine (None: they can)."""
    return None if available() else f"it needs llama-cpp-python, which is not installed: {INSTALL}"


def refuses(lm) -> str | None:
    """Why the llama.cpp peers cannot run for this loaded model (None: they can)."""
    return None if lm.name == "default" else f"it runs the default model's GGUF file; '{lm.name}' has none"


def check(lm) -> None:
    """Raise ConfigError unless the llamacpp method can run for this loaded model."""
    why = missing() or refuses(lm)
    if why:
        raise ConfigError(f"the llamacpp method cannot run: {why}")


def model(n_ctx: int = 2048, lookup: int | None = None):
    """The default model's GGUF in llama.cpp, one per (context, threads, lookup tokens). A lookup peer
    has the n-gram draft model and keeps every position's logits (which that draft model needs)."""
    from llama_cpp import Llama

    from hispec.model.loading import default_gguf_path

    threads = torch.get_num_threads()
    key = (n_ctx, threads, lookup)
    if key not in _models:
        extra = {}
        if lookup is not None:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            extra = {"logits_all": True, "draft_model": LlamaPromptLookupDecoding(
                max_ngram_size=LOOKUP_DEFAULTS["max_ngram_size"], num_pred_tokens=lookup)}
        _models[key] = Llama(model_path=str(default_gguf_path()), n_ctx=n_ctx, n_threads=threads,
                             n_threads_batch=threads, n_batch=512, verbose=False, **extra)
    return _models[key]


def settings(lookup: int | None = None) -> dict:
    """What a peer ran with, for its bench record (`lookup`: the lookup peer's drafted tokens)."""
    n = lookup
    return {"engine": f"llama-cpp-python {version()}", "threads": torch.get_num_threads(), "cache": "reset per prompt",
            **({"lookup": {**LOOKUP_DEFAULTS, "num_pred_tokens": n}} if n is not None else {})}


def version() -> str | None:
    if not available():
        return None
    import llama_cpp

    return getattr(llama_cpp, "__version__", "?")


def run(lm, ids: list[int], max_new_tokens: int, lookup: int | None = None) -> dict:
    """Greedy decoding of `ids` by llama.cpp (`lookup`: its n-gram lookup drafting that many tokens; None:
    plain decoding): the bench record (token ids, wall time, tokens/s, the peer's settings)."""
    check(lm)
    llm = model(lookup=lookup)
    llm.reset()  # an empty cache: nothing of the previous prompt is reused (outside the timing)
    eos = set(lm.eos_ids)
    out: list[int] = []
    first = None
    t0 = time.perf_counter()
    if max_new_tokens > 0:
        for token in llm.generate(list(ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            first = first or time.perf_counter()  # the prompt's evaluation and the first token's choice
            out.append(int(token))
            if token in eos or len(out) >= max_new_tokens:
                break
    return {**timed_record(out, t0, first, time.perf_counter()),
            "engine": f"llama-cpp-python {version()}", "settings": settings(lookup)}
