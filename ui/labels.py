"""What the page calls things, and the engine's names behind them (the one mapping)."""

from __future__ import annotations

from hispec.engine.policy import DEFAULT_POLICY

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
