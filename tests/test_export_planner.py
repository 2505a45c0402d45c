"""`trainer export` of the day-ahead planner: where it is the controller to deploy (on a dataset, it cuts more than
every agent), the export ships it with its linear program, proven against the night's evaluation of it, and its
controller.py plans with numpy and scipy alone (the product, torch, CityLearn and onnxruntime blocked)."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.shipped.controller import CHECK_FILE, PROGRAM_FILE, SPEC_FILE, Controller, _check

from .conftest import variant
from .test_export import BLOCKED, standalone

pytest.importorskip("onnxruntime", reason="trainer export needs the export extra (pip install -e '.[export]')")

EVAL_DAYS = 3
# What a planner's export may not import: the product's stack and onnxruntime (no network); scipy solves.
PLANNER_BLOCKED = (*(b for b in BLOCKED if b != "scipy"), "onnxruntime")


KNOWN_HOURS = 3  # the last hours of a stay in which the dataset's charger files read the car's departure


def known_late(site: Path, folder: Path) -> Path:
    """A copy of ``site``'s folder whose charger files read a car's departure only in its last :data:`KNOWN_HOURS`
    (blank before), as the official CityLearn datasets' do."""
    shutil.copytree(site, folder)
    for path in folder.glob("charger_*.csv"):
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        for row in rows:
            if row["electric_vehicle_departure_time"] and float(row["electric_vehicle_departure_time"]) >= KNOWN_HOURS:
                row["electric_vehicle_departure_time"] = ""
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return folder / "schema.json"


@pytest.fixture(scope="module")
def planned(v2g_schema, tmp_path_factory) -> tuple[Path, Path, str]:
    """(run folder, export folder, the export's output) of the references' run on 48 days of the V2G site as a
    user's dataset (its last 12 held out) whose chargers read a car's departure only in its last hours, exported with
    no --agent: no agent trained, the planner serves the cars."""
    folder = tmp_path_factory.mktemp("dataset")
    site = known_late(v2g_schema.parent, folder / "site")
    schema = variant(site, folder, edit=lambda data: data.pop("pvbess_site"), steps=24 * 48)
    run = folder / "run"
    done = CliRunner().invoke(cli, ["baseline", "--schema", str(schema), "--out", str(run),
                                    "--set", f"schedule.eval_days={EVAL_DAYS}"])
    assert done.exit_code == 0, done.output
    exported = CliRunner().invoke(cli, ["export", str(run)])
    assert exported.exit_code == 0, exported.output
    return run, run / "export" / "planner", exported.output


def test_the_planner_is_exported_with_its_program_and_acts_as_the_night_did(planned):
    run, folder, output = planned
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", CHECK_FILE, "controller.py", PROGRAM_FILE,
                                                        SPEC_FILE]
    spec = json.loads((folder / SPEC_FILE).read_text())
    night = json.loads((run / "results.json").read_text())["planner"]
    proof = spec["verification"]
    assert spec["policy"]["kind"] == "planner" and "features" not in spec and "forecast" not in spec
    assert proof["steps"] == night["eval_hours"] == EVAL_DAYS * 24 - 1 == spec["planner"]["proven_steps"]
    assert proof["max_action_difference"] <= 1e-5 and proof["idle_steps"] == 0
    for key in ("co2_kg", "ev_departure_soc_met_pct", "cost", "grid_import_kwh"):
        assert proof["figures"][key]["exported"] == pytest.approx(night[key], rel=1e-4), key
    assert spec["metrics"]["judged_on"].startswith("the last") and night["ev_departure_soc_met_pct"] == 100.0
    assert night["forecast"] == "the readings so far"  # what the night recorded it learns from: a site has it too
    # It plans on the forecast the night's planner had learnt from the part before the one it is proven on.
    assert sum(spec["planner"]["forecast"]["state"]["weight"]) > 0
    assert [b["soc"] for b in spec["planner"]["batteries"]] == ["electrical_storage_soc"]
    assert f"exported planner to {folder}" in output
    assert "numpy and scipy only" in (folder / "README.md").read_text()
    # check.csv is every hour of the period, in order: the planner learns its forecast hour by hour.
    with (folder / CHECK_FILE).open() as handle:
        assert len(list(csv.DictReader(handle))) == proof["steps"]


def test_the_exported_planner_plans_with_numpy_and_scipy_alone(planned, tmp_path):
    folder = planned[1]
    blocked = PLANNER_BLOCKED
    checked = standalone(folder, "check", blocked=blocked)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"ok: acted on {EVAL_DAYS * 24 - 1} of {EVAL_DAYS * 24 - 1} steps")
    # A site: one hour's readings, the forecast kept between calls.
    step = tmp_path / "step.json"
    example = standalone(folder, "example", blocked=blocked)
    assert example.returncode == 0, example.stderr
    step.write_text(example.stdout)
    state = tmp_path / "forecast.json"
    acted = standalone(folder, "act", "--obs", str(step), "--state", str(state), blocked=blocked)
    assert acted.returncode == 0, acted.stderr
    actions = json.loads(acted.stdout)
    spec = json.loads((folder / SPEC_FILE).read_text())
    assert set(actions) == {a["name"] for a in spec["actions"]}
    assert all(-1.0 <= a["value"] <= 1.0 for a in actions.values())
    kept = json.loads(state.read_text())
    assert kept["weight"] != spec["planner"]["forecast"]["state"]["weight"]  # it learnt the hour it acted on


def test_the_exported_planner_without_its_program_says_so(planned, tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("controller.py", SPEC_FILE, CHECK_FILE):
        (folder / name).write_bytes((planned[1] / name).read_bytes())
    done = standalone(folder, "check")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {folder.resolve() / PROGRAM_FILE} not found: a planner's export ships it "
                                   "beside controller.py; export the run again")


def test_the_built_in_sites_planner_is_not_exported(site_schema, tmp_path):
    run = tmp_path / "run"
    done = CliRunner().invoke(cli, ["baseline", "--schema", str(site_schema), "--out", str(run),
                                    "--set", "schedule.eval_days=1"])
    assert done.exit_code == 0, done.output
    refused = CliRunner().invoke(cli, ["export", str(run), "--agent", "planner"])
    assert refused.exit_code == 2
    assert "the built-in site's planner forecasts from other years of the site's climate" in refused.output
    assert not (run / "export").exists()


def test_inside_the_product_the_exported_planner_reads_the_products_program(planned, capsys):
    # Imported as trainer.shipped.controller, it solves trainer.shipped.program (not a copy of the file beside it),
    # and replays the period as the night's planner acted.
    controller = Controller.load(planned[1])
    assert controller.planner is not None and controller.policy_file is None
    assert _check(controller, planned[1] / CHECK_FILE) == 0
    assert capsys.readouterr().out.startswith(f"ok: acted on {EVAL_DAYS * 24 - 1} of")
    assert "pvbess_program" not in sys.modules


def _export_refused(run: Path, results: dict) -> str:
    """The output of `trainer export RUN --agent planner` with ``results`` as the run's results.json: refused (2)."""
    (run / "results.json").write_text(json.dumps(results))
    refused = CliRunner().invoke(cli, ["export", str(run), "--agent", "planner"])
    assert refused.exit_code == 2
    return refused.output


def test_a_planner_evaluated_before_it_said_what_it_forecasts_from_is_evaluated_again_first(planned, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(planned[0], run, ignore=shutil.ignore_patterns("export"))
    results = json.loads((run / "results.json").read_text())
    del results["planner"]["forecast"]
    assert (f"{run}'s planner was evaluated by an earlier version, which did not record what its forecast learns "
            f"from: evaluate it again (trainer evaluate {run})") in _export_refused(run, results)
    # One of an earlier version of the planner (it planned no car before its departure read): the export would prove
    # this version's against figures it did not make.
    results["planner"]["forecast"] = "the readings so far"
    del results["planner"]["version"]
    assert (f"{run}'s planner was evaluated by an earlier version of it (version 1, this one's 2 decides "
            f"otherwise): evaluate it again (trainer evaluate {run})") in _export_refused(run, results)
    assert not (run / "export").exists()


def test_a_reading_beyond_the_part_learnt_from_is_planned_on_and_counted(planned, tmp_path, capsys):
    folder = planned[1]
    spec = json.loads((folder / SPEC_FILE).read_text())
    load = next(o for o in spec["observations"] if o["name"] == "non_shiftable_load")
    with (folder / CHECK_FILE).open() as handle:
        rows = list(csv.DictReader(handle))[:3]
    rows[1]["non_shiftable_load"] = repr(load["trained"][1] + 0.5 * (load["valid"][1] - load["trained"][1]))
    sample = tmp_path / "june.csv"
    with sample.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[o["name"] for o in spec["observations"]], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    assert _check(Controller.load(folder), sample) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ok: acted on 3 of 3 steps of {sample}")
    # A planner trains nothing: the range is the data's it learnt its forecast from.
    assert ("readings beyond the range of the part of the data the run learnt from (acted on, as a deployed controller "
            "would): non_shiftable_load 1") in out


def test_a_planner_is_not_exported_where_a_cars_readings_are_inactive(planned):
    # The planner plans with every plugged-in car's readings whether the guard is on or not: a site whose schema leaves
    # one inactive is refused when exporting, in one line, not at the site's first hour.
    from trainer.base.errors import TrainerError
    from trainer.export import spec as export_spec

    document = json.loads((planned[1] / SPEC_FILE).read_text())
    chargers = document["ev_guard"]["chargers"]
    missing = chargers[0]["departure_time"]
    names = [o["name"] for o in document["observations"] if o["name"] != missing]
    with pytest.raises(TrainerError) as refused:
        export_spec.planner(None, names, [], chargers, {}, 1, {})
    assert str(refused.value) == (f"cannot export the planner: it reads {missing!r}, which this site's schema.json "
                                  "leaves inactive; activate it under observations and run the night again")


def test_a_car_whose_departure_is_not_read_yet_is_planned_for_with_the_stays_learnt_before(planned, tmp_path):
    # The dataset's chargers read a departure only in a car's last hours: the planner assumes the charger's usual stay
    # (learnt from the part before the one judged) and plans the car's charge from its arrival, at the site as in the
    # product (the proof above holds every hour to 1e-5).
    folder = planned[1]
    spec = json.loads((folder / SPEC_FILE).read_text())
    chargers = spec["ev_guard"]["chargers"]
    stays = spec["planner"]["stays"]
    assert sorted(stays) == sorted(c["charger_id"] for c in chargers)
    for entry in stays.values():
        assert len(entry["steps"]) == 24 and all(KNOWN_HOURS < s < 48 for s in entry["steps"])
    with (folder / CHECK_FILE).open() as handle:
        rows = list(csv.DictReader(handle))
    action = {a["name"]: a for a in spec["actions"]}
    unknown = planned_for = 0
    for row in rows:
        for c in chargers:
            if float(row[c["connected"]]) == 1 and float(row[c["departure_time"]]) < 0:
                unknown += 1
                name = next(n for n in action if n.endswith(c["charger_id"]))
                planned_for += abs(float(row[f"expected:{name}"])) > 1e-6
    assert unknown > 0 and planned_for > unknown // 4
    # A site keeps each car's arrival between hourly calls, with the forecast; a state kept by an earlier version
    # (the forecast alone) is read, the cars then read from the next hour.
    state = tmp_path / "state.json"
    step = tmp_path / "step.json"
    site = {o["name"] for o in spec["observations"]}
    step.write_text(json.dumps({k: float(v) for k, v in rows[0].items() if k in site}))
    first = standalone(folder, "act", "--obs", str(step), "--state", str(state), blocked=PLANNER_BLOCKED)
    assert first.returncode == 0, first.stderr
    kept = json.loads(state.read_text())
    assert len(kept["cars"]) == len(chargers)
    kept["cars"] = [["noon", 0, False]] * len(chargers)
    state.write_text(json.dumps(kept))
    damaged = standalone(folder, "act", "--obs", str(step), "--state", str(state), blocked=PLANNER_BLOCKED)
    assert damaged.returncode == 2
    assert damaged.stderr.startswith(f"error: --state {state} is damaged (ValueError: ")
    del kept["cars"]
    state.write_text(json.dumps(kept))
    assert standalone(folder, "act", "--obs", str(step), "--state", str(state), blocked=PLANNER_BLOCKED).returncode == 0
