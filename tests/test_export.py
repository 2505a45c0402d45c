"""`trainer export`: each algorithm's policy exported, proven against the run's evaluation in CityLearn, and
its controller.py acting with numpy and onnxruntime alone (torch, SB3, CityLearn and the product blocked)."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.shipped.controller import CHECK_FILE, EXPECTED_PREFIX, SPEC_FILE, Controller, InputError, forecast_names

from .conftest import tiny_overrides

pytest.importorskip("onnxruntime", reason="trainer export needs the export extra (pip install -e '.[export]')")

# Each algorithm on a short window; SAC reading neither the month nor the day type, PPO with the carbon look-ahead,
# the load's look-back and the forecast of the hours ahead among its observations, A2C on the V2G site, so the
# exported guard also meets discharging cars (and its validation year is a V2G site too: built from the site's own
# scenario, not the run's config).
CASES = {"sac": ("site_schema", 200, ("observations.ignore=[month,day_type]",)),
         "ppo": ("site_schema", 256, ("observations.carbon_ahead_hours=[3,12]",
                                      "observations.load_ago_hours=[24]", "observations.forecast=true")),
         "a2c": ("v2g_schema", 200, ())}
# What a process running controller.py may not import: everything but numpy, onnxruntime and the stdlib.
BLOCKED = ("torch", "stable_baselines3", "citylearn", "trainer", "gymnasium", "pandas", "onnx", "onnxscript",
           "sklearn", "scipy", "click", "yaml", "pydantic")
RUNNER = textwrap.dedent("""
    import importlib.abc, runpy, sys
    BLOCKED = {blocked!r}
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"controller.py imported {{name}}")
    sys.meta_path.insert(0, Refuse())
    sys.argv = ["controller.py", *sys.argv[1:]]
    runpy.run_path("controller.py", run_name="__main__")
""")


def standalone(folder: Path, *args: str, blocked: tuple[str, ...] = BLOCKED) -> subprocess.CompletedProcess:
    """``python controller.py ARGS`` in ``folder``, in an isolated interpreter that refuses the product's stack
    (``blocked``: the packages it may not import)."""
    return subprocess.run([sys.executable, "-I", "-c", RUNNER.format(blocked=blocked), *args], cwd=folder,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def exports(request, tmp_path_factory) -> dict[str, tuple[Path, Path, str]]:
    """agent -> (run folder, export folder, the export command's output), each trained a few hundred steps."""
    out = {}
    for agent, (site, steps, extra) in CASES.items():
        run = tmp_path_factory.mktemp(f"run-{agent}")
        sets = [arg for o in tiny_overrides(*extra) for arg in ("--set", o)]
        trained = CliRunner().invoke(cli, ["train", agent, "--timesteps", str(steps), "--out", str(run), "--schema",
                                           str(request.getfixturevalue(site)), "--device", "cpu", *sets])
        assert trained.exit_code == 0, trained.output
        exported = CliRunner().invoke(cli, ["export", str(run)])  # its only agent is the one the report recommends
        assert exported.exit_code == 0, exported.output
        out[agent] = (run, run / "export" / agent, exported.output)
    return out


@pytest.mark.parametrize("agent", list(CASES))
def test_the_export_acts_as_the_product_did_in_citylearn(agent, exports):
    run, folder, output = exports[agent]
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", CHECK_FILE, "controller.py", "policy.onnx",
                                                        SPEC_FILE]
    spec = json.loads((folder / SPEC_FILE).read_text())
    proof = spec["verification"]
    night = json.loads((run / "results.json").read_text())[agent]
    assert proof["steps"] == night["eval_hours"] == 3 * 24 - 1  # the whole evaluation, replayed
    assert proof["max_action_difference"] <= 1e-5
    for key in ("co2_kg", "ev_departure_soc_met_pct", "cost", "grid_import_kwh"):
        assert proof["figures"][key]["night"] == night[key]
        assert proof["figures"][key]["exported"] == pytest.approx(night[key], rel=1e-4), key
    assert spec["policy"]["agent"] == agent and spec["metrics"]["co2_kg_per_year"] == night["co2_kg_per_year"]
    assert f"exported {agent} to {folder}" in output
    # an untrained policy leaves cars short: the sample holds steps where the guard raised the EV actions
    controller = Controller.load(folder)
    assert controller.guard_on and len(controller.chargers) == (2 if agent == "a2c" else 4)
    ahead = [o for o in spec["observations"] if "_ahead_" in o["name"]]
    assert [o["name"] for o in ahead] == (["carbon_intensity_ahead_3h", "carbon_intensity_ahead_12h"]
                                          if agent == "ppo" else [])
    assert all(o["unit"] == "kg CO2 per kWh from the grid" for o in ahead)
    ago = [o for o in spec["observations"] if "_ago_" in o["name"]]
    assert [o["name"] for o in ago] == (["non_shiftable_load_ago_24h"] if agent == "ppo" else [])
    assert all(o["unit"].startswith("kWh used by the building's other loads that many hours before") for o in ago)
    clipped = [f["observation"] for f in spec["features"] if f["clip"]]
    assert clipped == [o["name"] for o in ahead]  # the look-ahead is scaled as the current intensity, clipped
    # An observation the policy does not read is still in the raw list, checked by the range CityLearn defines it in.
    read = {f["observation"] for f in spec["features"]}
    checked = {o["name"]: o["valid"] for o in spec["observations"]}
    assert ({"month", "day_type"} & read == set()) == (agent == "sac")
    assert checked["month"][0] <= 1 and checked["month"][1] >= 12 and checked["day_type"][1] >= 7
    # The forecast is the controller's own, learnt from the readings it acts on: never asked of the site, and over
    # every step of the evaluation the same as the product's.
    if agent == "ppo":
        names = forecast_names(["any"])
        assert spec["forecast"]["names"] == names and names[0] == "net_load_forecast_1_3h" and len(names) == 8
        assert not set(names) & set(checked) and set(names) <= read
        assert spec["forecast"]["loads"] == ["non_shiftable_load"] and spec["forecast"]["hour"] == "hour"
        assert proof["max_forecast_difference"] == 0.0
    else:
        assert "forecast" not in spec and proof["max_forecast_difference"] == 0.0


def test_the_exported_forecast_learns_from_the_readings_in_order_and_refuses_half_of_it_given(exports):
    folder = exports["ppo"][1]
    rows = _sample(folder)
    controller = Controller.load(folder)
    site = {n: float(rows[0][n]) for n in controller.site_names}
    first = controller.raw_vector(dict(site))
    again = controller.raw_vector(dict(site))  # the same readings an hour later: the forecast has learnt them
    n = len(controller.site_names)
    assert len(first) == n + 8 and np.array_equal(first[:n], again[:n]) and not np.array_equal(first[n:], again[n:])
    fresh = Controller.load(folder)
    assert np.array_equal(fresh.raw_vector(dict(site))[n:], first[n:])  # it starts where the spec says
    given = {**site, **{name: float(rows[0][name]) for name in controller.names[n:]}}
    assert np.array_equal(fresh.raw_vector(given)[n:], [float(rows[0][name]) for name in controller.names[n:]])
    with pytest.raises(InputError, match="1 of the forecast's 8 readings given: the controller forecasts the hours "
                                         "ahead itself"):
        fresh.raw_vector({**site, controller.names[n]: 0.0})


def test_act_keeps_the_forecast_between_calls_in_a_state_file(exports, tmp_path):
    # A site calls `act` once an hour: with --state each call goes on learning the forecast where the last left it,
    # as one controller acting on every hour would; without it each call starts from the export's.
    folder = exports["ppo"][1]
    rows = _sample(folder)
    one = Controller.load(folder)
    steps = [{n: float(row[n]) for n in one.site_names} for row in rows[:3]]
    expected = [one.act(dict(step)) for step in steps]
    state = tmp_path / "forecast.json"
    for i, step in enumerate(steps):
        path = tmp_path / f"step-{i}.json"
        path.write_text(json.dumps(step))
        acted = standalone(folder, "act", "--obs", str(path), "--state", str(state))
        assert acted.returncode == 0, acted.stderr
        got = json.loads(acted.stdout)
        for name, action in expected[i].items():
            assert got[name]["kw"] == pytest.approx(action["kw"], abs=1e-6), (i, name)
    assert json.loads(state.read_text()) == json.loads(json.dumps(one.forecast_state()))
    assert "act --obs step.json --state forecast.json" in (folder / "README.md").read_text()
    assert "--state" not in (exports["sac"][1] / "README.md").read_text()  # it reads no forecast
    alone = standalone(folder, "act", "--obs", str(tmp_path / "step-2.json"))  # from the export's state
    fresh = Controller.load(folder).act(dict(steps[2]))
    assert {n: a["kw"] for n, a in json.loads(alone.stdout).items()} == pytest.approx(
        {n: a["kw"] for n, a in fresh.items()}, abs=1e-6)
    assert Controller.load(folder).forecast_state() != one.forecast_state()

    for text, says in (("{not json", "is not JSON"), (json.dumps({"fixed_sum": [[0.0] * 24] * 2}), "is damaged"),
                       (json.dumps({**one.forecast_state(), "fixed_sum": [[0.0] * 24] * 2}),
                        "forecasts 2 building(s), this export 1: it is another export's")):
        state.write_text(text)
        refused = standalone(folder, "act", "--obs", str(tmp_path / "step-0.json"), "--state", str(state))
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and refused.stdout == "" and len(lines) == 1, refused.stderr
        assert lines[0].startswith(f"error: --state {state} ") and says in lines[0], lines[0]
        assert state.read_text() == text  # left as it was
    # A state that cannot be written: the actions stand, one line says so, exit 2.
    nowhere = tmp_path / "no-such-folder" / "forecast.json"
    unwritten = standalone(folder, "act", "--obs", str(tmp_path / "step-0.json"), "--state", str(nowhere))
    assert unwritten.returncode == 2 and json.loads(unwritten.stdout).keys() == expected[0].keys()
    assert f"--state {nowhere} could not be written" in unwritten.stderr and not nowhere.parent.exists()
    # An export whose policy reads no forecast keeps nothing.
    plain = exports["sac"][1]
    step = tmp_path / "plain.json"
    step.write_text(standalone(plain, "example").stdout)
    kept = tmp_path / "plain-state.json"
    assert standalone(plain, "act", "--obs", str(step), "--state", str(kept)).returncode == 0 and not kept.exists()


@pytest.mark.parametrize("agent", list(CASES))
def test_controller_py_checks_acts_and_gives_an_example_with_numpy_and_onnxruntime_only(agent, exports):
    folder = exports[agent][1]
    check = standalone(folder, "check")
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("ok: acted on 71 of 71 steps of the evaluation")
    example = standalone(folder, "example")
    assert example.returncode == 0, example.stderr
    step = json.loads(example.stdout)
    (folder.parent / f"{agent}-step.json").write_text(example.stdout)
    acted = standalone(folder, "act", "--obs", str(folder.parent / f"{agent}-step.json"))
    assert acted.returncode == 0, acted.stderr
    actions = json.loads(acted.stdout)
    row = next(iter(_sample(folder)))
    spec = json.loads((folder / SPEC_FILE).read_text())
    assert list(step) == [o["name"] for o in spec["observations"]]
    for entry in spec["actions"]:  # the product's action for that step, guard applied, within 1e-5
        assert actions[entry["name"]]["value"] == pytest.approx(float(row[EXPECTED_PREFIX + entry["name"]]), abs=1e-5)
    battery = actions["electrical_storage"]
    assert battery["kw"] == pytest.approx(battery["value"] * spec["actions"][0]["kw_per_unit"])


def _sample(folder: Path) -> list[dict[str, str]]:
    with (folder / CHECK_FILE).open(newline="") as handle:
        return list(csv.DictReader(handle))


def guard_one_car(controller: Controller):
    """(soc, required, hours_left, wanted) -> (the exported guard's action, its change: +1 raised, -1 lowered) for a
    car at the export's first charger, every other reading zero."""
    charger = controller.chargers[0]
    capacity = controller.batteries[0]["capacity_kwh"]
    position = {name: i for i, name in enumerate(controller.names)}
    raw = np.zeros(len(controller.names))

    def guarded(soc: float, required: float, hours_left: int, wanted: float) -> tuple[float, int]:
        for name, value in ((charger.connected, 1), (charger.soc, soc), (charger.capacity, capacity),
                            (charger.required_soc, required), (charger.departure_time, hours_left)):
            raw[position[name]] = value
        native = np.zeros(len(controller.actions))
        native[charger.action] = wanted
        native, changed = controller.guarded(raw, native)
        return float(native[charger.action]), changed[charger.action]

    return guarded


def test_the_exported_guard_keeps_a_discharge_only_where_the_car_is_still_served(exports):
    controller = Controller.load(exports["a2c"][1])
    assert controller.chargers[0].charger["max_discharge_kw"] == pytest.approx(7.2)  # the V2G site's discharge
    capacity = controller.batteries[0]["capacity_kwh"]
    path = controller._path(0, capacity)
    guarded = guard_one_car(controller)

    assert guarded(0.9, 0.3, 5, -1.0) == (-1.0, 0)  # plenty of slack: the policy's full discharge stands
    # full power this step and the next three just serve it: the discharge becomes charging, and enough of it
    reach = path.reachable(path.stored_after(0.3 * capacity, 1.0), 3)
    needed = (reach - 0.5) / capacity - controller.margin_soc
    action, change = guarded(0.3, needed, 3, -1.0)
    assert change == 1 and 0.0 < action <= 1.0
    goal = (needed + controller.margin_soc) * capacity
    assert path.reachable(path.stored_after(0.3 * capacity, action), 3) >= goal
    assert guarded(0.35, 0.3, 5, 1.0) == (1.0, 0)  # a car that can feed the site back may hold more than its goal
    # ... as much as it can still feed back before it leaves: at its last step, what is beyond its goal goes to the
    # site (all a step can give here), and a step before that, it is kept to one step's discharge above the goal
    assert guarded(0.9, 0.3, 5, 1.0)[1] == -1 and guarded(0.9, 0.3, 0, 0.0) == (-1.0, -1)
    goal = (0.3 + controller.margin_soc) * capacity
    one_step = goal - path.stored_after(goal, -1.0)
    start = goal + one_step + 1.0  # a kWh more than it can feed back: idle becomes a discharge of that kWh
    action, change = guarded(start / capacity, 0.3, 1, 0.0)
    assert change == -1 and -1.0 < action < 0.0
    assert path.stored_after(start, action) == pytest.approx(goal + one_step, abs=1e-4)


def test_the_exported_guard_stops_a_charge_only_car_at_its_goal(exports):
    controller = Controller.load(exports["sac"][1])  # the built-in site: chargers that cannot discharge
    assert controller.stop_at_target
    capacity = controller.batteries[0]["capacity_kwh"]
    path = controller._path(0, capacity)
    guarded = guard_one_car(controller)

    goal = (0.8 + controller.margin_soc) * capacity
    action, change = guarded(0.75, 0.8, 5, 1.0)  # full power would fill it past 80 %: it stops at the goal
    assert change == -1 and 0.0 < action < 1.0
    assert path.stored_after(0.75 * capacity, action) == pytest.approx(goal, abs=1e-4)
    assert guarded(0.75, 0.8, 5, 0.05) == (0.05, 0)  # a charge that stays below the goal stands
    assert guarded(0.9, 0.8, 5, 1.0) == (0.0, -1)  # a car already past its goal takes nothing more
    assert guarded(0.9, 0.8, 5, -1.0) == (-1.0, 0)  # a negative action on a charge-only charger is idle anyway
    # the last step before departure, short of the goal: raised to serve it, whatever the stop
    action, change = guarded(0.7, 0.8, 0, 0.0)
    assert change == 1 and path.stored_after(0.7 * capacity, action) >= goal - 1e-6


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("hour"), "missing observation 'hour'"),
    (lambda s: s.update(solar_generation=float("nan")), "observation 'solar_generation' is nan: expected a finite"),
    (lambda s: s.update(hour="noon"), "observation 'hour' is 'noon': expected a number"),
    (lambda s: s.update(hour=25), "observation 'hour' is 25, outside 1..24"),
    (lambda s: s.update(outdoor_dry_bulb_temperature=300.0), "outside"),
    (lambda s: s.update(pressure=1.0), "unknown observation 'pressure'"),
])
def test_bad_observations_are_refused_in_one_line_with_exit_2(change, message, exports, tmp_path):
    folder = exports["ppo"][1]
    step = json.loads(standalone(folder, "example").stdout)
    change(step)
    path = tmp_path / "step.json"
    path.write_text(json.dumps(step))
    acted = standalone(folder, "act", "--obs", str(path))
    assert acted.returncode == 2 and acted.stdout == ""
    lines = acted.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and message in lines[0], acted.stderr
    with pytest.raises(InputError, match=re.escape(message.split(":")[0])):
        Controller.load(folder).act(step)


def test_a_csv_of_steps_gives_a_csv_of_actions_in_kw(exports, tmp_path):
    folder = exports["sac"][1]
    acted = standalone(folder, "act", "--obs", str(folder / CHECK_FILE))  # the expected columns are ignored
    assert acted.returncode == 0, acted.stderr
    lines = acted.stdout.strip().splitlines()
    assert lines[0].split(",")[0] == "electrical_storage_kw" and len(lines) == 1 + len(_sample(folder))


@pytest.mark.parametrize("location", ["weights.bin", "../outside.bin"])
def test_a_policy_whose_weights_lie_in_other_files_is_refused(exports, tmp_path, location):
    """ONNX external data: a network may name files for its weights; the controller reads none, inside the export
    folder or outside it, whatever onnxruntime's version would allow."""
    onnx = pytest.importorskip("onnx")
    from onnx.external_data_helper import convert_model_to_external_data

    folder = tmp_path / "export"
    folder.mkdir()
    for path in exports["ppo"][1].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    model = onnx.load(str(folder / "policy.onnx"))
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location=location, size_threshold=0)
    for tensor in model.graph.initializer:  # the location as an attacker writes it, not as onnx would clean it
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    (folder / "policy.onnx").write_bytes(model.SerializeToString())
    (folder / location).resolve().write_bytes(b"\0" * 1024)
    spec = json.loads((folder / SPEC_FILE).read_text())
    spec["policy"]["sha256"] = hashlib.sha256((folder / "policy.onnx").read_bytes()).hexdigest()
    (folder / SPEC_FILE).write_text(json.dumps(spec))
    check = standalone(folder, "check")
    assert check.returncode == 2, check.stderr
    assert check.stderr.strip() == (f"error: {folder / 'policy.onnx'} keeps its weights in other files (ONNX external "
                                    "data), which the controller does not read: an export holds its whole network "
                                    "in one file; export the run again")


def test_the_export_holds_no_pickle(exports):
    for agent in CASES:
        for path in exports[agent][1].iterdir():
            data = path.read_bytes()
            assert not data.startswith(b"\x80") and b"PK\x03\x04" not in data[:4], path  # no pickle, no zip
    # the policy is an ONNX graph: a protobuf ModelProto that onnx reads back
    onnx = pytest.importorskip("onnx")
    model = onnx.load(str(exports["ppo"][1] / "policy.onnx"))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["observation"]


def test_a_check_that_finds_a_difference_exits_1(exports, tmp_path):
    folder = tmp_path / "tampered"
    source = exports["ppo"][1]
    folder.mkdir()
    for path in source.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    rows = (folder / CHECK_FILE).read_text().splitlines()
    header = rows[0].split(",")
    column = header.index(EXPECTED_PREFIX + "electrical_storage")
    cells = rows[5].split(",")
    cells[column] = repr(float(cells[column]) + 0.01)
    rows[5] = ",".join(cells)
    (folder / CHECK_FILE).write_text("\n".join(rows) + "\n")
    check = standalone(folder, "check")
    assert check.returncode == 1 and check.stdout.startswith("MISMATCH") and "(row 5)" in check.stdout


def test_export_refuses_a_folder_that_is_not_an_export_and_a_run_without_the_agent(exports, tmp_path):
    run = exports["ppo"][0]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(cli, ["export", str(run), "--out", str(mine)])
    assert result.exit_code == 2 and "exists and is not an export" in result.output
    assert (mine / "notes.txt").read_text() == "keep me"
    result = CliRunner().invoke(cli, ["export", str(run), "--agent", "sac"])
    assert result.exit_code == 2 and "has no trained sac" in result.output and "trainer train sac" in result.output
    # An earlier export with a file of the user's beside it: replacing the export would delete the file.
    earlier = exports["ppo"][1]
    (earlier / "notes.txt").write_text("keep me")
    try:
        before = {p.name: p.read_bytes() for p in earlier.iterdir() if p.is_file()}
        result = CliRunner().invoke(cli, ["export", str(run), "--out", str(earlier)])
        assert result.exit_code == 2 and "files it did not write (notes.txt)" in result.output, result.output
        assert {p.name: p.read_bytes() for p in earlier.iterdir() if p.is_file()} == before
    finally:
        (earlier / "notes.txt").unlink()


def test_export_names_the_extra_it_needs(exports, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    result = CliRunner().invoke(cli, ["export", str(exports["ppo"][0])])
    assert result.exit_code == 2 and "needs onnxruntime (the export extra)" in result.output
    assert ".[export]" in result.output


def test_a_spec_of_another_version_is_refused(exports, tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    spec = json.loads((exports["ppo"][1] / SPEC_FILE).read_text())
    (folder / SPEC_FILE).write_text(json.dumps({**spec, "version": 99}))
    (folder / "controller.py").write_bytes((exports["ppo"][1] / "controller.py").read_bytes())
    result = standalone(folder, "check")
    assert result.returncode == 2 and "version 99: expected 'pvbess-controller' version 1" in result.stderr


def test_a_failed_proof_writes_nothing_and_keeps_the_earlier_export(exports, monkeypatch):
    from trainer.export import exporter

    run, folder, _ = exports["ppo"]
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setattr(exporter, "CHECK_TOLERANCE", -1.0)  # no difference is small enough: the proof fails
    result = CliRunner().invoke(cli, ["export", str(run)])
    assert result.exit_code == 1 and "differ from the product's" in result.output
    assert "nothing was exported" in result.output
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not [p.name for p in folder.parent.iterdir() if p.name.endswith(".partial")]  # none left beside it


def test_a_stop_signal_during_an_export_leaves_no_half_written_folder(exports, monkeypatch):
    import os
    import signal

    from trainer.export import exporter

    run, folder, _ = exports["ppo"]
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    from trainer.base.signals import STOP

    monkeypatch.setattr(exporter, "_write_sample", lambda *a: os.kill(os.getpid(), signal.SIGTERM))
    monkeypatch.setattr(STOP, "signum", None)  # the stop this test sends is gone with it, not left to the next test
    result = CliRunner().invoke(cli, ["export", str(run)])
    assert result.exit_code == 128 + signal.SIGTERM, result.output
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not [p.name for p in folder.parent.iterdir() if p.name.endswith(".partial")]


def test_a_damaged_export_is_named_in_one_line(exports, tmp_path):
    folder = tmp_path / "damaged"
    folder.mkdir()
    for path in exports["ppo"][1].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "policy.onnx").write_bytes(b"not a graph")
    check = standalone(folder, "check")  # another file than the export's: its digest says so
    assert check.returncode == 2 and "policy.onnx is not the policy spec.json was written with" in check.stderr
    spec = json.loads((folder / SPEC_FILE).read_text())
    spec["policy"]["sha256"] = hashlib.sha256(b"not a graph").hexdigest()
    (folder / SPEC_FILE).write_text(json.dumps(spec))
    check = standalone(folder, "check")
    assert check.returncode == 2 and check.stderr.startswith(f"error: {folder / 'policy.onnx'} could not be loaded")
    del spec["features"]
    (folder / SPEC_FILE).write_text(json.dumps(spec))
    check = standalone(folder, "check")
    assert check.returncode == 2 and "is not a whole export (no 'features')" in check.stderr
    assert len(check.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("damage, says", [
    ("policy outside", "names the policy file '../policy.onnx': expected a file of the export folder itself"),
    ("action range NaN", "an action's range is not two finite numbers"),
    ("row longer than its header", "more cells than the header has names"),
    ("readings not UTF-8", "is not UTF-8 text"),
    ("deeply nested JSON", "the export folder or the readings are damaged (RecursionError"),
])
def test_a_damaged_export_or_reading_gets_one_line_and_exit_2(damage, says, exports, tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    for path in exports["ppo"][1].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    spec = json.loads((folder / SPEC_FILE).read_text())
    obs = tmp_path / "obs.csv"
    header = ",".join(o["name"] for o in spec["observations"])
    row = ",".join("0" for _ in spec["observations"])
    obs.write_text(f"{header}\n{row}\n")
    if damage == "policy outside":
        spec["policy"]["file"] = "../policy.onnx"
    elif damage == "action range NaN":
        spec["actions"][0]["high"] = float("nan")
    elif damage == "row longer than its header":
        obs.write_text(f"{header}\n{row},1\n")
    elif damage == "readings not UTF-8":
        obs.write_bytes(f"{header}\n".encode() + b"\xff\xfe,1\n")
    else:
        obs = tmp_path / "obs.json"
        obs.write_text("[" * 100_000 + "]" * 100_000)
    (folder / SPEC_FILE).write_text(json.dumps(spec))
    result = standalone(folder, "act", "--obs", str(obs))
    assert result.returncode == 2 and says in result.stderr, result.stderr[-500:]
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_the_guard_looks_a_bounded_way_ahead(exports):
    from trainer.shipped.controller import Controller

    controller = Controller.load(exports["ppo"][1])
    path = controller._path(0, controller.batteries[0]["capacity_kwh"])
    # A car "leaving in a billion hours" is full after a few days: the walk stops there, not a billion steps on.
    assert path.reachable(0.0, 10**9) == pytest.approx(path.reachable(0.0, 24 * 30))


def test_check_acts_on_another_period_counting_readings_beyond_training_and_refusing_the_implausible(exports,
                                                                                                     tmp_path):
    folder = exports["ppo"][1]
    spec = json.loads((folder / SPEC_FILE).read_text())
    net = next(o for o in spec["observations"] if o["name"] == "net_electricity_consumption")
    trained_high, valid_high = net["trained"][1], net["valid"][1]
    assert trained_high < valid_high  # a measured reading: acted on well beyond what training held
    rows = [{k: v for k, v in row.items() if not k.startswith(EXPECTED_PREFIX)} for row in _sample(folder)[:10]]
    for row in rows[:3]:  # a summer peak beyond training
        row["net_electricity_consumption"] = repr((trained_high + valid_high) / 2)
    with (tmp_path / "summer.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    check = standalone(folder, "check", "--obs", str(tmp_path / "summer.csv"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith(f"ok: acted on 10 of 10 steps of {tmp_path / 'summer.csv'}")
    assert "readings beyond the range the policy trained on (acted on, as a deployed controller would): " \
           "net_electricity_consumption 3" in check.stdout
    rows[4]["net_electricity_consumption"] = repr(valid_high * 1000)  # a reading in W, not kWh
    with (tmp_path / "watts.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    check = standalone(folder, "check", "--obs", str(tmp_path / "watts.csv"))
    assert check.returncode == 1 and check.stdout.startswith("REFUSED: acted on 9 of 10 steps")
    assert "refused 1 step(s) with a reading outside what is plausible; first: row 5: observation " \
           "'net_electricity_consumption'" in check.stdout
