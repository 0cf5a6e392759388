"""A method is a list of levels, cheapest first, ending with the full model.

    [full]                      autoregressive
    [exit E, full]              layerskip (single-exit self-speculation)
    [exit d, exit v, full]      hispec (the paper's hierarchy)
    [lookup, full]              prompt lookup
    [lookup, exit v, full]      a free drafter under the early-exit verifier
    [lookup, exit d, exit v, full]

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


@dataclass(frozen=True)
class Level:
    kind: str  # lookup | exit | full
    layer: int  # exit layer; the number of layers for the full model; 0 for lookup
    name: str  # role name: lookup | draft | verify | target

    def __str__(self) -> str:
        return {LOOKUP: "lookup", FULL: "full"}.get(self.kind, f"exit {self.layer}")


def parse_levels(spec: str | tuple | list) -> tuple[str | int, ...]:
    """'lookup,2,4' / 'lookup,exit2,exit4,full' / ('lookup', 2, 4) -> ('lookup', 2, 4) (the full
    model is implied at the top). Layer bounds are checked later, against the model."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str | int] = []
    for raw in parts:
        part = str(raw).strip().lower().replace(" ", "")
        if not part:
            continue
        if part in ("full", "target"):
            continue  # always the top level
        if part in ("lookup", "ngram"):
            out.append(LOOKUP)
            continue
        digits = part[4:] if part.startswith("exit") else part
        if not digits.isdigit():
            raise ConfigError(f"unknown level '{raw}': a level is 'lookup', an exit layer such as 4 or exit4, "
                              "or 'full' (always the last level)")
        out.append(int(digits))
    if out.count(LOOKUP) > 1 or (LOOKUP in out and out[0] != LOOKUP):
        raise ConfigError("the lookup level can appear once, at the bottom (it costs no layers): e.g. lookup,2,4")
    exits = [x for x in out if x != LOOKUP]
    if len(exits) > 2:
        raise ConfigError(f"at most two exit levels (a drafter and a verifier) are supported; got {len(exits)}")
    if exits != sorted(set(exits)):
        raise ConfigError(f"exit layers must increase from the bottom level up (got {', '.join(map(str, exits))})")
    return tuple(out)


def build_levels(spec: tuple[str | int, ...], num_layers: int) -> tuple[Level, ...]:
    """Levels with role names, checked against a model of `num_layers` layers."""
    exits = [x for x in spec if x != LOOKUP]
    for layer in exits:
        if not 0 < layer < num_layers:
            raise ConfigError(f"exit layer {layer} is impossible: this model has {num_layers} layers, "
                              f"so an exit level must be between 1 and {num_layers - 1}")
    names = _exit_roles(spec)
    levels = [Level(LOOKUP, 0, "lookup")] if LOOKUP in spec else []
    levels += [Level(EXIT, layer, name) for layer, name in zip(exits, names)]
    return tuple(levels) + (Level(FULL, num_layers, "target"),)


def _exit_roles(spec: tuple) -> list[str]:
    """The role names of a parsed list's exits, bottom up: two exits are draft and verify; a single
    exit drafts, unless the lookup level is below it, which makes it the verifier."""
    count = sum(1 for x in spec if x != LOOKUP)
    return {1: ["verify" if LOOKUP in spec else "draft"], 2: ["draft", "verify"]}.get(count, [])


def exits_by_role(spec: str | tuple | list) -> dict[str, int]:
    """The exit layer of each role of a level list: ("lookup", 2, 4) -> {"draft": 2, "verify": 4},
    (4,) -> {"draft": 4}, ("lookup", 4) -> {"verify": 4}, () -> {} (the naming of build_levels)."""
    spec = parse_levels(spec)
    return dict(zip(_exit_roles(spec), [x for x in spec if x != LOOKUP]))


def describe(levels: tuple[Level, ...]) -> str:
    return " -> ".join(str(level) for level in levels)


@dataclass(frozen=True)
class MethodSpec:
    """One method as the CLI and bench name it: METHOD, METHOD/POLICY, or LEVELS[/POLICY] with the
    levels joined by '+' (e.g. 'hispec/fixed', 'lookup+2+4/auto'); `label` is the name as written."""

    label: str
    method: str
    policy: str | None = None
    levels: tuple | None = None


def parse_method(text: str, methods: tuple[str, ...]) -> MethodSpec:
    label = text.strip()
    name, _, policy = label.partition("/")
    policy = policy.strip() or None
    if policy is not None and policy not in ("fixed", "auto"):
        raise ConfigError(f"unknown policy '{policy}' in '{label}'; write METHOD/fixed or METHOD/auto")
    if name in methods:
        return MethodSpec(label, name, policy)
    if "+" in name or name.startswith("exit") or name.isdigit():
        return MethodSpec(label, "hispec", policy, parse_levels(name.split("+")))
    raise ConfigError(f"unknown method '{name}'; choose from {', '.join(methods)}, optionally with /fixed or "
                      "/auto, or a level list joined by '+' such as lookup+2+4")
