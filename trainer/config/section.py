"""What every config section is: a pydantic model that refuses unknown keys, each field documented.

Kept apart from ``config.py`` so the agent sections (``agent_config.py``) and the roster that
names them (``roster.py``) sit below the ``Config`` assembled from them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """A config section: unknown keys are errors, values are checked on assignment."""

    # NaN and infinity can never train (a NaN entropy coefficient rolls back for ever): refused here.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


def doc(description: str, **constraints: Any) -> Any:
    """A required field with its one-line description (defaults live in YAML)."""
    return Field(..., description=description, **constraints)
