"""Tiny random models and tokenizers built inside the tests (no downloads)."""

from __future__ import annotations

import contextlib
import os
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from hispec.model.early_exit import EarlyExitModel

VOCAB = 100
EOS = 2
_ARCH = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}


def model_threads() -> int:
    """Threads for tests on the real default model: 2 on 2 cores when alone, 1 when pytest-xdist
    runs other tests beside them (two busy threads per worker on 2 cores spin-wait)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        return 1
    return max(1, min(2, os.cpu_count() or 1))


def tiny_model(arch: str = "llama", layers: int = 8, seed: int = 0, vocab: int = VOCAB, **overrides):
    config_cls, model_cls = _ARCH[arch]
    kwargs = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.3, eos_token_id=EOS, bos_token_id=1, pad_token_id=0,
                  tie_word_embeddings=False)
    if arch == "qwen3":
        kwargs["head_dim"] = 16
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return model_cls(config_cls(**kwargs)).eval()


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def identity_layer_model(layers: int = 6, seed: int = 0):
    """Every decoder layer adds zero to the residual stream, so every exit equals the final
    head and the next token depends only on the current one: a fully predictable target."""
    model = tiny_model("llama", layers=layers, seed=seed)
    with torch.no_grad():
        model.model.embed_tokens.weight[0].normal_(0, 0.3)  # the pad row is zero: no ties
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer of 99 tokens with a small chat template."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="<unk>")
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
    return tok


def save_tiny_folder(path, arch: str = "llama", layers: int = 8):
    """A local model folder (config, safetensors, tokenizer) as a user would point --model at."""
    model = tiny_model(arch, layers=layers)
    model.generation_config.eos_token_id = EOS
    model.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def ee_of(model) -> EarlyExitModel:
    return EarlyExitModel(model)


# Model text that would be markup, script, a link or a terminal control sequence if shown raw
# (the hosting tests, in Python and in the browser, check it stays text).
EVIL = ['<script>window.__pwned=1</script>', '<img src=x onerror="window.__pwned=2">',
        '[click](javascript:alert(3))', '\x1b[31mRED\x1b[0m', '\x07\x1b]0;title\x07', '**bold**']


def tiny_registry(name: str = "tiny"):
    """A model registry holding the 8-layer tiny Llama with the character tokenizer, under `name`."""
    from hispec.model.loading import LoadedModel
    from hispec.serving.registry import ModelRegistry

    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    registry = ModelRegistry()
    registry.add(name, LoadedModel(name, model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t"))
    return registry


def tiny_server(registry=None, name: str = "tiny", **limits):
    """A Server (no rate limits unless given) over `registry` (default: tiny_registry(name))."""
    from hispec.serving.limits import Limits
    from hispec.serving.session import Server

    registry = registry or tiny_registry(name)
    limits = {"rate_per_minute": 0, "address_rate_per_minute": 0, "global_rate_per_minute": 0,
              "allowed_models": (name,), **limits}
    return Server(registry, Limits(**limits), default_model=name, throttle_s=0.0)


def sketch_record(levels=(), policy="fixed", lengths=(1, 1), acceptance=None, num_layers=8):
    """A finished run's record (hispec.runs.record.RunRecord) with only its levels, policy, lengths and
    acceptance (by the stats' role keys, e.g. {"lookup->verify": 0.4}): what a what-if reads of a run."""
    from hispec.engine.levels import build_levels
    from hispec.runs.record import PairAcceptance, RunRecord, Sampling

    built = build_levels(tuple(levels), num_layers)
    roles = {lv.name: lv for lv in built}
    pairs = tuple(PairAcceptance(roles[key.partition("->")[0]], roles[key.partition("->")[2]], round(rate * 100), 100)
                  for key, rate in (acceptance or {}).items())
    return RunRecord(model="m", method="", levels=built, policy=policy, adapts=policy == "auto",
                     lengths=None if policy == "auto" else lengths, num_layers=num_layers, sampling=Sampling(),
                     plans={}, pairs=pairs, costs={}, events=(), stats={})


def write_tiny_lesson(path, prompt_ids, max_new_tokens=20, title="A tiny lesson", prompt="hello"):
    """A lesson file (hispec.runs.lessons) of a tiny model's adaptive run, as scripts/measure/lessons.py writes
    one: the run's record with timing pairs, beliefs and a machine; returns the record it holds."""
    import gzip
    import json

    from hispec.engine.config import DecodeConfig
    from hispec.evaluation.pairs import summary
    from hispec.explain.beliefs import exit_beliefs
    from hispec.runs.record import build
    from hispec.runs.runner import run

    ee = EarlyExitModel(tiny_model("llama", layers=8, seed=3))
    events = []
    r = run(ee, list(prompt_ids), DecodeConfig(max_new_tokens=max_new_tokens), on_event=events.append)
    measured = summary([1.1, 1.2, 1.3], 3) | {"new_tokens": max_new_tokens, "plain_decode_tokens_per_s": [9.0, 9.5, 10.0],
                                              "plain_tokens_per_s": [8.0, 8.5, 9.0], "prefill_s": 0.01}
    record = build(events, r.stats, model="tiny", prompt_ids=prompt_ids, vs_plain=measured, pairs_asked=3)
    data = record.to_json() | {"title": title, "prompt": prompt, "beliefs": exit_beliefs(ee, list(prompt_ids), r.token_ids),
                               "recorded_on": {"machine": "a test host", "commit": "0123456789abcdef"}}
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return record


def kernel_product(matrix, x: torch.Tensor, isa: str, wide: bool = False) -> torch.Tensor:
    """x @ W.T for a q4.QuantizedMatrix through one build of the 4-bit kernel (matrix.matmul uses the host's):
    the 4-bit arithmetic, or `wide` (each weight widened to its float32 value first)."""
    from hispec.model.formats import q4_kernel

    lib = q4_kernel.load(isa)
    N, K = matrix.shape
    x = x.contiguous()
    out = torch.empty(x.shape[0], N)
    if matrix.kind == "Q4_1":
        fn = lib.hispec_q41_matmul_w if wide else lib.hispec_q41_matmul
        fn(x.data_ptr(), x.shape[0], K, matrix.qs.data_ptr(), matrix.d.data_ptr(), matrix.m.data_ptr(), N,
           out.data_ptr(), N, q4_kernel.threads())
    else:
        fn = lib.hispec_q80_matmul_w if wide else lib.hispec_q80_matmul
        fn(x.data_ptr(), x.shape[0], K, matrix.qs.data_ptr(), matrix.d.data_ptr(), N, out.data_ptr(), N,
           q4_kernel.threads())
    return out


@contextlib.contextmanager
def slow(lm, seconds: float):
    """Every layer-range call of the model takes `seconds` more (the serving tests' long generations)."""
    own = "run_layers" in vars(lm.ee)
    original = lm.ee.run_layers

    def slowed(*args, **kwargs):
        time.sleep(seconds)
        return original(*args, **kwargs)

    lm.ee.run_layers = slowed
    try:
        yield
    finally:
        if own:
            lm.ee.run_layers = original
        else:
            del lm.ee.run_layers


def wait_until(condition, timeout: float = 20.0) -> None:
    """Poll `condition` every 10 ms; fail the test after `timeout` seconds."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


def on_blocks(model, head: str = "Q8_0"):
    """A tiny model whose float32 weights are exactly a file's blocks dequantised (as the default model's are),
    and those blocks by transformers name."""
    from hispec.model.formats.q4 import PROJECTIONS, Q4_1, quantize_q4_1, quantize_q8_0

    matrices = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for part, names in PROJECTIONS.items():
                for name in names:
                    linear = getattr(getattr(layer, part), name)
                    matrix = quantize_q4_1(linear.weight)
                    linear.weight.copy_(matrix.dequantize())
                    matrices[f"model.layers.{i}.{part}.{name}"] = matrix
        matrix = (quantize_q4_1 if head == Q4_1 else quantize_q8_0)(model.lm_head.weight)
        model.lm_head.weight.copy_(matrix.dequantize())
        matrices["lm_head"] = matrix
    return model, matrices
