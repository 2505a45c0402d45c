"""Which CityLearn dataset a run uses, found as CityLearn finds it and checked before anything is written.

A schema that is not JSON, a missing or unparsable CSV, a dataset with no buildings or with
NaN in a column the simulation needs each stop the command here, with the file, row and
column, before a run folder exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer.base import logs
from trainer.base.errors import DatasetError

LOCAL_DATASETS_ENV = "CITYLEARN_LOCAL_DATASETS_PATH"
# The columns CityLearn's simulation reads, per file kind (others, such as indoor temperature, may be empty).
REQUIRED = {
    "energy_simulation": ("month", "hour", "day_type", "non_shiftable_load", "solar_generation"),
    "weather": ("outdoor_dry_bulb_temperature", "diffuse_solar_irradiance", "direct_solar_irradiance"),
    "carbon_intensity": ("carbon_intensity",),
    "pricing": ("electricity_pricing",),
}
# The classes a schema may name in its "type" keys. CityLearn imports and constructs whatever class a
# schema names, so a schema from a run folder or a download could run any code; two of CityLearn's own
# (LSTM dynamics, occupant models) unpickle files the schema points to. These read nothing but the
# dataset's CSVs. Agents and reward functions are listed because published schemas name them: the
# product never constructs the schema's agent and always brings its own reward.
SCHEMA_CLASSES = frozenset({
    "citylearn.citylearn.Building", "citylearn.building.Building",
    "citylearn.energy_model.Battery", "citylearn.energy_model.PV", "citylearn.energy_model.HeatPump",
    "citylearn.energy_model.ElectricHeater", "citylearn.energy_model.StorageTank",
    "citylearn.electric_vehicle_charger.Charger", "citylearn.electric_vehicle.ElectricVehicle",
    "citylearn.citylearn.ElectricVehicle",
    "citylearn.power_outage.PowerOutage", "citylearn.power_outage.ReliabilityMetricsPowerOutage",
    *(f"citylearn.reward_function.{name}" for name in (
        "RewardFunction", "MultiBuildingRewardFunction", "MARL", "IndependentSACReward", "SolarPenaltyReward",
        "ComfortReward", "SolarPenaltyAndComfortReward", "Electric_Vehicles_Reward_Function")),
    "citylearn.agents.base.Agent", "citylearn.agents.base.BaselineAgent",
    *(f"citylearn.agents.rbc.{name}" for name in (
        "RBC", "HourRBC", "BasicRBC", "OptimizedRBC", "BasicBatteryRBC",
        "BasicElectricVehicleRBC_ReferenceController")),
    "citylearn.agents.sac.SAC", "citylearn.agents.sac.SACRBC", "citylearn.agents.marlisa.MARLISA",
    "citylearn.agents.marlisa.MARLISARBC", "citylearn.agents.q_learning.TabularQLearning",
})


def check_name(name: str) -> None:
    """A dataset name is a name: CityLearn keeps only its last part, so 'a/b' would be the cached 'b'."""
    if not name.strip() or name.strip(".") == "" or any(sep in name for sep in ("/", "\\", os.sep)):
        raise DatasetError(f"--dataset takes a CityLearn dataset's name (no '/' or '\\', not empty), got {name!r}; "
                           "pass a dataset's folder or schema.json with --schema PATH")


def find_dataset(name: str) -> Path:
    """A dataset name resolved as CityLearn 3.0.2 resolves it: its cache, then every folder of
    $CITYLEARN_LOCAL_DATASETS_PATH (a path list), then its own data folders; offline, never downloaded."""
    from citylearn.data import DataSet, OfflineDataError  # lazy: CityLearn takes seconds to import

    datasets = DataSet(offline=True)
    try:
        found = Path(datasets.get_dataset(name)).resolve()
    except OfflineDataError:
        roots = ", ".join(datasets.local_datasets_directories) or "no local dataset folder"
        raise DatasetError(
            f"CityLearn dataset '{name}' is not available offline (looked in CityLearn's cache and in {roots}): set "
            f"{LOCAL_DATASETS_ENV} to folders (separated by '{os.pathsep}') holding {name}/schema.json, "
            "or pass --schema PATH"
        ) from None
    if found.parent.name != name:  # only the dataset asked for, never another of a similar name
        raise DatasetError(f"CityLearn dataset '{name}' resolved to {found}, another dataset's schema; pass the one "
                           "you want with --schema PATH")
    # CityLearn's cache comes first: a copy there hides the folder $CITYLEARN_LOCAL_DATASETS_PATH names, so say which.
    roots = [("CityLearn's cache", Path(str(datasets.cache_directory)))] + [
        (f"${LOCAL_DATASETS_ENV}", Path(str(d))) for d in datasets.local_datasets_directories]
    source = next((f"{what} ({root})" for what, root in roots if found.is_relative_to(root.resolve())),
                  "CityLearn's own data")
    logs.get().info("dataset found by name", name=name, schema=str(found), source=source)
    return found


def read_schema(schema: Path) -> dict:
    """A schema's JSON, refused before CityLearn sees it when it is not JSON or names a class outside
    :data:`SCHEMA_CLASSES`. Every CityLearn environment the product builds reads its schema here."""
    try:
        data = json.loads(schema.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DatasetError(f"{schema}: cannot read the CityLearn schema ({exc.strerror}); pass a readable "
                           "schema.json") from None
    except RecursionError:  # arrays or objects nested thousands deep: no schema is
        raise DatasetError(f"{schema}: not a CityLearn schema (JSON nested deeper than Python reads); pass a "
                           "dataset's schema.json") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f":{exc.lineno}:{exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise DatasetError(f"{schema}{where}: not a CityLearn schema (not JSON: {exc}); pass a dataset's "
                           "schema.json") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{schema}: not a CityLearn schema (a JSON {type(data).__name__}, not an object); pass a "
                           "dataset's schema.json")
    _check_steps(schema, data)
    for where, name in _named_classes(data, ""):
        if name not in SCHEMA_CLASSES:
            raise DatasetError(
                f"{schema}: {where} names the class {str(name)[:80]!r}, which this product does not load (CityLearn "
                "would import and run any class a schema names); use a CityLearn class listed in docs/scenario.md "
                "('Classes a schema may name') or remove the key")
    return data


def _check_steps(schema: Path, data: dict) -> None:
    """The period's step fields are whole numbers, the end not before the start."""
    for key, default, least in (("simulation_start_time_step", 0, 0), ("simulation_end_time_step", 0, 0),
                                ("seconds_per_time_step", 3600, 1)):
        value = data.get(key, default)
        if type(value) is not int or value < least:
            raise DatasetError(f"{schema}: {key} should be a whole number, {least} or more, found "
                               f"{json.dumps(value)[:40]}; fix it in the schema")
    if data.get("simulation_end_time_step", 0) < data.get("simulation_start_time_step", 0):
        raise DatasetError(f"{schema}: simulation_end_time_step ({data['simulation_end_time_step']}) is before "
                           f"simulation_start_time_step ({data['simulation_start_time_step']}); fix them in the schema")


def _named_classes(node: object, where: str):
    """(key path, value) of every "type" key in a schema, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key == "type":
                yield path, value
            else:
                yield from _named_classes(value, path)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _named_classes(value, f"{where}[{index}]")


def check_dataset(schema: Path) -> dict:
    """Open the dataset fully: the schema, every file it names, and the columns the simulation needs; the schema's
    JSON, read once here."""
    data = read_schema(schema)
    buildings = data.get("buildings") if isinstance(data, dict) else None
    if not isinstance(buildings, dict) or not any(b.get("include", True) for b in buildings.values()
                                                  if isinstance(b, dict)):
        raise DatasetError(f"{schema}: the schema has no buildings to simulate; add at least one under "
                           "'buildings' (with include: true)")
    # CityLearn reads these two tables when it builds the first building (a KeyError then, after the run folder).
    for table in ("observations", "actions"):
        entries = data.get(table)
        if not isinstance(entries, dict) or not any(isinstance(spec, dict) and spec.get("active")
                                                    for spec in entries.values()):
            raise DatasetError(f"{schema}: the schema has no active {table}; add a '{table}' object naming at least "
                               f"one with \"active\": true (CityLearn's own schemas list them all)")
    # Where CityLearn reads the files: root_directory (absolute, or relative to the schema), else beside it.
    configured = data.get("root_directory")
    root = schema.parent if not configured else (schema.parent / Path(str(configured)).expanduser()).resolve()
    # Every file covers the period (CityLearn indexes it by step) and every column an agent observes is finite.
    rows = data.get("simulation_end_time_step", 0) + 1
    observed = {name for name, spec in (data.get("observations") or {}).items()
                if isinstance(spec, dict) and spec.get("active")}
    checked: set[Path] = set()
    for name, building in buildings.items():
        if not isinstance(building, dict) or not building.get("include", True):
            continue
        for kind, columns in REQUIRED.items():
            if building.get(kind):
                _check_csv(root / building[kind], columns, f"building {name}'s {kind}", checked, rows, observed)
        for charger in (building.get("chargers") or {}).values():
            if isinstance(charger, dict) and charger.get("charger_simulation"):
                _check_csv(root / charger["charger_simulation"], (), f"building {name}'s charger", checked, rows,
                           set())
    return data


# Beyond this, sums and squares in CityLearn's float32 arithmetic overflow to infinity (float32 holds 3.4e38).
LARGEST_VALUE = 1e15


def _check_csv(path: Path, columns: tuple[str, ...], what: str, checked: set[Path], rows: int,
               observed: set[str]) -> None:
    import pandas as pd  # lazy: only a dataset given by the user is checked

    if path in checked:
        return
    checked.add(path)
    if not path.is_file():
        raise DatasetError(f"{path}: {what} file is missing (the schema names it); restore it or fix the schema")
    try:
        frame = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise DatasetError(f"{path}: {what} file does not parse as CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DatasetError(f"{path}: {what} file lacks the column(s) {', '.join(missing)}")
    if len(frame) < rows:
        raise DatasetError(f"{path}: {what} file has {len(frame):,} rows but the schema's period needs {rows:,} "
                           "(simulation_end_time_step + 1); add the missing rows or end the period earlier")
    for column in (*columns, *sorted(observed & set(frame.columns) - set(columns))):
        values = pd.to_numeric(frame[column].iloc[:rows], errors="coerce")
        bad = values.isna() | ~values.abs().le(LARGEST_VALUE)
        if bad.any():
            row = int(bad.idxmax())
            finite = bool(values.abs().lt(float("inf")).iloc[row])
            why = (f"is beyond {LARGEST_VALUE:.0e}, more than CityLearn's float32 arithmetic holds (check the units)"
                   if finite else "is not a finite number (the simulation needs a value in every row)")
            raise DatasetError(f"{path}: {what} file, row {row + 2}, column {column}: {frame[column].iloc[row]!r} "
                               f"{why}")
