"""Errors a user can cause and fix: each message names what is wrong and what is allowed."""


class HiSpecError(ValueError):
    """Base class of every error HiSpec raises for bad input or an unusable model."""


class ConfigError(HiSpecError):
    """A decoding setting is out of range (layers, lengths, budget, method, prompt)."""


class ModelLoadError(HiSpecError):
    """A model could not be resolved or loaded (unknown id, offline, unsupported architecture)."""
