"""A method is a list of levels, cheapest first, ending with the full model.

    [full]                      autoregressive
    [exit E, full]              layerskip (single-exit self-speculation)
    [exit d, exit v, full]      hispec (the paper's hierarchy)
    [lookup, full]              prompt lookup
    [lookup, exit v, full]      a free drafter under the early-exit verifier
    [lookup, exit d, exit v, full]
    [full@q4, full]             the same weights in a cheaper format draft (a precision level)
    [lookup, full@q4, full]     lookup drafts, the 4-bit model tentatively verifies, the exact model decides
    [lookup, full@a8, full]     on the 4-bit model: its int8-activation copy tentatively verifies

A level is (depth, precision): an exit layer or the full depth, run in the model's exact format or in a
cheaper format of the same weights (``PRECISIONS``; written ``E@q4`` or ``full@q4``). The levels of one
precision share that format's KV caches and hidden states through the stage stack; a cheaper format is
a separate lane of the stack, with caches of its own, so the exact model's caches only ever hold what the
exact model computed. Going up the list, levels never get shallower, and at equal depth they get more
precise; the exact full model is always the top.

The bottom level proposes; each level above judges what the level below proposed and writes its
own token at the first mismatch; the full model has the last word, so greedy output is the full
model's own whatever the list. Exit levels share KV caches and hidden states through the stage
stack (their layers are the stack's boundaries); the lookup level runs no layer at all.

Levels carry role names, which are the event vocabulary's stage names: "lookup", "draft" (the
lowest exit when two exits are listed, or the only exit when nothing is below it), "verify" (the
exit just below the full model), and "target" (the full model). So the presets keep the names
their events, statistics and JSON have always had.
"""

from __future__ import annotations

from dataclasses import dataclass

from hispec.errors import ConfigError

LOOKUP, EXIT, FULL = "lookup", "exit", "full"
FORMAT_WORDS = {"q4": "4-bit", "a8": "4-bit, int8-activation"}  # the cheaper formats as people say them


def level_words(level) -> str:
    """A level in words, as the page and the comparisons say it: 4 -> 'exit 4', 'full@q4' -> 'the 4-bit full
    model', '4@q4' -> 'exit 4 in 4-bit', 'lookup' -> 'lookup'."""
    text = str(level)
    if "@" in text:
        depth, _, fmt = text.partition("@")
        fmt = FORMAT_WORDS.get(fmt, fmt)
        return f"the {fmt} full model" if depth == "full" else f"exit {depth} in {fmt}"
    return text if text == LOOKUP or text.startswith("exit") else f"exit {text}"


# Cheaper formats of the same weights a level may run in (the exact format is the model's own: None).
# q4: the GGUF file's own 4-bit blocks through the batch-invariant kernel (hispec/model/formats/q4.py);
# a8: the same blocks with int8 activations per block of 32 (the kernel's act8 products), cheaper still.
# Listed from the most precise down: at equal depth a level above is never less precise than one below.
PRECISIONS = ("q4", "a8")
_RANK = {None: len(PRECISIONS), **{p: len(PRECISIONS) - 1 - i for i, p in enumerate(PRECISIONS)}}


@dataclass(frozen=True)
class Level:
    kind: str  # lookup | exit | full
    layer: int  # exit layer; the number of layers for the full model; 0 for lookup
    name: str  # role name: lookup | draft | verify | target
    precision: str | None = None  # None: the model's exact format; else one of PRECISIONS

    @property
    def depth(self) -> int:
        return self.layer

    @property
    def spec(self) -> str | int:
        """This level as written in a parsed list: 'lookup', 4, '4@q4' or 'full@q4' (the top: 'full')."""
        if self.kind == LOOKUP:
            return LOOKUP
        if self.precision is None:
            return self.layer if self.kind == EXIT else "full"
        return f"{'full' if self.kind == FULL else self.layer}@{self.precision}"

    def __str__(self) -> str:
        base = {LOOKUP: "lookup", FULL: "full"}.get(self.kind, f"exit {self.layer}")
        return base if self.precision is None else f"{base}@{self.precision}"


def parse_levels(spec: str | tuple | list) -> tuple[str | int, ...]:
    """'lookup,2,4' / 'lookup,exit2,exit4,full' / ('lookup', 2, 4) -> ('lookup', 2, 4) (the full
    model is implied at the top); 'lookup,full@q4' -> ('lookup', 'full@q4'); '2@q4,full@q4' ->
    ('2@q4', 'full@q4'). Exact exits are ints, levels in a cheaper format 'E@P' or 'full@P' strings.
    Layer bounds are checked later, against the model."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str | int] = []
    for raw in parts:
        item = _parse_one(raw)
        if item is not None:
            out.append(item)
    if out.count(LOOKUP) > 1 or (LOOKUP in out and out[0] != LOOKUP):
        raise ConfigError("the lookup level can appear once, at the bottom (it costs no layers): e.g. lookup,2,4")
    middle = [x for x in out if x != LOOKUP]
    listed = ", ".join(map(str, middle))
    if len(middle) > 2:
        raise ConfigError(f"at most two exit levels (a drafter and a verifier, in any precision) are supported "
                          f"below the full model; got {len(middle)}: {listed}")
    keys = [_order_key(x) for x in middle]
    if keys != sorted(set(keys)):
        if all(isinstance(x, int) for x in middle):
            raise ConfigError(f"exit layers must increase from the bottom level up (got {listed})")
        raise ConfigError(f"levels must get deeper (or, at the same depth, more precise) from the bottom up, "
                          f"each once (got {listed}; e.g. lookup,4@q4,full@q4 or 2,full@q4)")
    return tuple(out)


def _parse_one(raw) -> str | int | None:
    """One level as written -> its parsed form (None for the implied top, 'full')."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    part = str(raw).strip().lower().replace(" ", "")
    if not part or part in ("full", "target"):
        return None  # the exact full model: always the top level
    if part in ("lookup", "ngram"):
        return LOOKUP
    depth, at, precision = part.partition("@")
    if at and precision not in PRECISIONS:
        raise ConfigError(f"unknown precision '{precision}' in level '{raw}': choose from {', '.join(PRECISIONS)} "
                          "(e.g. full@q4 or 4@q4), or leave it out for the model's exact format")
    if at and depth in ("full", "target"):
        return f"full@{precision}"
    digits = depth[4:] if depth.startswith("exit") else depth
    if not (digits.isascii() and digits.isdigit()):  # '²', '٣' and '４' are digits to str.isdigit
        raise ConfigError(f"unknown level '{raw}': a level is 'lookup', an exit layer such as 4 or exit4 "
                          "(its number in the digits 0-9), "
                          f"either of those in a cheaper format such as 4@q4 or full@q4, "
                          "or 'full' (always the last level)")
    return f"{int(digits)}@{precision}" if at else int(digits)


def split_level(item: str | int) -> tuple[int | None, str | None]:
    """A parsed level -> (exit layer, precision): 4 -> (4, None), '4@q4' -> (4, 'q4'),
    'full@q4' -> (None, 'q4') (None: the full depth)."""
    if isinstance(item, int):
        return item, None
    depth, _, precision = str(item).partition("@")
    return (None if depth == "full" else int(depth)), (precision or None)


def _order_key(item) -> tuple[float, int]:
    """Deeper is higher; at equal depth the exact format is higher than a cheaper one (q4 above a8)."""
    layer, precision = split_level(item)
    return (float("inf") if layer is None else layer, _RANK[precision])


def build_levels(spec: tuple[str | int, ...], num_layers: int) -> tuple[Level, ...]:
    """Levels with role names, checked against a model of `num_layers` layers."""
    middle = [x for x in spec if x != LOOKUP]
    for item in middle:
        layer, _ = split_level(item)
        if layer is not None and not 0 < layer < num_layers:
            raise ConfigError(f"exit layer {layer} is impossible: this model has {num_layers} layers, "
                              f"so an exit level must be between 1 and {num_layers - 1}")
    names = _exit_roles(spec)
    levels = [Level(LOOKUP, 0, "lookup")] if LOOKUP in spec else []
    for item, name in zip(middle, names):
        layer, precision = split_level(item)
        levels.append(Level(FULL if layer is None else EXIT, num_layers if layer is None else layer, name, precision))
    return tuple(levels) + (Level(FULL, num_layers, "target"),)


def recorded_levels(settings: dict) -> tuple[Level, ...]:
    """A run's levels with their roles, from its recorded settings (`levels`, `num_layers`: a DoneEvent's, a
    report's). Raises KeyError without `num_layers`, ConfigError for a list it cannot be."""
    return build_levels(parse_levels(settings.get("levels") or ()), settings["num_layers"])


def _exit_roles(spec: tuple) -> list[str]:
    """The role names of a parsed list's middle levels, bottom up: two are draft and verify; a single
    one drafts, unless the lookup level is below it, which makes it the verifier."""
    count = sum(1 for x in spec if x != LOOKUP)
    return {1: ["verify" if LOOKUP in spec else "draft"], 2: ["draft", "verify"]}.get(count, [])


def exits_by_role(spec: str | tuple | list) -> dict[str, int]:
    """The exact exit layer of each role of a level list: ("lookup", 2, 4) -> {"draft": 2, "verify": 4},
    (4,) -> {"draft": 4}, ("lookup", 4) -> {"verify": 4}, () -> {} (the naming of build_levels). Roles
    held by a level in a cheaper format are left out (see `levels_by_role`)."""
    return {role: item for role, item in levels_by_role(spec).items() if isinstance(item, int)}


def levels_by_role(spec: str | tuple | list) -> dict[str, str | int]:
    """The parsed level of each role: ("lookup", "full@q4") -> {"verify": "full@q4"}."""
    spec = parse_levels(spec)
    return dict(zip(_exit_roles(spec), [x for x in spec if x != LOOKUP]))


def precisions(spec: tuple) -> tuple[str, ...]:
    """The cheaper formats a parsed list runs in (each is a lane of the stage stack)."""
    return tuple(dict.fromkeys(p for x in spec if x != LOOKUP for p in [split_level(x)[1]] if p))


def exact_exits(spec: tuple) -> tuple[int, ...]:
    """The exit layers a parsed list runs in the exact format."""
    return tuple(x for x in spec if isinstance(x, int))


def describe_spec(spec: tuple) -> str:
    """A parsed list in words, bottom up: ('lookup', 'full@q4') -> 'lookup -> full@q4 -> full'."""
    words = ["lookup" if x == LOOKUP else (f"exit {x}" if isinstance(x, int) else str(x)) for x in spec]
    return " -> ".join([*words, "full"])


def describe(levels: tuple[Level, ...]) -> str:
    return " -> ".join(str(level) for level in levels)
