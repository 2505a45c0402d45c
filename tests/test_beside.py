"""Work in a process beside this one (trainer.base.beside): the same answer as here, an error raised here, and
nothing lost where the process dies or is not worth starting."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from structlog.testing import capture_logs

from trainer.base.beside import beside


def _where(tag: str) -> tuple[str, int]:
    return tag, os.getpid()


def _fails(message: str) -> None:
    raise ValueError(message)


def _dies_beside() -> str:
    if multiprocessing.parent_process() is not None:  # only in the process beside: here it answers
        os._exit(3)
    return "here"


def _waits() -> None:
    multiprocessing.Event().wait()  # never set: only a cancel ends it


def test_the_work_runs_beside_where_a_core_is_free_and_here_where_none_is():
    work = beside(_where, "a", free=2)
    assert work.started
    tag, pid = work.result()
    assert tag == "a" and pid != os.getpid()
    alone = beside(_where, "b", free=1)
    assert not alone.started and alone.result() == ("b", os.getpid())
    assert multiprocessing.active_children() == []


def test_an_error_beside_is_raised_here():
    with pytest.raises(ValueError, match="the work's own message"):
        beside(_fails, "the work's own message", free=2).result()


def test_a_process_that_dies_without_an_answer_leaves_the_work_to_this_one():
    with capture_logs() as logged:
        answer = beside(_dies_beside, free=2).result()
    assert answer == "here"
    warning = next(e for e in logged if e["log_level"] == "warning")
    assert warning["event"] == "the work beside this process ended without an answer: it runs here"
    assert warning["exitcode"] == 3


def test_a_cancelled_work_leaves_no_process():
    work = beside(_waits, free=2)
    assert work.started and len(multiprocessing.active_children()) == 1
    work.cancel()
    assert multiprocessing.active_children() == []
