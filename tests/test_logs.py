"""Logs: a short local time on the console; the file has the UTC offset and the logger's name."""

from __future__ import annotations

import json
import re

from trainer.base import logs


def test_console_and_file_timestamps(tmp_path, capsys):
    logs.configure(tmp_path / "trainer.jsonl")
    logs.get().info("stage started", stage="rbc")
    console = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.match(r"^\d\d:\d\d:\d\d \[info\s*\] stage started\s+stage=rbc$", console), console
    record = json.loads((tmp_path / "trainer.jsonl").read_text().splitlines()[-1])
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$", record["timestamp"]), record
    assert (record["logger"], record["event"], record["stage"]) == ("trainer", "stage started", "rbc")
    logs.configure()


def test_the_log_keeps_the_product_s_debug_lines_and_the_libraries_from_info_up(tmp_path):
    """filelock logs each acquire and release at DEBUG (most of a tune's log was them), pydot its start."""
    import logging

    from filelock import FileLock

    logs.configure(tmp_path / "trainer.jsonl")
    with FileLock(str(tmp_path / "run.lock")):
        logs.get().debug("torch threads", threads=1)
        logging.getLogger("pydot").debug("pydot initializing")
        logging.getLogger("a_library").debug("opened")
        logging.getLogger("a_library").info("connected")  # not Ray's: once imported, its logger keeps to itself
    lines = [json.loads(line) for line in (tmp_path / "trainer.jsonl").read_text().splitlines()]
    assert [(line["logger"], line["event"]) for line in lines] == [("trainer", "torch threads"),
                                                                   ("a_library", "connected")]
    logs.configure()
