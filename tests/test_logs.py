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
