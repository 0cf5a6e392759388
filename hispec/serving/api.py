"""The requests the page and the API make, each declared once: its fields, their checks, and the
work it runs once admitted (serving.session runs that work; this module only says what it is).

    GenerateRequest   one generation (and, with `baseline` N, N pairs of runs against plain decoding)
    CompareRequest    the method and its baselines, several runs each, alternating
    CostsRequest      this machine's pass costs (a follow-up of a run: "Why this speed")
    BeliefsRequest    what each exit predicted at every position of a finished run (a follow-up)
    WhatIfRequest     TIMING ONLY runs at a chosen acceptance, each after a real plain run
    BenchRequest      a small live benchmark on a few prompts of a set
    LoadRequest       load a model (the allow-list applies)

`parse(raw, limits)` checks a request's fields at the edge, cheapest first (the prompt's length in
characters before anything reads it), and names the field and what is allowed on any error.
`prepare(lm, limits)` runs the checks that need the model (token counts, layers, context) and
returns the work: `work(stop, emit)`, a generator of what the update stream carries.
The answer of /generate is assembled by serving.answer from the updates of a GenerateRequest.
"""

from __future__ import annotations

import inspect
import json
import typing
from dataclasses import MISSING, dataclass, fields
from functools import cached_property, partial
from pathlib import Path

from hispec.engine.config import METHODS, DecodeConfig, check_prompt, preset
from hispec.engine.planning.costs import model_costs
from hispec.engine.events import DoneEvent
from hispec.engine.gate import others_waiting
from hispec.engine.levels import PRECISIONS, parse_levels
from hispec.engine.planning.policy import DEFAULT_POLICY, POLICIES
from hispec.errors import ConfigError
from hispec.evaluation import bench, compare as comparing
from hispec.evaluation.method import BENCH_METHODS, BenchMethod
from hispec.runs import runner
from hispec.explain import what_if as what_ifs
from hispec.explain.beliefs import exit_beliefs
from hispec.data.prompts import LOADERS, Prompt, load_sets
from hispec.serving import inputs
from hispec.serving.limits import Limits
from hispec.serving.protocol import Request

ASSETS = Path(__file__).resolve().parents[2] / "assets"
MAX_LAYER = 10_000  # a bound at the edge; the model's own depth is checked once it is known
MAX_LENGTH = 64  # each of a fixed round's lengths (the preset's draft_len and verify_threshold)
MAX_TOP_K = 1_000_000
MAX_REPEATS = 5  # runs per method in Compare, takes of What if, pairs of a plain-baseline measurement
EMPTY_PROMPT = "The prompt is empty: type something or pick an example."
LIVE_SETS = ("examples",) + tuple(LOADERS)  # the app's example prompts, then the PyPI prompt sets
MAX_LIVE_PROMPTS = 5
MAX_LIVE_TOKENS = 64
MAX_LEVELS_CHARS = 64  # "lookup,4@q4,full@q4" and the like: a few levels
METHOD_ORDER = ("hispec", "layerskip", "lookup", "autoregressive")  # as the page lists them


def _check_context(lm, ids: list[int], max_new_tokens: int) -> None:
    check_prompt(len(ids), max_new_tokens, lm.ee.context_limit)


def _encode(lm, prompt: str, chat: bool, max_new_tokens: int, limits: Limits) -> list[int]:
    ids = lm.encode(prompt, chat=chat)
    limits.check_request(len(ids), max_new_tokens)
    _check_context(lm, ids, max_new_tokens)
    return ids


# ---- one generation -------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerateRequest(Request):
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
    lengths: str | None = None  # a fixed round's "k,t": k drafts per round, the full model at t tentative tokens

    kind = "generate"
    what = "generation"
    shares_pass = True

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
                      levels=_levels(raw["levels"], method), lengths=_lengths(raw["lengths"]))
        request.decode_config()  # checked here, once: every value that does not need the model
        return request

    def decode_config(self) -> DecodeConfig:
        """The request as the engine's one configuration (built and checked once per request)."""
        return self._config

    @cached_property
    def _config(self) -> DecodeConfig:
        config = preset(self.method, self.draft_layer, self.verify_layer if self.method == "hispec" else None,
                        self.draft_len, self.verify_threshold, self.max_new_tokens, temperature=self.temperature,
                        top_k=self.top_k, top_p=self.top_p, seed=None if self.seed in (None, -1) else self.seed,
                        policy=self.policy, levels=None if self.levels is None else parse_levels(self.levels),
                        lengths=None if self.lengths is None else tuple(int(x) for x in self.lengths.split(",")))
        config.validate()
        return config

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


def _lengths(value) -> str | None:
    """A fixed round's lengths as text ("2,4"), checked; None or "": the preset's fields, else the model's
    (given beside the preset's own two, `preset()` refuses it as said twice)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    allowed = ("lengths are two whole numbers 'k,t' from 1 to {}: k tokens drafted per fixed round, and t "
               "tentative tokens that call the full model, e.g. '2,4'").format(MAX_LENGTH)
    if not isinstance(value, str) or value.count(",") != 1:
        raise ConfigError(f"{allowed} (got {inputs.shown(value)})")
    k, t = (inputs.whole(f"lengths' {what}", part, 1, MAX_LENGTH)
            for what, part in zip(("k (drafts per round)", "t (tentative tokens)"), value.split(",")))
    return f"{k},{t}"


def _generate(lm, ids, config, pairs, stop, emit):
    yield {"prompt_ids": list(ids), "levels": list(config.levels or ())}  # the page colours 4-bit drafts from the start
    done = None
    for ev in runner.events(lm, ids, config, stop=stop):
        yield ev
        done = ev if isinstance(ev, DoneEvent) else done
    if pairs and done is not None and done.token_ids and not stop.is_set():
        # optional for its visitor: the pairs left give way to another visitor who waits for the model
        yield from comparing.vs_plain(lm, ids, config, len(done.token_ids), pairs, stop, yield_to=others_waiting)


def api_signature() -> inspect.Signature:
    """GenerateRequest's fields as typed, defaulted parameters (what gr.api reads for /generate's
    inputs), so the API's inputs are declared once, here."""
    hints = typing.get_type_hints(GenerateRequest)
    params = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[f.name],
                                default=inspect.Parameter.empty if f.default is MISSING else f.default)
              for f in fields(GenerateRequest)]
    return inspect.Signature(params, return_annotation=dict)


# ---- compare, what if, benchmark, load ------------------------------------------------------------
class _OfAGeneration(Request):
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
    generate: GenerateRequest  # its method must have exits (hispec or layerskip); its policy: the field "policy"
    a_dv: float = 0.5  # per-token acceptance draft -> verify to draw at
    a_vt: float = 0.5  # per-token acceptance -> full model to draw at
    takes: int = what_ifs.DEFAULT_TAKES

    kind = "what_if"
    what = "what-if run"

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> WhatIfRequest:
        # the run's own policy when the page names it (a what-if replays the run it follows); else fixed rounds
        generate = GenerateRequest.parse(dict(raw["generate"], policy=raw.get("policy", "fixed")), limits)
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
class BenchRequest(Request):
    set_name: str = "examples"
    count: int = 2
    methods: tuple[BenchMethod, ...] = tuple(map(BenchMethod.parse, ("autoregressive", "layerskip", "hispec")))
    max_new_tokens: int = 16
    model: str | None = None

    kind = "bench"
    what = "benchmark"

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> BenchRequest:
        limit = min(MAX_LIVE_TOKENS, limits.max_new_tokens)
        methods = inputs.choices("methods", list(raw.get("methods") or []), BENCH_METHODS)
        if not methods:
            raise ConfigError(f"pick at least one method of {', '.join(BENCH_METHODS)}")
        n_new = inputs.whole("max new tokens", raw.get("max_new_tokens"), 1, None)
        if n_new > limit:
            raise ConfigError(f"max new tokens must be between 1 and {limit} for a live benchmark (got {n_new})")
        return cls(inputs.choice("prompt set", raw.get("set_name"), LIVE_SETS),
                   inputs.whole("number of prompts", raw.get("count"), 1, MAX_LIVE_PROMPTS),
                   tuple(map(BenchMethod.parse, methods)), n_new,
                   inputs.name("model", raw.get("model")))

    def prepare(self, lm, limits: Limits):
        sets = live_prompts(self.set_name, self.count)
        for prompts in sets.values():
            for p in prompts:
                limits.check_request(len(lm.encode(p.text, chat=p.chat)), self.max_new_tokens)
        base = preset("hispec", max_new_tokens=self.max_new_tokens)
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
class LoadRequest(Request):
    model: str | None = None

    kind = "load"
    what = "model load"
    needs_turn = False  # loading is all it does (in serving's lease, for everybody): nothing runs on the model

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> LoadRequest:
        return cls(inputs.name("model", raw.get("model")))

    def prepare(self, lm, limits: Limits):
        return lambda stop, emit: iter([lm])


# ---- follow-ups of a run: this machine's pass costs, what each exit believes -----------------------
@dataclass(frozen=True)
class CostsRequest(Request):
    """The model's pass costs on this machine (engine.planning.costs), calibrated for these exits if they are
    not yet: the numbers "Why this speed" explains a run with."""

    model: str | None = None
    exits: tuple[int, ...] = ()

    kind = "costs"
    what = "cost measurement"
    follow_up = True  # part of a run the visitor made: not counted again by the per-address rate limit

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> CostsRequest:
        exits = raw.get("exits") or ()
        if isinstance(exits, (str, bytes)) or not isinstance(exits, (list, tuple)) or len(exits) > 4:
            raise ConfigError(f"exits must be a list of at most 4 exit layers (got {inputs.shown(exits)})")
        return cls(inputs.name("model", raw.get("model")),
                   tuple(sorted({inputs.whole("exit layer", e, 1, MAX_LAYER) for e in exits})))

    def prepare(self, lm, limits: Limits):
        bad = [e for e in self.exits if not 0 < e < lm.ee.num_layers]
        if bad:
            raise ConfigError(f"exit layer {bad[0]} is impossible: this model has {lm.ee.num_layers} layers")
        return lambda stop, emit: iter([model_costs(lm.ee, self.exits)])


@dataclass(frozen=True)
class BeliefsRequest(Request):
    """What every exit predicted at every generated position of a finished run (explain.beliefs)."""

    model: str | None = None
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    formats: tuple[str, ...] = ()  # the cheaper formats whose full model's row to add ('a8': the run's 4-bit level)

    kind = "beliefs"
    what = "look at the exits"
    follow_up = True

    @classmethod
    def parse(cls, raw: dict, limits: Limits) -> BeliefsRequest:
        ids = {}
        for name, most in (("prompt_ids", limits.max_prompt_tokens), ("token_ids", limits.max_new_tokens)):
            value = raw.get(name) or ()
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or len(value) > most:
                raise ConfigError(f"{name} must be a list of at most {most} token ids (got {inputs.shown(value)})")
            ids[name] = tuple(inputs.whole("a token id", t, 0, None) for t in value)
        if not ids["prompt_ids"] or not ids["token_ids"]:
            raise ConfigError("both prompt_ids and token_ids must hold at least one token id")
        formats = tuple(raw.get("formats") or ())
        if any(f not in PRECISIONS for f in formats):
            raise ConfigError(f"formats must be among {', '.join(PRECISIONS)} (got {inputs.shown(formats)})")
        return cls(inputs.name("model", raw.get("model")), ids["prompt_ids"], ids["token_ids"], formats)

    def prepare(self, lm, limits: Limits):
        vocab = lm.ee.model.config.vocab_size
        if any(t >= vocab for t in self.prompt_ids + self.token_ids):
            raise ConfigError(f"a token id is beyond this model's vocabulary of {vocab}")
        _check_context(lm, list(self.prompt_ids), len(self.token_ids))
        return lambda stop, emit: iter([exit_beliefs(lm.ee, list(self.prompt_ids), list(self.token_ids),
                                                     tokenizer=lm.tokenizer, formats=self.formats)])
