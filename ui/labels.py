"""What the page calls things, and the engine's names behind them (the one mapping)."""

from __future__ import annotations

from hispec.engine.config import recommended_levels
from hispec.engine.levels import level_words  # noqa: F401 (words for levels live with the levels)
from hispec.engine.planning.round import kind_words as plan_words  # noqa: F401 (a plan kind's words live with the round)
from hispec.engine.planning.policy import DEFAULT_POLICY

METHODS = {"HiSpec": "hispec", "LayerSkip (single exit)": "layerskip", "Lookup (copies earlier text)": "lookup",
           "Autoregressive": "autoregressive"}
ADAPTIVE, FIXED = "Adaptive (auto)", "Fixed (the settings below)"
POLICIES = {ADAPTIVE: "auto", FIXED: "fixed"}
DEFAULT_POLICY_LABEL = next(label for label, name in POLICIES.items() if name == DEFAULT_POLICY)
BASELINES = {"Autoregressive": "autoregressive", "LayerSkip (single exit)": "layerskip"}


def method_name(label) -> str:
    """The engine's name of a method label (an unknown label is passed on: the check names it)."""
    return METHODS.get(label, label)


def policy_name(label) -> str:
    return POLICIES.get(label, label)


def method_label(name: str) -> str:
    return next((label for label, n in METHODS.items() if n == name), name)


# The level lists the page offers (the engine's words behind them); any other list can be typed in.
LEVELS = {"HiSpec's own (lookup → exit d → exit v → full when adaptive)": "",
          "lookup → 4-bit full model → full (precision level)": "lookup,full@q4",
          "4-bit full model → full": "full@q4",
          "lookup → 4-bit full model with int8 activations → full": "lookup,full@a8"}


def default_levels(formats: tuple[str, ...]) -> str:
    """The Levels box's first value for a model offering these cheaper formats: the engine's recommended
    list (hispec.engine.config.recommended_levels: the precision list where the 4-bit copy is offered),
    else HiSpec's own list."""
    recommended = recommended_levels(formats)
    text = ",".join(map(str, recommended)) if recommended else ""
    return next((label for label, value in LEVELS.items() if value == text), list(LEVELS)[0])


POLICY_WORDS = {"auto": "adaptive", "fixed": "fixed"}


def run_words(name: str) -> str:
    """A compared run as the page names it: 'hispec (auto)' -> 'HiSpec, adaptive', 'layerskip' -> 'LayerSkip
    (single exit)', 'hispec' -> 'HiSpec, fixed' (an unknown name is passed on)."""
    method, _, policy = name.partition(" (")
    policy = policy.rstrip(")") or ("fixed" if method in ("hispec", "lookup") else "")  # no tag: fixed rounds
    words = method_label(method)
    return f"{words}, {POLICY_WORDS.get(policy, policy)}" if policy else words


def running_words(progress: str) -> str:
    """Compare's progress with the run named as the page names it: 'Running hispec (auto)… (1 of 6)' ->
    'Running HiSpec, adaptive… (1 of 6)' (evaluation.compare's words; other text is passed on)."""
    head, dots, rest = progress.partition("…")
    if not head.startswith("Running ") or not dots:
        return progress
    return f"Running {run_words(head.removeprefix('Running '))}…{rest}"


def levels_name(label) -> str:
    """The engine's level list of a Levels choice ('' : the method's own); typed text is passed on."""
    return LEVELS.get(label, label or "")
