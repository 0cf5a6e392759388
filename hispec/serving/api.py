"""The requests the page and the API make, each declared once: its fields, their checks, and the
work it runs once admitted (serving.session runs that work; this module only says what it is).

    GenerateRequest   one generation (and, with `baseline` N, N pairs of runs against plain decoding)
    CompareRequest    the method and its baselines, several runs each, alternating
    WhatIfRequest     TIMING ONLY runs at a chosen acceptance, each after a real plain run
    BenchRequest      a small live benchmark on a few prompts of a set
    LoadRequest       load a model (the allow-list applies)

`parse(raw, limits)` checks a request's fields at the edge, cheapest first (the prompt's length in
characters before anything reads it), and names the field and what is allowed on any error.
`prepare(lm, limits)` runs the checks that need the model (token counts, layers, context) and
returns the work: `work(stop, emit)`, a generator of what the update stream carries.
The response of /generate is `generate_response`: the one JSON shape of a finished generation.
"""

from __future__ import annotations

import inspect
import json
import typing
from dataclasses import MISSING, dataclass, fields
from functools import partial
from pathlib import Path

from hispec.engine.decoding import METHODS, DecodeConfig
from hispec.engine.events import DoneEvent
from hispec.engine.levels import parse_levels
from hispec.engine.policy import DEFAULT_POLICY, POLICIES
from hispec.errors import ConfigError
from hispec.evaluation import bench, compare as comparing, runner, what_if as what_ifs
from hispec.evaluation.prompts import LOADERS, Prompt, load_sets
from hispec.serving import inputs
from hispec.serving.limits import Limits

ASSETS = Path(__file__).resolve().parents[2] / "assets"
MAX_LAYER = 10_000  # a bound at the edge; the model's own depth is checked once it is known
MAX_LENGTH = 64  # draft_len and verify_threshold
MAX_TOP_K = 1_000_000
MAX_REPEATS = 5  # runs per method in Compare, takes of What if, pairs of a plain-baseline measurement
EMPTY_PROMPT = "The prompt is empty: type something or pick an example."
LIVE_SETS = ("examples",) + tuple(LOADERS)  # the app's example prompts, then the PyPI prompt sets
MAX_LIVE_PROMPTS = 5
MAX_LIVE_TOKENS = 64
MAX_LEVELS_CHARS = 64  # "lookup,4@q4,full@q4" and the like: a few levels
METHOD_ORDER = ("hispec", "layerskip", "lookup", "autoregressive")  # as the page lists them


def _check_context(lm, ids: list[int], max_new_tokens: int) -> None:
    if len(ids) + max_new_tokens > lm.ee.context_limit:
        raise ConfigError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                          f"context of {lm.ee.context_limit} tokens")


def _encode(lm, prompt: str, chat: bool, max_new_tokens: int, limits: Limits) -> list[int]:
    ids = lm.encode(prompt, chat=chat)
    limits.check_request(len(ids), max_new_tokens)
    _check_context(lm, ids, max_new_tokens)
    return ids


# ---- one generation -------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerateRequest:
    """One generation. Layers and lengths left out (None) take the model's recommended settings."""

    prompt: str
    method: str = "hispec"  # hispec, layerskip, lookup or autoregressive
    draft_layer: int | None = None  # hispec: the draft exit d; layerskip: its one exit E
    verify_layer: int | None = None  # hispec: the intermediate verifier exit v
    draft_len: int | None = None  # tokens drafted per block
    verify_threshold: int | None = None  # hispec: tentative tokens that call the full model
    max_new_tokens: int = 64
    policy: str = DEFAULT_POLICY  # auto (planned every round) or fixed (the settings above, every round)
    chat: bool = True  # wrap the prompt in the model's chat template
    temperature: float = 0.0  # 0: greedy (exactly the full model's output)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = -1  # -1: random
    model: str | None = None  # None: the server's model
    baseline: int = 0  # N >= 1: also N pairs (this method, plain decoding) for stats.vs_plain
    levels: str | None = None  # hispec: its level list, bottom first, e.g. "lookup,full@q4" (None: its own)

    kind = "generate"
    what = "generation"

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> GenerateRequest:
        names = [f.name for f in fields(cls)]
        unknown = sorted(k for k in raw if k not in names)
        if unknown:
            raise ConfigError(f"unknown field {unknown[0]!r}; the fields are: {', '.join(names)}")
        raw = {f.name: raw.get(f.name, None if f.default is MISSING else f.default) for f in fields(cls)}
        prompt = inputs.text("the prompt", raw.get("prompt"), limits.max_prompt_chars, EMPTY_PROMPT)
        method = inputs.choice("method", raw["method"], sorted(METHODS, key=METHOD_ORDER.index))
        layers = {k: inputs.optional_whole(k.replace("_", " "), raw[k], 1, MAX_LAYER)
                  for k in ("draft_layer", "verify_layer")}
        lengths = {k: inputs.optional_whole(k, raw[k], 1, MAX_LENGTH) for k in ("draft_len", "verify_threshold")}
        n_new = inputs.whole("max new tokens", raw["max_new_tokens"], 1, None)
        if n_new > limits.max_new_tokens:
            raise ConfigError(f"max new tokens {inputs.shown(n_new)} is over this app's limit of "
                              f"{limits.max_new_tokens}")
        request = cls(prompt, method, **layers, **lengths, max_new_tokens=n_new,
                      policy=inputs.choice("policy", raw["policy"], POLICIES), chat=inputs.flag("chat", raw["chat"]),
                      temperature=inputs.temperature(raw["temperature"]),
                      top_k=inputs.whole("top-k", raw["top_k"] or 0, 0, MAX_TOP_K),
                      top_p=inputs.real("top-p", raw["top_p"], 0.0, 1.0),
                      seed=inputs.seed(raw["seed"]), model=inputs.name("model", raw["model"]),
                      baseline=inputs.whole("baseline", raw["baseline"] or 0, 0, MAX_REPEATS),
                      levels=_levels(raw["levels"], method))
        request.decode_config().validate()  # every value that does not need the model
        return request

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(self.method, self.draft_layer, self.verify_layer if self.method == "hispec" else None,
                            self.draft_len, self.verify_threshold, self.max_new_tokens, temperature=self.temperature,
                            top_k=self.top_k, top_p=self.top_p,
                            seed=None if self.seed in (None, -1) else self.seed, policy=self.policy,
                            levels=None if self.levels is None else parse_levels(self.levels))

    def prepare(self, lm, limits: Limits):
        ids = _encode(lm, self.prompt, self.chat, self.max_new_tokens, limits)
        config = self.decode_config().resolve_for(lm.ee)
        return partial(_generate, lm, ids, config, self.baseline)


def _levels(value, method: str) -> str | None:
    """A level list as text ("lookup,full@q4"), checked for what needs no model; None or "": the method's own."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = inputs.text("levels", value, MAX_LEVELS_CHARS)
    if method != "hispec":
        raise ConfigError(f"levels apply to the hispec method only (got method {method!r}); leave levels out "
                          "or choose hispec")
    return ",".join(str(level) for level in parse_levels(text))


def _generate(lm, ids, config, pairs, stop, emit):
    yield {"prompt_ids": list(ids), "levels": list(config.levels or ())}  # the page colours 4-bit drafts from the start
    done = None
    for ev in runner.events(lm, ids, config, stop=stop):
        yield ev
        done = ev if isinstance(ev, DoneEvent) else done
    if pairs and done is not None and done.token_ids and not stop.is_set():
        yield from comparing.vs_plain(lm, ids, config, len(done.token_ids), pairs, stop)


def generate_response(run: runner.LiveRun, html: str, vs_plain: dict | None = None) -> dict:
    """What /generate returns: text, token_ids, html (the coloured tokens), stats (with `vs_plain`
    when a baseline was measured), settings and trace (every engine event, in order)."""
    done = run.done
    stats = run.summary()
    if vs_plain is not None:
        stats["vs_plain"] = vs_plain
    return {"text": done.text, "token_ids": list(done.token_ids), "html": html, "stats": stats,
            "settings": done.settings, "trace": run.events}


def api_signature() -> inspect.Signature:
    """GenerateRequest's fields as typed, defaulted parameters (what gr.api reads for /generate's
    inputs), so the API's inputs are declared once, here."""
    hints = typing.get_type_hints(GenerateRequest)
    params = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[f.name],
                                default=inspect.Parameter.empty if f.default is MISSING else f.default)
              for f in fields(GenerateRequest)]
    return inspect.Signature(params, return_annotation=dict)


# ---- compare, what if, benchmark, load ------------------------------------------------------------
class _OfAGeneration:
    """A request built around a GenerateRequest (its prompt, settings and model)."""

    generate: GenerateRequest

    @property
    def model(self):
        return self.generate.model


@dataclass(frozen=True)
class CompareRequest(_OfAGeneration):
    generate: GenerateRequest
    baselines: tuple[str, ...] = ("autoregressive",)
    repeats: int = 3

    kind = "compare"
    what = "comparison"

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> CompareRequest:
        generate = GenerateRequest.parse(raw["generate"], limits)
        baselines = inputs.choices("baselines", list(raw.get("baselines") or []), comparing.BASELINES)
        if not [b for b in baselines if b != generate.method]:
            raise ConfigError("Pick at least one baseline that differs from the chosen method.")
        repeats = inputs.whole("runs of each method", raw.get("repeats", 3), 1, MAX_REPEATS)
        return cls(generate, tuple(baselines), repeats)

    def prepare(self, lm, limits: Limits):
        g = self.generate
        ids = _encode(lm, g.prompt, g.chat, g.max_new_tokens, limits)
        configs = comparing.compare_configs(g.decode_config(), list(self.baselines), lm.ee)
        return lambda stop, emit: comparing.compare(lm, ids, configs, self.repeats, stop)


@dataclass(frozen=True)
class WhatIfRequest(_OfAGeneration):
    generate: GenerateRequest  # its method must have exits (hispec or layerskip); rounds are fixed
    a_dv: float = 0.5  # per-token acceptance draft -> verify to draw at
    a_vt: float = 0.5  # per-token acceptance -> full model to draw at
    takes: int = what_ifs.DEFAULT_TAKES

    kind = "what_if"
    what = "what-if run"

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> WhatIfRequest:
        generate = GenerateRequest.parse(dict(raw["generate"], policy="fixed"), limits)
        if generate.method not in ("hispec", "layerskip"):
            raise ConfigError("a what-if run needs HiSpec or LayerSkip (they have exits to accept drafts); "
                              f"the method chosen is {generate.method}")
        return cls(generate, inputs.real("acceptance draft → verify", raw.get("a_dv"), 0.0, 1.0),
                   inputs.real("acceptance → full model", raw.get("a_vt"), 0.0, 1.0),
                   inputs.whole("takes", raw.get("takes", what_ifs.DEFAULT_TAKES), 1, what_ifs.MAX_TAKES))

    def prepare(self, lm, limits: Limits):
        g = self.generate
        ids = _encode(lm, g.prompt, g.chat, g.max_new_tokens, limits)
        config = g.decode_config().resolve_for(lm.ee)
        return lambda stop, emit: what_ifs.what_if(lm, ids, config, (self.a_dv, self.a_vt), self.takes, stop)


def live_prompts(set_name: str, count: int, seed: int = 0) -> dict[str, list[Prompt]]:
    """`count` prompts of a set: the app's examples, or a seeded sample of a PyPI prompt set."""
    if set_name == "examples":
        examples = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
        return {"examples": [Prompt(e["kind"], e["prompt"], True, e["kind"]) for e in examples][:count]}
    return load_sets(f"{set_name}:{count}", seed=seed)


@dataclass(frozen=True)
class BenchRequest:
    set_name: str = "examples"
    count: int = 2
    methods: tuple[str, ...] = ("autoregressive", "layerskip", "hispec")
    max_new_tokens: int = 16
    model: str | None = None

    kind = "bench"
    what = "benchmark"

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> BenchRequest:
        limit = min(MAX_LIVE_TOKENS, limits.max_new_tokens)
        methods = inputs.choices("methods", list(raw.get("methods") or []), bench.BENCH_METHODS)
        if not methods:
            raise ConfigError(f"pick at least one method of {', '.join(bench.BENCH_METHODS)}")
        n_new = inputs.whole("max new tokens", raw.get("max_new_tokens"), 1, None)
        if n_new > limit:
            raise ConfigError(f"max new tokens must be between 1 and {limit} for a live benchmark (got {n_new})")
        return cls(inputs.choice("prompt set", raw.get("set_name"), LIVE_SETS),
                   inputs.whole("number of prompts", raw.get("count"), 1, MAX_LIVE_PROMPTS), tuple(methods), n_new,
                   inputs.name("model", raw.get("model")))

    def prepare(self, lm, limits: Limits):
        sets = live_prompts(self.set_name, self.count)
        for prompts in sets.values():
            for p in prompts:
                limits.check_request(len(lm.encode(p.text, chat=p.chat)), self.max_new_tokens)
        base = DecodeConfig("hispec", max_new_tokens=self.max_new_tokens)
        base.resolve_for(lm.ee)  # checked here; each method resolves its own defaults

        def work(stop, emit):
            total = sum(len(ps) for ps in sets.values())
            emit(f"Warming up {len(self.methods)} method(s)…")
            report = bench.benchmark(lm, sets, list(self.methods), base, warmup=True, stop=stop,
                                     progress=lambda done, n, what: emit(f"Prompt {done} of {n} done ({what})."))
            report["total_prompts"] = total
            emit(report)

        return work


@dataclass(frozen=True)
class LoadRequest:
    model: str | None = None

    kind = "load"
    what = "model load"
    needs_turn = False  # loading is all it does (in serving's lease, for everybody): nothing runs on the model

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> LoadRequest:
        return cls(inputs.name("model", raw.get("model")))

    def prepare(self, lm, limits: Limits):
        return lambda stop, emit: iter([lm])
