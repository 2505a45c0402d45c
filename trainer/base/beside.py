"""One piece of work in a process beside this one, where a core is free.

A night judges every reference and every agent twice in CityLearn: on the part it learnt from (the in-sample figures
beside the headline) and on the part held out. Each is a year of one core's pure Python (30-90 s on the 2-core VM of
docs/benchmarks.md), and the two ran one after the other while the machine's other core waited. :func:`beside` starts
the first in a spawned process while the caller runs the second; :meth:`Beside.result` then collects it.

The work is a module-level function and picklable arguments (a spawned process imports them afresh: ~5 s of imports,
less than a year's evaluation). Where no core is free (a busy machine: the two would only share one), where the
process cannot start, or where it dies without an answer, the work runs here instead, with a warning for the last
two: the figures are the same either way. An exception the work raises there is raised here. A process beside ignores
Ctrl+C (the caller's to handle: a stop while waiting stops it), and ends when the caller's process does.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from trainer.base import logs
from trainer.base.signals import STOP

T = TypeVar("T")

# Work shorter than this many steps of CityLearn (~7 s on the 2-core VM) does not pay a process's start (~5 s).
MIN_STEPS = 2_000
POLL_S = 1.0  # how often the wait for the process beside looks for a stop request
STOP_WAIT_S = 5.0  # how long a process beside is given to end when stopped, before it is killed


def in_turn(count: int, length: int, free: int) -> int:
    """How many of ``count`` pieces of work (``length`` steps of CityLearn each) a process runs one after another
    where ``free`` cores are free (trainer.run.device.free_cores_now): the first, larger half where a process
    :func:`beside` it takes the rest, all of them where no core is free or the rest is too short to pay a process's
    start. The one rule for the warm start's years (their replays, the ensemble's labels) and the night's plan of
    them, so that the plan counts them as they run."""
    here = (count + 1) // 2
    return here if count > 1 and free >= 2 and length * (count - here) >= MIN_STEPS else count


class Beside(Generic[T]):
    """``fn(*args)``, in a process beside this one or (``process`` None) here when its result is asked for."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...], process: Any = None, answer: Any = None) -> None:
        self.fn, self.args, self.process, self.answer = fn, args, process, answer

    @property
    def started(self) -> bool:
        return self.process is not None

    def result(self, where: str = "an evaluation beside this one") -> T:
        """The work's result: the process's once it answers (a stop request meanwhile stops it and raises), or the
        work run here where it was not started or died without one."""
        if self.process is None:
            return self.fn(*self.args)
        process = self.process
        try:
            while not self.answer.poll(POLL_S):
                STOP.check(where)
                if not process.is_alive() and not self.answer.poll():
                    break
            ok, value = self.answer.recv()
        except (EOFError, OSError):  # it died before it answered (its end of the pipe closed)
            ok, value = None, None
        finally:
            self._end()
        if ok is None:
            logs.get().warning("the work beside this process ended without an answer: it runs here",
                               work=getattr(self.fn, "__name__", str(self.fn)), exitcode=process.exitcode)
            return self.fn(*self.args)
        if not ok:
            raise value
        return value

    def cancel(self) -> None:
        """Stop the process beside, if it still runs (the caller stopped, or failed, before asking for its result)."""
        if self.process is not None:
            self._end()

    def _end(self) -> None:
        process, self.process = self.process, None
        if process.is_alive():
            process.terminate()
        process.join(STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()
        self.answer.close()


def beside(fn: Callable[..., T], *args: Any, free: int) -> Beside[T]:
    """Start ``fn(*args)`` in a spawned process where ``free`` cores (trainer.run.device.free_cores_now) leave one for
    it; otherwise (or where it cannot start) it runs here when :meth:`Beside.result` is called."""
    if free < 2:
        return Beside(fn, args)
    context = multiprocessing.get_context("spawn")  # a fork of a process with torch's threads can hang
    answer, reply = context.Pipe(duplex=False)
    process = context.Process(target=_work, args=(reply, fn, args), name="beside", daemon=True)
    try:
        process.start()
    except Exception as exc:  # any failure to start has one remedy: run it here
        logs.get().warning("a process beside this one could not start: its work runs here",
                           error=f"{type(exc).__name__}: {exc}")
        answer.close()
        reply.close()
        return Beside(fn, args)
    reply.close()  # the child's end: closed here, so that the child's death reads as EOF
    return Beside(fn, args, process, answer)


def _work(reply: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The process beside: the work on one torch thread (the caller's process uses the other core), its result or
    its exception sent back."""
    import logging  # lazy: only a process beside sets its level

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller's to handle: it stops this process
    threading.Thread(target=leave_with_the_parent, daemon=True).start()
    logs.configure()
    logging.getLogger().setLevel(logging.WARNING)  # the caller logs the work; this process only what goes wrong
    try:
        import torch  # lazy: torch takes seconds to import

        torch.set_num_threads(1)
    except ImportError:
        pass
    try:
        result: tuple[bool, Any] = (True, fn(*args))
    except BaseException as exc:  # the caller raises it: the work failed there as it would have here
        result = (False, exc)
    try:
        reply.send(result)
    except Exception as exc:  # an exception that does not pickle: its text
        reply.send((False, RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({exc})")))
    reply.close()


def leave_with_the_parent() -> None:
    """End this process (one started beside another) when its parent is gone (killed: nothing else would stop it).
    The parent's sentinel, not its pid: Windows gives an orphan no new parent."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()
    os._exit(1)
