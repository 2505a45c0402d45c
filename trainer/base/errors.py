"""Exceptions the CLI turns into one clear line and an exit code.

Anything under :class:`UsageError` is the user's input (exit 2, nothing written);
anything under :class:`TrainerError` is a runtime failure (exit 1).
"""


class TrainerError(Exception):
    """A runtime failure with a message a person can act on (exit 1)."""

    exit_code = 1


class NothingTrained(TrainerError):
    """A night that ran to its end but trained no agent: every training stage skipped or stopped at 0 steps (exit 3,
    so a script or scheduler can tell it from a night that trained)."""

    exit_code = 3


class UsageError(TrainerError):
    """Bad usage: a wrong option, path or config (exit 2, nothing written)."""

    exit_code = 2


class ConfigError(UsageError):
    """The config failed to parse or validate."""


class DatasetError(UsageError):
    """A CityLearn dataset or schema that cannot be found or loaded."""
