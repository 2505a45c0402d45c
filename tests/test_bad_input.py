"""The input catalogue (docs/reliability.md): each bad input gets exit 2 or 1, one line naming the
thing and the fix, no traceback, and leaves an existing run folder byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainer.cli.main import cli


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def dataset(tmp_path, site_schema) -> Path:
    """A copy of the built-in site as a user's own dataset, to break in each case."""
    copy = tmp_path / "data"
    shutil.copytree(site_schema.parent, copy)
    return copy


@pytest.fixture
def existing_run(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 42\n")
    (run / "command.txt").write_text("trainer train a2c\n")
    return run


def _break(dataset: Path, case: str) -> None:
    if case == "schema not JSON":
        (dataset / "schema.json").write_text("{ not json")
    elif case == "schema nested too deep":
        (dataset / "schema.json").write_text("[" * 100_000 + "]" * 100_000)
    elif case == "missing CSV":
        (dataset / "weather.csv").unlink()
    elif case == "NaN load":
        lines = (dataset / "Building_1.csv").read_text().splitlines()
        cells = lines[5].split(",")
        header = lines[0].split(",")
        cells[header.index("non_shiftable_load")] = "nan"
        lines[5] = ",".join(cells)
        (dataset / "Building_1.csv").write_text("\n".join(lines) + "\n")
    elif case == "no buildings":
        text = (dataset / "schema.json").read_text()
        import json

        data = json.loads(text)
        data["buildings"] = {}
        (dataset / "schema.json").write_text(json.dumps(data))
    elif case == "end step not a number":
        import json

        data = json.loads((dataset / "schema.json").read_text())
        data["simulation_end_time_step"] = "8759"
        (dataset / "schema.json").write_text(json.dumps(data))
    elif case == "CSV shorter than the period":
        lines = (dataset / "carbon_intensity.csv").read_text().splitlines()
        (dataset / "carbon_intensity.csv").write_text("\n".join(lines[:100]) + "\n")
    elif case in ("NaN forecast", "load beyond float32"):
        name, column, value = (("pricing.csv", "electricity_pricing_predicted_1", "nan") if case == "NaN forecast"
                               else ("Building_1.csv", "non_shiftable_load", "1e39"))
        lines = (dataset / name).read_text().splitlines()
        header, cells = lines[0].split(","), lines[9].split(",")
        cells[header.index(column)] = value
        lines[9] = ",".join(cells)
        (dataset / name).write_text("\n".join(lines) + "\n")
    elif case in ("no observations", "no active action"):
        import json

        data = json.loads((dataset / "schema.json").read_text())
        if case == "no observations":
            del data["observations"]
        else:
            data["actions"] = {name: {**spec, "active": False} for name, spec in data["actions"].items()}
        (dataset / "schema.json").write_text(json.dumps(data))
    elif case in SCHEMA_CLASS_CASES:
        import json

        data = json.loads((dataset / "schema.json").read_text())
        SCHEMA_CLASS_CASES[case](data["buildings"]["Building_1"])
        (dataset / "schema.json").write_text(json.dumps(data))


# Schemas naming a class CityLearn would import and run: any module, or CityLearn's own that unpickle files.
SCHEMA_CLASS_CASES = {
    "schema names a foreign class": lambda b: b.update(type="subprocess.Popen"),
    "schema names LSTM dynamics": lambda b: b.update(dynamics={"type": "citylearn.dynamics.LSTMDynamics",
                                                               "attributes": {"filepath": "model.pth"}}),
}

CASES = [
    # (case, extra arguments, exit code, the line's start, a word of the fix)
    ("schema not JSON", [], 2, "error: {data}/schema.json:1:3: not a CityLearn schema", "schema.json"),
    ("schema nested too deep", [], 2, "error: {data}/schema.json: not a CityLearn schema (JSON nested deeper than "
                                      "Python reads)", "schema.json"),
    ("missing CSV", [], 2, "error: {data}/weather.csv: building Building_1's weather file is missing", "restore"),
    ("NaN load", [], 2, "error: {data}/Building_1.csv: building Building_1's energy_simulation file, row 6, "
                        "column non_shiftable_load", "finite"),
    ("no buildings", [], 2, "error: {data}/schema.json: the schema has no buildings", "add at least one"),
    ("end step not a number", [], 2, "error: {data}/schema.json: simulation_end_time_step should be a whole number, "
                                     "0 or more, found \"8759\"", "fix it in the schema"),
    ("CSV shorter than the period", [], 2, "error: {data}/carbon_intensity.csv: building Building_1's "
                                           "carbon_intensity file has 99 rows but the schema's period needs 8,760",
     "add the missing rows"),
    ("NaN forecast", [], 2, "error: {data}/pricing.csv: building Building_1's pricing file, row 10, column "
                            "electricity_pricing_predicted_1: nan is not a finite number", "every row"),
    ("load beyond float32", [], 2, "error: {data}/Building_1.csv: building Building_1's energy_simulation file, "
                                   "row 10, column non_shiftable_load: 1e+39 is beyond 1e+15", "check the units"),
    ("schema names a foreign class", [], 2, "error: {data}/schema.json: buildings.Building_1.type names the class "
                                            "'subprocess.Popen', which this product does not load", "docs/scenario.md"),
    ("schema names LSTM dynamics", [], 2, "error: {data}/schema.json: buildings.Building_1.dynamics.type names the "
                                          "class 'citylearn.dynamics.LSTMDynamics'", "remove the key"),
    ("no observations", [], 2, "error: {data}/schema.json: the schema has no active observations", "add"),
    ("no active action", [], 2, "error: {data}/schema.json: the schema has no active actions", "\"active\": true"),
    ("load beyond any site", ["--set", "scenario.building_base_kw=1e308"], 2,
     "error: config key 'scenario.building_base_kw': input should be less than or equal to 100000", "1e308"),
    ("seed too large", ["--seed", "4294967296"], 2, "error: config key 'seed'", "less than or equal"),
    ("unknown timezone", ["--set", "scenario.timezone=Mars/Base"], 2,
     "error: config key 'scenario.timezone': unknown time zone", "IANA"),
    ("NaN entropy", ["--set", "ppo.ent_coef=.nan"], 2, "error: config key 'ppo.ent_coef'", "finite"),
    ("infinite reward weight", ["--set", "reward.co2=.inf"], 2, "error: config key 'reward.co2'", "finite"),
    ("zero-width network", ["--set", "sac.net_arch=[0]"], 2, "error: config key 'sac.net_arch.0'", "greater"),
    ("escaping run name", ["--set", "output.run_name=../escaped_{seed}"], 2, "error: config key 'output.run_name'",
     "inside output.root"),
    ("unknown placeholder", ["--set", "output.run_name=run_{when}"], 2, "error: config key 'output.run_name'",
     "placeholder"),
    ("misspelt ignored observation", ["--set", "observations.ignore=[monht]"], 2,
     "error: observations.ignore names 'monht', which {data}/schema.json does not observe", "fix the name"),
]


@pytest.mark.parametrize("case, extra, code, start, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_anything_is_written(case, extra, code, start, fix, dataset, existing_run):
    _break(dataset, case)
    before = snapshot(existing_run)
    result = CliRunner().invoke(cli, ["train", "a2c", "--schema", str(dataset), "--out", str(existing_run),
                                      "--device", "cpu", *extra])
    lines = result.output.strip().splitlines()
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(start.format(data=dataset)), lines[0]
    assert fix in lines[0]
    assert snapshot(existing_run) == before


def test_a_config_file_that_is_not_utf8_is_named(tmp_path, existing_run):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"scenario:\n  location_name: Caf\xe9\n")
    before = snapshot(existing_run)
    result = CliRunner().invoke(cli, ["train", "a2c", "--config", str(bad), "--out", str(existing_run)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {bad}: not UTF-8 text (byte 0xe9 at offset 30); save the file as UTF-8"
    assert snapshot(existing_run) == before


def test_a_config_of_nested_aliases_is_refused_and_a_huge_value_is_not_echoed(tmp_path, existing_run):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\nseed: *a8\n")  # 9 ** 9 values once expanded
    huge = "seed=[" + ",".join(["1"] * 100_000) + "]"
    before = snapshot(existing_run)
    for extra in (["--config", str(bomb)], ["--set", huge]):
        result = CliRunner().invoke(cli, ["train", "a2c", *extra, "--out", str(existing_run)])
        assert result.exit_code == 2 and len(result.output) < 300, result.output[:300]
        assert snapshot(existing_run) == before
    assert "an alias (*name): config files are read without anchors and aliases" in (
        CliRunner().invoke(cli, ["train", "a2c", "--config", str(bomb), "--out", str(existing_run)]).output)


def test_launch_checks_its_budget_before_the_doctor_or_a_folder(tmp_path):
    result = CliRunner().invoke(cli, ["launch", "--budget", "banana", "--", "--set", f"output.root={tmp_path}/o"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --budget expects a duration like 10h, 90m or 1h30m, got 'banana'"
    assert not (tmp_path / "o").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs, where this machine lets the test mount one."""
    import os
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount); the full-disk test needs one")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_costs_the_final_save_not_the_stage_s_checkpoints(small_disk, site_schema, monkeypatch):
    from trainer.learn import callbacks

    original = callbacks.ProgressCallback._on_training_end

    def fill_the_disk(self):  # the disk fills up just as training ends
        original(self)
        with open(small_disk / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError:
                pass

    monkeypatch.setattr(callbacks.ProgressCallback, "_on_training_end", fill_the_disk)
    run = small_disk / "run"
    overrides = ["a2c.checkpoint_freq_steps=100", "a2c.n_steps=10", "warm_start.epochs=0", "schedule.eval_days=1",
                 "output.tensorboard=false", "reliability.checkpoint_min_interval_s=0"]
    result = CliRunner().invoke(cli, ["train", "a2c", "--timesteps", "200", "--schema", str(site_schema), "--out",
                                      str(run), "--device", "cpu", *[a for o in overrides for a in ("--set", o)]])
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: a2c: could not save the trained model to {run / 'a2c' / 'model.zip'}: "
                           "No space left on device"), last
    assert "the last checkpoint is" in last and f"resume with: trainer train a2c --resume {run}" in last
    assert "Traceback" not in result.output and "Logging error" not in result.output
    assert not (run / "a2c" / ".tmp-model.zip").exists()
    assert (run / "a2c" / "checkpoints" / "step_0000000100" / "manifest.json").is_file()


def test_report_refuses_a_run_a_trainer_is_writing(tmp_path):
    import json

    from trainer.run.lock import RunLock

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"baseline": {"co2_kg_per_year": 1.0}}))
    lock = RunLock(run).acquire()
    try:
        result = CliRunner().invoke(cli, ["report", str(run)])
    finally:
        lock.release()
    assert result.exit_code == 1 and f"run folder {run} is in use by" in result.output
    assert not (run / "report.md").exists()


def test_damaged_state_files_say_what_to_do(tmp_path):
    from trainer.base.files import DamagedFile, read_json

    for name, fix in (("results.json", "trainer evaluate"), ("schedule.json", "plan the night again")):
        path = tmp_path / name
        path.write_text('{"baseline": {"co2')
        with pytest.raises(DamagedFile, match=fix):
            read_json(path)


def test_a_manifest_without_files_skips_that_checkpoint(tmp_path):
    from trainer.learn.checkpoint_store import verify

    (tmp_path / "manifest.json").write_text('{"step": 100}')
    assert verify(tmp_path).startswith("unreadable manifest: KeyError")
    (tmp_path / "manifest.json").write_text('{"step": 100, "files": []}')
    assert verify(tmp_path).startswith("unreadable manifest")


def _checkpoint(run: Path, agent: str, config: dict) -> None:
    import json

    folder = run / agent / "checkpoints" / "step_0000000100"
    folder.mkdir(parents=True)
    files = {"state.json": json.dumps({"step": 100, "config": config}).encode(), "rng.json": b"{}"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    manifest = {"step": 100, "files": {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                                       for name, data in files.items()}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_resume_checks_what_the_agent_depends_on_and_allows_a_longer_run(tmp_path):
    from trainer.base.errors import UsageError
    from trainer.config.loading import load_config
    from trainer.learn.preflight import check_resume_config

    run = tmp_path / "run"
    _checkpoint(run, "a2c", load_config(overrides=["a2c.timesteps=1000"]).to_dict())
    longer = load_config(overrides=["a2c.timesteps=5000", "sac.batch_size=64", "schedule.budget=2h"])
    check_resume_config(run, "a2c", longer, force=False)  # longer, another agent and the night's timing: fine
    changed = load_config(overrides=["a2c.learning_rate=0.01"])
    default = load_config().a2c.learning_rate
    with pytest.raises(UsageError, match=re.escape(f"a2c.learning_rate ({default} -> 0.01)")):
        check_resume_config(run, "a2c", changed, force=False)
    with pytest.raises(UsageError, match=r"has no ppo checkpoint to resume \(it holds a2c's\)"):
        check_resume_config(run, "ppo", longer, force=False, require_checkpoint=True)


# Links planted in a run folder, each to a file or folder outside it that a write would reach.
LINKS = {".lock.json": "file", "logs/trainer.jsonl": "file", "a2c": "folder", "site": "folder"}


@pytest.mark.parametrize("name", list(LINKS))
def test_a_link_out_of_the_run_folder_is_refused_before_any_write(name, dataset, existing_run, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me\n")
    link = existing_run / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside / "precious.txt" if LINKS[name] == "file" else outside)
    before, elsewhere = snapshot(existing_run), snapshot(outside)
    result = CliRunner().invoke(cli, ["train", "a2c", "--schema", str(dataset), "--out", str(existing_run),
                                      "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"error: {link} is a symbolic link to {(outside / 'precious.txt' if LINKS[name] == 'file' else outside)}, "
        f"outside the run folder; the trainer writes only inside {existing_run}: remove the link (copy what it points "
        "to into the folder if it is needed)")
    assert snapshot(existing_run) == before and snapshot(outside) == elsewhere
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]


def test_a_link_inside_the_run_folder_is_harmless(existing_run):
    from trainer.run.folder import RunDir

    (existing_run / "notes").mkdir()
    (existing_run / "latest-config.yaml").symlink_to(existing_run / "config.yaml")
    RunDir(existing_run).refuse_links_out()  # no error


def test_a_replay_buffer_too_big_leaves_an_existing_run_as_it_was(existing_run):
    before = snapshot(existing_run)
    result = CliRunner().invoke(cli, ["train", "sac", "--out", str(existing_run), "--device", "cpu",
                                      "--set", "sac.buffer_size=100000000000"])
    assert result.exit_code == 2, result.output
    assert "needs" in result.output and "set sac.buffer_size to at most" in result.output.strip().splitlines()[-1]
    assert snapshot(existing_run) == before
    assert sorted(p.name for p in existing_run.iterdir()) == ["command.txt", "config.yaml"]


@pytest.mark.parametrize("seeds, message", [
    ("3,3", "error: --seeds names 3 more than once, got '3,3'; list each seed once"),
    ("1,1000001", "error: --seeds expects comma-separated integers from 0 to 1000000, got '1,1000001'"),
])
def test_seeds_are_distinct_and_in_range(seeds, message, tmp_path):
    sweep = tmp_path / "sweep"
    result = CliRunner().invoke(cli, ["night", "--seeds", seeds, "--out", str(sweep)])
    assert result.exit_code == 2 and result.output.strip() == message
    assert not sweep.exists()


def test_a_sweep_checks_its_dataset_before_writing_its_folder(dataset, tmp_path):
    _break(dataset, "missing CSV")
    sweep = tmp_path / "sweep"
    result = CliRunner().invoke(cli, ["night", "--seeds", "1,2", "--quick", "--schema", str(dataset), "--out",
                                      str(sweep)])
    assert result.exit_code == 2 and "weather file is missing" in result.output
    assert not sweep.exists()


def test_a_damaged_sweep_json_is_named(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text('{"seeds": "1,2"}')
    result = CliRunner().invoke(cli, ["night", "--resume", str(sweep)])
    assert result.exit_code == 1
    assert result.output.strip() == (
        f'error: {sweep / "sweep.json"}: expected {{"seeds": [distinct non-negative integers], ...}}, found '
        '{"seeds": "1,2"}; restore it or start the sweep again with --seeds')


@pytest.mark.parametrize("name", ["", "elsewhere/citylearn_challenge_2022_phase_all", "..", "a\\b"])
def test_a_dataset_name_is_a_name(name, existing_run):
    before = snapshot(existing_run)
    result = CliRunner().invoke(cli, ["train", "a2c", "--dataset", name, "--out", str(existing_run)])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: --dataset takes a CityLearn dataset's name (no '/' or '\\', not empty), "
                                     f"got {name!r}; pass a dataset's folder or schema.json with --schema PATH")
    assert snapshot(existing_run) == before


def _run_folder(tmp_path: Path, site_schema: Path) -> Path:
    """A finished run's folder with just the state files the commands read."""
    import json

    import yaml

    from trainer.config.loading import load_config

    run = tmp_path / "run"
    shutil.copytree(Path(site_schema).parent, run / "site")
    (run / "config.yaml").write_text(yaml.safe_dump(load_config().to_dict()))  # the whole config, as a run has it
    (run / ".lock").touch()  # every run folder the trainer made has its lock file
    (run / "run.json").write_text(json.dumps({"schema": None, "label": None}))
    (run / "results.json").write_text(json.dumps({"baseline": {"co2_kg": 1.0}}))
    return run


# A state file of the right JSON but the wrong shape, the command that reads it, and the line's middle.
STATE_FILES = {
    "run.json list": ("run.json", "[1, 2]", ["evaluate"],
                      "is damaged: at the top level, input should be a dictionary"),
    "run.json schema a number": ("run.json", '{"schema": 5, "label": null}', ["evaluate"],
                                 "is damaged: at schema, input should be a valid string, found 5"),
    "results.json list": ("results.json", "[1]", ["report"], "is damaged: at the top level, input should be a valid "
                                                             "dictionary, found [1]"),
    "results.json entry a number": ("results.json", '{"sac": 3}', ["report"], "is damaged: at sac, input should be"),
    "schedule.json without created_at": ("schedule.json", '{"stages": 5}', ["report"], "created_at is missing"),
    "schedule.json without stages": ("schedule.json", '{"created_at": "x", "deadline": null, "budget_s": null}',
                                     ["night", "--resume"], "stages is missing"),
    "schedule.json with no stage": ("schedule.json", '{"created_at": "x", "deadline": null, "budget_s": null, '
                                                     '"stages": []}', ["report"], "stages is empty"),
    "schedule.json unknown status": (
        "schedule.json", '{"created_at": "x", "deadline": null, "budget_s": null, "stages": [{"name": "sac", '
                         '"kind": "train", "status": "finished"}]}', ["report"],
        "at stages.0.status, input should be 'pending', 'running', 'done', 'failed' or 'skipped', found \"finished\""),
}


@pytest.mark.parametrize("case", list(STATE_FILES))
def test_a_state_file_of_the_wrong_shape_is_named_with_the_key_and_the_fix(case, tmp_path, site_schema):
    from trainer.base.files import FIXES

    name, content, command, middle = STATE_FILES[case]
    run = _run_folder(tmp_path, site_schema)
    (run / name).write_text(content)
    before = snapshot(run)
    result = CliRunner().invoke(cli, [*command, str(run)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"error: {run / name} ") and middle in line and line.endswith(FIXES[name]), line
    assert snapshot(run) == before


def test_a_checkpoint_state_of_the_wrong_types_is_skipped(tmp_path):
    import json

    from trainer.learn.checkpoint_store import verify

    (tmp_path / "state.json").write_text(json.dumps({"step": "1000"}))
    (tmp_path / "rng.json").write_text("{}")
    digest = {}
    for name in ("state.json", "rng.json"):
        content = (tmp_path / name).read_bytes()
        digest[name] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    (tmp_path / "manifest.json").write_text(json.dumps({"step": 1000, "files": digest}))
    assert verify(tmp_path) == ("state.json is not a checkpoint's state (an object with a whole-number step and a "
                                "config object)")


def test_a_checkpoint_state_key_of_the_wrong_type_names_it():
    from pydantic import ValidationError

    from trainer.learn.state import TrainingState

    with pytest.raises(ValidationError, match="n_envs"):
        TrainingState.from_dict({"step": 10, "n_envs": "many"})
    assert TrainingState.from_dict({"step": 10}).n_envs == 1  # keys written before they existed keep defaults


@pytest.mark.parametrize("command", [["night", "--quick"], ["plan"]])
def test_a_budget_beyond_a_year_is_refused(command, tmp_path):
    result = CliRunner().invoke(cli, [*command, "--budget", "99999999h", "--out", str(tmp_path / "run")]
                                if command[0] == "night" else [*command, "--budget", "99999999h"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --budget expects a duration of at most 366 days, got '99999999h'; a "
                                     "longer run is a training length: set timesteps instead")
    assert not (tmp_path / "run").exists()


@pytest.fixture
def read_only_run(tmp_path, site_schema):
    """A run folder on a read-only file system (a bind mount; permissions do not stop root)."""
    import subprocess

    run = _run_folder(tmp_path / "ro", site_schema)
    if os.geteuid() != 0:
        for path in (run, *run.rglob("*")):
            path.chmod(0o555 if path.is_dir() else 0o444)
        yield run
        for path in (run, *run.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        return
    folder = tmp_path / "ro"
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0 and \
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True).returncode == 0
    if not mounted:
        subprocess.run(["umount", str(folder)], capture_output=True)
        pytest.skip("running as root, and a read-only bind mount cannot be made here")
    try:
        yield run
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("command", ["report", "evaluate"])
def test_a_read_only_run_folder_is_exit_2(command, read_only_run):
    result = CliRunner().invoke(cli, [command, str(read_only_run)])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"error: cannot write in run folder {read_only_run}: ") and "make it writable" in line


def test_a_seed_folder_linked_out_of_a_sweep_is_refused(tmp_path):
    sweep, away = tmp_path / "sweep", tmp_path / "away"
    sweep.mkdir()
    away.mkdir()
    (sweep / "seed-1").symlink_to(away)
    result = CliRunner().invoke(cli, ["night", "--quick", "--seeds", "1,2", "--out", str(sweep)])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"error: {sweep / 'seed-1'} is a symbolic link to {away}, outside")
    assert list(away.iterdir()) == [] and sorted(p.name for p in sweep.iterdir()) == ["seed-1"]


# Files a report reads besides the state files, damaged as a crash or an editor would leave them.
REPORT_INPUTS = {
    "metrics.json kept a number": ("sac/metrics.json", '{"kept": 5}', "at kept, input should be a valid dictionary"),
    "eval_curve.csv without its columns": ("sac/eval_curve.csv", "garbage,,\n1\n",
                                           "the column(s) step, co2_kg_per_year, ev_departure_soc_met_pct"),
    "eval_timeseries.csv without its columns": ("baseline/eval_timeseries.csv", "a,b\n1,2\n",
                                                "the column(s) net_kwh, carbon_kg_per_kwh"),
}


@pytest.mark.parametrize("case", list(REPORT_INPUTS))
def test_a_damaged_file_the_report_reads_is_named_with_the_way_on(case, tmp_path, site_schema):
    from trainer.base.files import FIXES

    name, content, middle = REPORT_INPUTS[case]
    run = _run_folder(tmp_path, site_schema)
    (run / "sac").mkdir()
    (run / "sac" / "eval_curve.csv").write_text("step,co2_kg_per_year,ev_departure_soc_met_pct\n1000,5000,100\n")
    (run / name).parent.mkdir(parents=True, exist_ok=True)
    (run / name).write_text(content)
    result = CliRunner().invoke(cli, ["report", str(run)])
    assert result.exit_code == 1, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"error: {run / name} is damaged") and middle in line, line
    assert line.endswith(FIXES[Path(name).name]) and "Traceback" not in result.output


def test_scenario_build_writes_no_file_through_a_link(tmp_path):
    out, precious = tmp_path / "site", tmp_path / "precious.csv"
    out.mkdir()
    precious.write_text("keep me\n")
    (out / "weather.csv").symlink_to(precious)
    result = CliRunner().invoke(cli, ["scenario", "build", "--out", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"error: {out / 'weather.csv'} is a symbolic link to {precious}, outside "
                                            "the dataset folder")
    assert precious.read_text() == "keep me\n"


def test_benchmark_refuses_a_json_path_it_cannot_write_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(cli, ["benchmark", "--quick", "--json", str(blocker / "figures.json")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().startswith(f"error: cannot write the figures to {blocker / 'figures.json'}")
    assert "steps/s" not in result.output  # nothing was measured first


# ------------------------------------------------------------------ refusals on a run that trained (issue 55)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, week) -> Path:
    """A run that trained A2C a few hundred steps on the built-in site's first week, with its report."""
    from tests.conftest import tiny_overrides

    run = tmp_path_factory.mktemp("trained") / "run"
    sets = [arg for o in tiny_overrides() for arg in ("--set", o)]
    trained = CliRunner().invoke(cli, ["train", "a2c", "--timesteps", "256", "--out", str(run), "--schema", str(week),
                                       "--device", "cpu", *sets])
    assert trained.exit_code == 0, trained.output
    assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == 0
    return run


@pytest.fixture
def a_run(trained_run, tmp_path) -> Path:
    """A copy of :func:`trained_run` for one test to refuse things on."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    return copy


def _other_devices(week: Path, folder: Path) -> Path:
    import json

    data = json.loads(week.read_text())  # its root_directory: the built-in site's folder
    next(iter(data["buildings"].values())).pop("chargers", None)
    folder.mkdir()
    (folder / "schema.json").write_text(json.dumps(data))
    return folder / "schema.json"


# (case, arguments with RUN for the run and OTHER for a dataset with other devices, exit code, the line's start)
RUN_REFUSALS = [
    ("a resume on another dataset", ["night", "--resume", "RUN", "--schema", "OTHER"], 2,
     "error: --resume: OTHER holds other data than the dataset RUN learnt on"),
    ("a sweep resumed from a run", ["night", "--resume", "RUN", "--seeds", "1,2"], 2,
     "error: --seeds starts a sweep, and RUN is not one (no sweep.json)"),
    ("a sweep into a run's folder", ["night", "--seeds", "1,2", "--out", "RUN"], 2,
     "error: RUN is a run's folder, not a sweep's: choose another --out"),
    ("an export of an agent it did not train", ["export", "RUN", "--agent", "sac"], 2,
     "error: RUN has no trained sac: no RUN/sac/model.zip"),
    ("an export into the run's own folder", ["export", "RUN", "--out", "RUN"], 2,
     "error: RUN exists and is not an export: choose another --out"),
    ("an export into an agent's folder", ["export", "RUN", "--out", "RUN/a2c"], 2,
     "error: RUN/a2c exists and is not an export"),
]


@pytest.mark.parametrize("case, args, code, start", RUN_REFUSALS, ids=[c[0] for c in RUN_REFUSALS])
def test_a_refused_command_leaves_a_trained_run_byte_for_byte(case, args, code, start, a_run, week, tmp_path):
    other = _other_devices(week, tmp_path / "other")
    names = {"RUN": str(a_run), "OTHER": str(other)}
    before = snapshot(a_run)
    result = CliRunner().invoke(cli, [names.get(a, a.replace("RUN", str(a_run))) for a in args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and lines[0].startswith(start.replace("RUN", str(a_run)).replace("OTHER", str(other))), \
        result.output
    assert snapshot(a_run) == before


def test_evaluate_on_a_device_the_machine_lacks_leaves_the_run_as_it_was(a_run):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    before = snapshot(a_run)
    result = CliRunner().invoke(cli, ["evaluate", str(a_run), "--device", "cuda"])
    assert result.exit_code == 2 and result.output.startswith("error: --device cuda was requested"), result.output
    assert snapshot(a_run) == before  # its log and held-out.json included


# (the file damaged, what it is made to hold, the command, the line's start): read strictly, nothing rewritten.
DAMAGED = [
    ("config.yaml", "{}\n", ["export", "RUN"], "error: RUN/config.yaml is damaged: a run's config.yaml holds the "
                                               "whole config the run was made with, and seed, scenario"),
    ("config.yaml", "{}\n", ["train", "a2c", "--resume", "RUN"], "error: RUN/config.yaml is damaged"),
    ("config.yaml", "{ nope\n", ["report", "RUN"], "error: RUN/config.yaml:2:1: YAML syntax error"),
    ("results.json", "[1, 2]", ["export", "RUN"], "error: RUN/results.json is damaged: at the top level"),
    ("results.json", "{ nope", ["train", "a2c", "--resume", "RUN", "--timesteps", "512"],
     "error: RUN/results.json is damaged (JSONDecodeError"),
    ("results.json", "[" * 100_000 + "]" * 100_000, ["report", "RUN"],
     "error: RUN/results.json is damaged (JSON nested deeper than Python reads)"),
    ("a2c/model.zip", "not a zip", ["evaluate", "RUN"], "error: RUN/a2c/model.zip is not an SB3 model.zip"),
    ("a2c/checkpoints/*/state.json", "{ x", ["train", "a2c", "--resume", "RUN", "--timesteps", "512"],
     "error: --resume: every a2c checkpoint in RUN is damaged: step_"),
    ("a2c/metrics.json", "{ nope", ["report", "RUN"], "error: RUN/a2c/metrics.json is damaged"),
    ("validation-site/references.json", "[1, 2]", ["report", "RUN"],
     "error: RUN/validation-site/references.json is damaged: expected an object"),
]


@pytest.mark.parametrize("name, text, args, start", DAMAGED, ids=[f"{d[0]} {d[2][0]}" for d in DAMAGED])
def test_a_damaged_file_of_a_trained_run_is_named_and_nothing_is_rewritten(name, text, args, start, a_run):
    for path in a_run.glob(name):  # each checkpoint's, where the name has a wildcard
        path.write_text(text)
    before = snapshot(a_run)
    result = CliRunner().invoke(cli, [a.replace("RUN", str(a_run)) for a in args])
    lines = result.output.strip().splitlines()
    assert result.exit_code in (1, 2) and len(lines) == 1, result.output
    assert lines[0].startswith(start.replace("RUN", str(a_run))), lines[0]
    assert snapshot(a_run) == before  # the report and its plots as they were, the log untouched
