"""A visitor's values checked at the edge: each field by name, with what is allowed, before any work.

Every checker takes the raw value as it came (JSON from the API, a component's value from the
page) and returns a clean Python value or raises ConfigError naming the field, what it got and
what it accepts. Nothing here converts a huge integer to float (10**400 overflows) or trusts a
type: a list where a string belongs is an error like any other.
"""

from __future__ import annotations

import math
import re
from typing import Iterable

from hispec.errors import ConfigError

MAX_SEED = 2**63 - 1
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 5.0  # 0 is greedy; below 0.01 logits / t overflows


def shown(value, limit: int = 40) -> str:
    """A value as a message quotes it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def whole(name: str, value, low: int, high: int | None) -> int:
    """A whole number in [low, high] (high None: no upper bound here): 3, 3.0 (a slider's float) or "3"."""
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = int(value) if math.isfinite(value) and value == int(value) else None
    elif isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]{1,29}", value.strip()):  # ASCII digits only:
        number = int(value.strip())  # '²' is a digit to str.isdigit, and int() refuses it
    else:
        number = None
    if number is None:
        raise ConfigError(f"{name} must be a whole number (got {shown(value)})")
    if number < low or (high is not None and number > high):
        allowed = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise ConfigError(f"{name} must be {allowed} (got {shown(number)})")
    return number


def optional_whole(name: str, value, low: int, high: int) -> int | None:
    """None or "" (a field left out: the model's own setting), else a whole number in range."""
    return None if value is None or value == "" else whole(name, value, low, high)


def real(name: str, value, low: float, high: float) -> float:
    """A finite number in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{name} must be a number (got {shown(value)})")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ConfigError(f"{name} must be a number (got {shown(value)})") from None
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be a finite number (got {shown(value)})")
    if not low <= number <= high:
        raise ConfigError(f"{name} must be from {low:g} to {high:g} (got {number:g})")
    return number


def temperature(value) -> float:
    """0 (greedy) or a temperature from MIN_TEMPERATURE to MAX_TEMPERATURE."""
    t = real("temperature", value, 0.0, MAX_TEMPERATURE)
    if 0 < t < MIN_TEMPERATURE:
        raise ConfigError(f"temperature must be 0 (greedy) or from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g} "
                          f"(got {t:g})")
    return t


def seed(value) -> int | None:
    """-1, None or "" (a random seed), else a whole number from 0 to 2**63 - 1."""
    if value is None or value == "" or (not isinstance(value, bool) and value == -1):
        return None
    return whole("seed", value, 0, MAX_SEED)


def flag(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{name} must be true or false (got {shown(value)})")


def choice(name: str, value, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"unknown {name} {shown(value)}; choose from {', '.join(allowed)}")
    return value


def choices(name: str, values, allowed: Iterable[str]) -> list[str]:
    """A list of names, each one allowed (the order of `allowed`, no repeats)."""
    allowed = tuple(allowed)
    if isinstance(values, str) or not isinstance(values, (list, tuple)) or len(values) > len(allowed) * 2:
        raise ConfigError(f"{name} must be a list of names from {', '.join(allowed)} (got {shown(values)})")
    for value in values:
        choice(name.rstrip("s"), value, allowed)
    return [a for a in allowed if a in values]


def text(name: str, value, max_chars: int, empty_message: str | None = None) -> str:
    """A string of at most `max_chars` characters (checked before anything reads it), valid Unicode."""
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be text (got {type(value).__name__})")
    if len(value) > max_chars:
        raise ConfigError(f"{name} is {len(value):,} characters, over this server's limit of {max_chars:,}; "
                          "shorten it")
    if empty_message is not None and not value.strip():
        raise ConfigError(empty_message)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{name} contains characters that are not valid Unicode text (unpaired surrogates); "
                          "remove them") from None
    return value


def name(field: str, value, max_chars: int = 200) -> str | None:
    """None or "" (the default), else a short printable name."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > max_chars or not value.isprintable():
        raise ConfigError(f"{field} must be a short name (got {shown(value)})")
    return value.strip()
