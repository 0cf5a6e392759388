"""The bench's peers: other engines decoding the same model from the same token ids, in one table.

    name                 engine        what runs
    hf_generate          transformers  generate(), greedy: its plain decoding
    hf_early_exit        transformers  generate(assistant_early_exit=E): its self-speculation at exit E
    hf_lookup            transformers  generate(prompt_lookup_num_tokens=10): its prompt lookup
    llamacpp             llama.cpp     its plain decoding of the default model's GGUF file
    llamacpp_lookup[:N]  llama.cpp     its n-gram prompt lookup, N drafted tokens (default 10)

Our own methods (autoregressive, lookup, hispec, level lists) run on the engine (bench.run_one); a peer
is everything else, named as a bench method (evaluation.method: 'llamacpp_lookup:4' is this table's
entry and its N). Every peer is timed like ours, from before anything of its call is built to its last
token, and gives the same record keys (token_ids, wall_s, tokens_per_s). A peer that cannot run here
(llama.cpp not installed, another model than the one its file holds) is refused once, with why and how
to fix it, before any prompt runs (`check`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from hispec.errors import ConfigError
from hispec.evaluation.llama_cpp import llamacpp
from hispec.evaluation.timing import timed_record

HF_LOOKUP_TOKENS = 10  # generate(prompt_lookup_num_tokens=10), as in transformers' documentation


@dataclass(frozen=True)
class Peer:
    """One peer of the table. `run(lm, ids, max_new_tokens, exit_layer, count)` gives its record;
    `count`: the peer takes 'NAME:N' with N in this range (None: it takes none), `count_default`: N when
    not given; `on_weights`: it runs on the bench's loaded model, so METHOD@FORMAT applies (llama.cpp runs
    its own file); `in_default_set`: a bench without a method list runs it; `missing()`: why it cannot
    run on this machine (None: it can); `refuses(lm)`: why it cannot run for this model (None: it can)."""

    name: str
    run: Callable[..., dict]
    count: tuple[int, int] | None = None
    count_default: int | None = None
    on_weights: bool = True
    in_default_set: bool = False
    missing: Callable[[], str | None] = lambda: None
    refuses: Callable[[object], str | None] = lambda lm: None


class FirstToken:
    """A generate() streamer that notes when the first generated token arrives (its first call is the
    prompt; the next one carries the first new token): the peer's time to first token."""

    def __init__(self):
        self.calls, self.at = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.at is None:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def _generate(lm, ids: list[int], max_new_tokens: int, **extra) -> dict:
    t0 = time.perf_counter()  # from before anything of the call is built, as for our methods
    x = torch.tensor([ids], device=lm.ee.device)
    eos = sorted(lm.eos_ids)
    first = FirstToken()
    out = lm.model.generate(x, max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(x),
                            eos_token_id=eos or None, pad_token_id=(eos or [0])[0], streamer=first,
                            **extra)[0, len(ids):].tolist()
    return timed_record(out, t0, first.at, time.perf_counter())


# llama.cpp runs its own file (not the bench's weights), needs its package and the default model
_LLAMACPP = dict(on_weights=False, missing=lambda: llamacpp.missing(), refuses=lambda lm: llamacpp.refuses(lm))

PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("hf_generate", lambda lm, ids, n, exit_layer, count: _generate(lm, ids, n), in_default_set=True),
    Peer("hf_early_exit", lambda lm, ids, n, exit_layer, count: _generate(lm, ids, n, assistant_early_exit=exit_layer),
         in_default_set=True),
    Peer("hf_lookup", lambda lm, ids, n, exit_layer, count: _generate(lm, ids, n,
                                                                       prompt_lookup_num_tokens=HF_LOOKUP_TOKENS),
         in_default_set=True),
    Peer(llamacpp.PLAIN, lambda lm, ids, n, exit_layer, count: llamacpp.run(lm, ids, n), **_LLAMACPP),
    Peer(llamacpp.LOOKUP, lambda lm, ids, n, exit_layer, count: llamacpp.run(lm, ids, n, lookup=count),
         count=(1, 64), count_default=llamacpp.LOOKUP_DEFAULTS["num_pred_tokens"], **_LLAMACPP),
)}


DEFAULT_SET = tuple(name for name, peer in PEERS.items() if peer.in_default_set)


def unavailable(methods: list) -> str | None:
    """One message for every peer among `methods` (bench methods, evaluation.method) that cannot run on this
    machine, grouped by the reason (None when all can): said once, whatever the number of those peers."""
    why: dict[str, list[str]] = {}
    for m in methods:
        reason = m.peer and m.peer.missing()
        if reason:
            why.setdefault(reason, []).append(m.name)
    if not why:
        return None
    return "; ".join(f"{', '.join(names)} cannot run here: {reason}" for reason, names in why.items())


def check(methods: list, lm=None) -> None:
    """ConfigError, once, when a peer among `methods` cannot run here (or, given `lm`, for this model)."""
    message = unavailable(methods)
    if message:
        raise ConfigError(message)
    if lm is not None:
        refused = {}
        for m in methods:
            reason = m.peer and m.peer.refuses(lm)
            if reason:
                refused.setdefault(reason, []).append(m.name)
        if refused:
            raise ConfigError("; ".join(f"{', '.join(n)} cannot run for this model: {r}" for r, n in refused.items()))
