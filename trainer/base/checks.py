"""A readiness check's result: what was checked, whether it passes, warns or fails, and the fix.

At the base of the package: ``trainer doctor`` gathers them, and each night backend says with one
whether it can run here (``trainer.night.backends``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CheckStatus(StrEnum):
    PASS = "pass"
    WARN = "warn"   # the night runs, with less than it could have
    FAIL = "fail"   # the night would not run: the launcher stops here


PASS, WARN, FAIL = CheckStatus


@dataclass
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str = ""
