"""The one configuration of a generation: a level list and a policy, with the lengths of a fixed round,
lookup length, budget and sampling (`DecodeConfig`). The page, `/generate`, the CLI and bench all build one; the
engine resolves and validates it once (`resolve_for`), and the Decoder takes it as it is.

The paper's four names live in one place, the preset (`Preset`, built by `preset()`): a method
(autoregressive, layerskip, hispec, lookup) with its draft layer d and verify layer v maps onto a
level list, and its draft_len and verify_threshold onto the `lengths` of a fixed round, when the
configuration is resolved, with the model's recommended settings for what is left out. A resolved
configuration always carries the preset that describes it in the paper's terms (its `method` label,
exits and lengths), which the statistics and reports print; the engine reads only levels and lengths.

    preset("autoregressive")               -> levels ()                     [full]
    preset("layerskip", draft_layer=E)      -> levels (E,)                   [exit E, full]
    preset("hispec", d, v), policy fixed   -> levels (d, v)                 [exit d, exit v, full]
    preset("hispec", d, v), policy auto    -> levels ("lookup", d, v)       the free drafter below
    preset("hispec"), policy auto, on a model offering its 4-bit copy
                                           -> levels ("lookup", "full@a8")  the precision hierarchy
    preset("hispec"), policy auto, on a 4-bit model itself (--weights q4, a8) -> levels ("lookup",)
    preset("lookup")                       -> levels ("lookup",)            [lookup, full]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from hispec.engine.levels import LOOKUP, build_levels, exits_by_role, parse_levels
from hispec.engine.planning.policy import DEFAULT_POLICY, POLICIES, adapts
from hispec.errors import ConfigError

if TYPE_CHECKING:
    from hispec.model.early_exit import EarlyExitModel

METHODS = ("autoregressive", "layerskip", "hispec", "lookup")

# The settings used when a model's trained exits recommend none (the paper's defaults). The CLI's
# help, the app and the sweep's marked default point read them from here.
DEFAULT_DRAFT_LEN = 2  # tokens drafted per block at an exit (hispec)
DEFAULT_VERIFY_THRESHOLD = 4  # tentative tokens that call the full model; layerskip's draft length
DEFAULT_LAYERS = {"d": "L/8", "v": "L/4", "E": "L/4"}  # in words, as default_exits computes them


# The hispec preset's list under the auto policy when no exit is named, on a model that offers a copy of
# its own weights in 4-bit below its exact float32 format (the default model on a CPU): lookup drafts for
# free, the 4-bit model judges the copy and drafts on, the exact model verifies. Levels are (depth,
# precision): this is the three-level hierarchy with precision as the middle level, exact all the same.
# Which 4-bit arithmetic drafts was measured on the tuning split, side by side (assets/bench/
# drafter_tune_cpu.json, docs/precision.md): int8 activations (a8: cheaper steps and k-token passes, 96%
# agreement) where offered, else float32 activations (q4: 100%). A model without a copy (any other
# model, or where the kernel cannot run) keeps the exits.
PRECISION_LISTS = {"a8": (LOOKUP, "full@a8"), "q4": (LOOKUP, "full@q4")}  # in the order preferred
PRECISION_LIST = PRECISION_LISTS["a8"]  # the default model's on a CPU (the page's and the docs' default)
# A model whose exact arithmetic is itself 4-bit (--weights q4 or a8) drafts with lookup alone: a k-token
# pass there costs more than in float32, and neither its exits nor a8 under q4 paid on the tuning split.
LOOKUP_ONLY = (LOOKUP,)


def recommended_levels(formats: tuple[str, ...], own: str | None = None) -> tuple | None:
    """The level list recommended for a model offering these cheaper formats (None: the exits'); `own`:
    the model's own 4-bit arithmetic ('q4', 'a8'), None for float weights (EarlyExitModel.arithmetic)."""
    if own is not None:
        return LOOKUP_ONLY
    return next((levels for fmt, levels in PRECISION_LISTS.items() if fmt in formats), None)


def default_exits(num_layers: int) -> tuple[int, int]:
    """The exits a model without a recommendation drafts and verifies at, (L/8, L/4), rounded and kept
    apart; a single exit (layerskip's E) is the second of them."""
    d = max(1, round(num_layers / 8))
    return d, max(d + 1, round(num_layers / 4))


@dataclass(frozen=True)
class Preset:
    """A method in the paper's names. None: the model's recommended setting (its trained exits'
    manifest), else the default (d = L/8, v = L/4, layerskip's exit E = L/4; draft_len 2,
    verify_threshold 4). For layerskip, `draft_layer` is its one exit E and `draft_len` its drafts per
    round; `verify_layer` and `verify_threshold` belong to hispec only. The layers map onto a level list
    (`levels`), the two lengths onto the configuration's `lengths` (`DecodeConfig.resolve`)."""

    method: str = "hispec"
    draft_layer: int | None = None
    verify_layer: int | None = None
    draft_len: int | None = None  # tokens drafted per round at exit d (layerskip: at exit E)
    verify_threshold: int | None = None  # tentative tokens that call the full model

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method '{self.method}'; choose from {', '.join(METHODS)}")
        for name in ("draft_layer", "verify_layer", "draft_len", "verify_threshold"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{name} must be a whole number (got {value!r})")
        for name in ("draft_len", "verify_threshold"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")

    def levels(self, num_layers: int, rec: dict, adaptive: bool) -> tuple:
        """The level list this preset means on a model of `num_layers` layers."""
        L = num_layers
        if self.method == "autoregressive":
            return ()
        if self.method == "lookup":
            return (LOOKUP,)
        if self.method == "layerskip":
            exit_layer = _first(self.draft_layer, rec.get("layerskip_exit"), default_exits(L)[1])
            _check_layers(L, exit_layer)
            return (exit_layer,)
        if adaptive and self.draft_layer is None and self.verify_layer is None and rec.get("levels"):
            return tuple(rec["levels"])  # no exit named: the model's recommended list (recommended_levels)
        d = _first(self.draft_layer, rec.get("draft"), default_exits(L)[0])
        v = self.verify_layer
        if v is None:
            v = rec["verify"] if self.draft_layer is None and "verify" in rec else max(d + 1, default_exits(L)[1])
        _check_layers(L, d, v)
        return (LOOKUP, d, v) if adaptive else (d, v)

    def as_method(self, method: str, exit_layer: int | None = None) -> Preset:
        """Another method with this preset's lengths: hispec keeps the layers; layerskip runs at
        `exit_layer` (None: the model's); the others have no layers."""
        if method == "hispec":
            return replace(self, method=method)
        return replace(self, method=method, draft_layer=exit_layer if method == "layerskip" else None,
                       verify_layer=None)

    @staticmethod
    def describing(levels: tuple, method: str = "hispec") -> Preset:
        """The preset a level list given as such is described by: its first two exact exits (the paper's
        d and v) under the method's name (hispec for a list written as such), the list being what runs."""
        exits = [x for x in levels if isinstance(x, int)]
        return Preset(method, exits[0] if exits else None, exits[1] if len(exits) > 1 else None)

    @staticmethod
    def recorded(settings: dict) -> Preset:
        """The preset a run's recorded settings name (`DecodeConfig.settings`, as reports keep them)."""
        return Preset(settings.get("method", "hispec"), settings.get("draft_layer"), settings.get("verify_layer"),
                      settings.get("draft_len"), settings.get("verify_threshold"))

    def lengths(self, levels: tuple, given: tuple, rec: dict) -> tuple[int, int] | None:
        """The lengths of a fixed round (drafts per round, tentative tokens that call the full model) this
        preset means for `levels`: `given` (a configuration's own lengths) first, then the preset's, the
        model's recommended, the defaults. None for a list with no level that runs layers below the full
        model (plain decoding, lookup alone), where rounds have no such lengths."""
        middle = [x for x in levels if x != LOOKUP]
        if not middle:
            return None
        k, t = given
        threshold = _first(t, self.verify_threshold, rec.get("verify_threshold"), DEFAULT_VERIFY_THRESHOLD)
        if self.method == "layerskip":  # its one exit drafts; the paper's single-exit length is the threshold's
            return _first(k, self.draft_len, rec.get("layerskip_draft_len"), t, self.verify_threshold,
                          DEFAULT_VERIFY_THRESHOLD), threshold
        two_exits = len([x for x in middle if isinstance(x, int)]) == 2
        return _first(k, self.draft_len, rec.get("draft_len") if two_exits else rec.get("layerskip_draft_len"),
                      DEFAULT_DRAFT_LEN), threshold

    def label(self) -> str:
        """The method in the paper's terms: 'hispec (d, v)', 'layerskip (exit E)', else its name."""
        if self.method == "layerskip" and self.draft_layer is not None:
            return f"layerskip (exit {self.draft_layer})"
        if self.method == "hispec" and self.draft_layer is not None and self.verify_layer is not None:
            return f"hispec ({self.draft_layer}, {self.verify_layer})"
        return self.method


def preset(method: str = "hispec", draft_layer: int | None = None, verify_layer: int | None = None,
           draft_len: int | None = None, verify_threshold: int | None = None, max_new_tokens: int = 128,
           **rest) -> DecodeConfig:
    """A configuration in the paper's names (the page's sliders, the CLI's --draft-layer and the
    like): the preset, with the lengths, the budget and any other field of DecodeConfig. The paper's
    lengths and a `lengths` given beside them would say one thing twice, and are refused."""
    twice = [name for name, value in (("draft_len", draft_len), ("verify_threshold", verify_threshold))
             if value is not None]
    if twice and rest.get("lengths") is not None:
        raise ConfigError(f"lengths and {' and '.join(twice)} say the same thing twice: give one of them")
    return DecodeConfig(max_new_tokens=max_new_tokens,
                        preset=Preset(method, draft_layer, verify_layer, draft_len, verify_threshold), **rest)


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one generation. None means: the default for the list and model depth."""

    # The level list, bottom first, the full model implied: e.g. ("lookup", 2, 4), (), ("lookup", "full@q4");
    # None: the preset's list (the default preset: hispec at the model's recommended exits).
    levels: tuple | None = None
    policy: str = DEFAULT_POLICY  # auto: planned per round (hispec.engine.planning.policy); fixed: the lengths below
    # A fixed round's lengths: (tokens the lowest level that runs layers drafts per round, tentative tokens
    # that call the full model), e.g. (2, 4); None, or None in a place: the preset's, else the model's.
    lengths: tuple | None = None
    lookup_len: int = 8  # the lookup level proposes at most this many tokens per round
    max_new_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    temperature: float = 0.0  # 0 = greedy (exactly the target's greedy output)
    top_k: int = 0  # 0 = no top-k
    top_p: float = 1.0  # 1 = no top-p
    seed: int | None = None  # for reproducible sampling
    preset: Preset | None = None  # where the list came from, in the paper's names (see `preset()`)
    # Set by resolve: the depth this configuration was resolved for (the Decoder then takes it as it is).
    # Not a field of replace(): a configuration changed after resolving is resolved (and checked) again.
    resolved: int | None = field(default=None, init=False, compare=False, repr=False)
    checked: bool = field(default=False, init=False, compare=False, repr=False)  # validate() passed (as resolved)

    @property
    def adapts(self) -> bool:
        """The policy plans each round from what it measures (engine.planning.policy.adapts); checked by validate."""
        return adapts(self.policy)

    @property
    def method(self) -> str:
        """The method's name: the preset's (a list given as such is 'hispec')."""
        return (self.preset or Preset()).method

    def validate(self) -> None:
        """Check every value that does not depend on the model (recorded: resolving checks it only once)."""
        (self.preset or Preset()).validate()
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy '{self.policy}'; choose from {', '.join(POLICIES)}")
        if not isinstance(self.lookup_len, int) or isinstance(self.lookup_len, bool) or self.lookup_len < 1:
            raise ConfigError(f"lookup_len must be a whole number >= 1 (got {self.lookup_len!r})")
        if self.levels is not None:
            parse_levels(self.levels)
        if self.lengths is not None:
            _check_lengths(self.lengths)
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool):
            raise ConfigError(f"max_new_tokens must be a whole number (got {self.max_new_tokens!r})")
        if self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be 0 or more (got {self.max_new_tokens})")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"temperature must be 0 (greedy) or a positive number (got {self.temperature!r})")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError(f"top_k must be 0 (off) or a positive whole number (got {self.top_k!r})")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (got {self.top_p!r})")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise ConfigError(f"seed must be a whole number >= 0 (got {self.seed!r})")
        object.__setattr__(self, "checked", True)

    def resolve(self, num_layers: int, recommended: dict | None = None) -> DecodeConfig:
        """Fill the defaults for a model of `num_layers` layers and check every value, once: a
        configuration already resolved for this depth is returned as it is.
        `recommended`: the model's own settings (see `recommended_settings`), used for what is None."""
        if self.resolved == num_layers and self.levels is not None:
            return self
        if not self.checked:
            self.validate()
        if self.adapts and self.temperature > 0 and self.seed is not None:
            # A seed asks for a reproducible run; the auto policy's plans follow timings, which
            # differ from run to run, and the draws follow the plans. Seeded sampling runs fixed rounds.
            fixed = replace(self, policy="fixed")
            object.__setattr__(fixed, "checked", True)  # checked above: the policy is all that changed
            return fixed.resolve(num_layers, recommended)
        L, rec, given = num_layers, recommended or {}, self.preset or Preset()
        if self.levels is not None:  # a list given as such: its exits are the layers
            levels = parse_levels(self.levels)
            build_levels(levels, L)  # checks the layers
        else:
            levels = given.levels(L, rec, self.adapts)
        lengths = given.lengths(levels, tuple(self.lengths or (None, None)), rec)
        described = replace(Preset.describing(levels, given.method), draft_len=lengths and lengths[0],
                            verify_threshold=lengths and lengths[1])
        out = replace(self, levels=levels, preset=described, lengths=lengths)
        object.__setattr__(out, "resolved", L)
        object.__setattr__(out, "checked", True)
        return out

    def resolve_for(self, ee: EarlyExitModel) -> DecodeConfig:
        """This configuration resolved for a loaded model: its depth and its trained exits'
        recommended settings (the one constructor of a runnable configuration)."""
        if self.resolved == ee.num_layers and self.levels is not None:
            return self
        return self.resolve(ee.num_layers, recommended_settings(ee))

    def exit_layer(self, role: str) -> int | None:
        """The exit layer of a role ("draft", "verify") in the resolved level list (None: none)."""
        return exits_by_role(self.levels or ()).get(role)

    def plain(self) -> DecodeConfig:
        """Plain decoding with this run's budget and sampling: nothing of its levels (a 'plain' run
        that kept the exit levels would still draft at them)."""
        return replace(self, levels=None, preset=Preset("autoregressive"), lengths=None, policy="fixed")

    def as_preset(self, method: str) -> DecodeConfig:
        """The same budget and sampling under another preset, at the model's own layers and lengths."""
        return replace(self, levels=None, preset=Preset(method), lengths=None)

    def settings(self) -> dict:
        """The resolved settings as the DoneEvent and the JSON report them: the levels and lengths, and
        the preset that describes them in the paper's names (method, draft_layer, verify_layer, draft_len,
        verify_threshold: the keys every recorded artifact reads)."""
        out = asdict(self.preset or Preset())
        for name in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "levels", "lengths", "policy",
                     "lookup_len"):
            out[name] = getattr(self, name)
        return out


def run_name(method: str, policy: str | None) -> str:
    """A run's name as the comparisons and stats give it: 'hispec (auto)', 'autoregressive', 'hispec' (fixed)."""
    return f"{method} ({policy})" if policy in POLICIES and adapts(policy) else method


def recorded_lengths(settings: dict) -> tuple[int, int]:
    """A run's fixed-round lengths (k, t) from its recorded settings (`DecodeConfig.settings`; artifacts
    recorded before `lengths` was a setting name them in the paper's terms); (1, 1) where it has none."""
    k, t = settings.get("lengths") or (settings.get("draft_len"), settings.get("verify_threshold"))
    return k or 1, t or 1


def check_prompt(prompt_tokens: int, max_new_tokens: int, context_limit: int) -> None:
    """A prompt of this many tokens, with this budget, fits the model's context."""
    if not prompt_tokens:
        raise ConfigError("the prompt is empty: give at least one token of text")
    if prompt_tokens + max_new_tokens > context_limit:
        raise ConfigError(f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                          f"context of {context_limit} tokens")


def _first(*values):
    return next(v for v in values if v is not None)


def _check_lengths(lengths) -> None:
    allowed = ("lengths are two whole numbers >= 1, e.g. (2, 4): tokens drafted per fixed round, and tentative "
               "tokens that call the full model (None in a place: the preset's or the model's)")
    if not isinstance(lengths, (tuple, list)) or len(lengths) != 2:
        raise ConfigError(f"{allowed} (got {lengths!r})")
    for value in lengths:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{allowed} (got {tuple(lengths)!r})")


def _check_layers(num_layers: int, *exits: int) -> None:
    names = ("draft layer", "verify layer")
    for name, layer in zip(names, exits):
        if not 0 < layer < num_layers:
            raise ConfigError(
                f"{name} {layer} is impossible: this model has {num_layers} layers, "
                f"so exits must satisfy 0 < draft layer < verify layer < {num_layers}"
            )
    if len(exits) == 2 and exits[0] >= exits[1]:
        raise ConfigError(
            f"draft layer {exits[0]} must be below verify layer {exits[1]} "
            f"(0 < draft layer < verify layer < {num_layers})"
        )


def recommendation(draft: int, verify: int, lengths: tuple[int, int], layerskip_exit: int | None = None,
                   layerskip_drafts: int | None = None) -> dict:
    """A model's recommended settings as its exits' manifest keeps them (`default_layers`, read back by
    `recommended_settings`): hispec's exits and lengths, and layerskip's exit and drafts per round."""
    out = {"draft": draft, "verify": verify, "draft_len": lengths[0], "verify_threshold": lengths[1]}
    if layerskip_exit is not None:
        out.update(layerskip_exit=layerskip_exit, layerskip_draft_len=layerskip_drafts)
    return out


def recommended_settings(ee: EarlyExitModel) -> dict:
    """Settings recommended by the model's trained exits (their manifest's `default_layers`:
    draft, verify, draft_len, verify_threshold, layerskip_exit, layerskip_draft_len), where valid, and
    `levels`: the list recommended for the formats the model offers (`recommended_levels`), if any."""
    info = getattr(ee, "exit_info", None) or {}
    rec = {k: v for k, v in (info.get("default_layers") or {}).items()
           if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    L = ee.num_layers
    if not (0 < rec.get("draft", 0) < rec.get("verify", 0) < L):
        rec.pop("draft", None), rec.pop("verify", None)
    if not 0 < rec.get("layerskip_exit", 1) < L:
        rec.pop("layerskip_exit")
    levels = recommended_levels(ee.formats() if hasattr(ee, "formats") else (), getattr(ee, "arithmetic", None))
    if levels:
        rec["levels"] = levels
    return rec
