"""Shared fixtures: a built-in site built once per session, tiny configs, the official dataset."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("CITYLEARN_OFFLINE", "1")

from trainer.config.loading import load_config
from trainer.config.sections import Config
from trainer.site import Site
from trainer.site.scenario import build_site

_SCRATCH: str | None = None
_OWNER = False  # whether this process made the scratch folder (and removes it)


def pytest_collection_modifyitems(config, items):
    """The slow end-to-end tests first: pytest-xdist hands tests out in this order, so the two workers share the long
    ones from the start and the short ones fill in after (in the files' order, test_ray's and test_tune's long runs
    came last: the last 8 % of the tests took a fifth of a 21.6-minute run on 2 cores). Otherwise the order is the
    files'."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
    # The caches (the training simulator's sites, the night's calibration): the tests' own, never the user's, and
    # gone when they end; SB3's folders of a model that learns without a logger (one per learn() in the system's
    # temp folder) too. Made here, in pytest's processes only: a Ray worker that imports a test module inherits
    # the variables and makes no folder of its own. The xdist workers share the first process's (they start from
    # its environment): a site read into the simulator by one (a year of CityLearn, 20 s) serves the others; its
    # files are written whole and renamed, so two workers reading the same site at once leave one good file.
    global _SCRATCH, _OWNER
    inherited = os.environ.get("PVBESS_TEST_SCRATCH")
    if inherited and os.environ.get("PYTEST_XDIST_WORKER") and os.path.isdir(inherited):
        _SCRATCH, _OWNER = inherited, False
    else:
        _SCRATCH, _OWNER = tempfile.mkdtemp(prefix="pvbess-test-cache-"), True
        atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
        os.environ["PVBESS_TEST_SCRATCH"] = _SCRATCH
    os.environ["PVBESS_CACHE"] = _SCRATCH
    os.environ["SB3_LOGDIR"] = os.path.join(_SCRATCH, "sb3")


def own_cache(tmp_path: Path, monkeypatch) -> Path:
    """A cache folder (PVBESS_CACHE) of the test's own, for a test that reads what the product keeps there (a
    calibration), but for the training simulator's sites: the session's, read once (a year of CityLearn, 20 s)."""
    root = tmp_path / "cache"
    shared = Path(_SCRATCH or tempfile.gettempdir()) / "pvbess-trainer" / "sim"
    shared.mkdir(parents=True, exist_ok=True)
    (root / "pvbess-trainer").mkdir(parents=True)
    (root / "pvbess-trainer" / "sim").symlink_to(shared, target_is_directory=True)
    monkeypatch.setenv("PVBESS_CACHE", str(root))
    return root


@pytest.fixture(autouse=True)
def _references_kept_per_test(monkeypatch, request):
    """Each test evaluates its own references: one test's kept figures never stand in for another's, which may
    change what a reference does without changing what it is keyed by (tests/test_reference_reuse.py)."""
    folder = Path(_SCRATCH or tempfile.gettempdir()) / "references" / request.node.nodeid.replace("/", "_")[-150:]
    monkeypatch.setattr("trainer.references.reuse.cache_folder", lambda: folder)


OFFICIAL = "citylearn_challenge_2022_phase_all"
OFFICIAL_EV = "citylearn_challenge_2022_phase_all_plus_evs"  # 14 buildings, four with chargers that also discharge
_SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "citylearn" / "datasets"

# Small everything: a few hundred steps, a short evaluation window, quick SAC warm-up.
TINY = (
    "schedule.eval_days=3", "schedule.curve_eval_days=2",  # the validation window: two days, not four weeks
    "sac.learning_starts=50", "sac.batch_size=32", "sac.buffer_size=2000",
    "ppo.n_steps=128", "ppo.batch_size=32", "ppo.n_epochs=2",
    "sac.n_envs=1", "a2c.n_steps=8",  # a step (SAC) or a rollout (A2C) of 8 steps, as on CityLearn before
    "sac.checkpoint_freq_steps=100", "ppo.checkpoint_freq_steps=100", "a2c.checkpoint_freq_steps=100",
    "output.tensorboard=false",
    "reliability.checkpoint_min_interval_s=0",  # checkpoints where the steps say, however fast the run
    "warm_start.epochs=0",  # its demonstrations replay a whole year: tests/test_imitation.py covers it
    "warm_start.extra_draws=0",  # each draw builds and replays another year: tests/test_imitation.py covers one
    "warm_start.ensemble=1",  # its mean runs over whole years: tests/test_imitation.py covers it on a week
    "train.patience=0",  # each stage to its target: tests/test_selection.py covers a flat curve's early end
)


def tiny_overrides(*extra: str) -> list[str]:
    return [*TINY, *extra]


def variant(schema: Path, folder: Path, edit=None, steps: int | None = None) -> Path:
    """A copy of ``schema`` in ``folder`` reading the original's CSVs, shortened to ``steps`` and edited."""
    data = json.loads(schema.read_text())
    data["root_directory"] = str(schema.parent.resolve())
    if steps is not None:
        data["simulation_start_time_step"] = 0
        data["simulation_end_time_step"] = steps - 1
    if edit is not None:
        edit(data)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "schema.json"
    out.write_text(json.dumps(data))
    return out


def drop_ev_curves(schema: dict) -> None:
    """Leave the cars' battery curves out of a schema, so CityLearn draws random ones (as where an official
    dataset leaves them out)."""
    for ev in schema["electric_vehicles_def"].values():
        for key in ("power_efficiency_curve", "capacity_power_curve", "efficiency"):
            ev["battery"]["attributes"].pop(key, None)


def random_ev_curves(schema_path: Path, folder: Path) -> Path:
    """A copy of the site in ``folder`` whose cars' battery curves CityLearn draws at random."""
    return variant(schema_path, folder, drop_ev_curves)


def built_in_config(*overrides: str) -> Config:
    """The config with ``overrides``, settled on the built-in site (SAC's 256x256), as a run of it settles it: for
    tests that build models without a run."""
    return load_config(overrides=list(overrides)).on_site(one_period=False)


@pytest.fixture(scope="session")
def default_cfg() -> Config:
    return built_in_config()


@pytest.fixture(scope="session")
def tiny_cfg() -> Config:
    return built_in_config(*tiny_overrides())


@pytest.fixture(scope="session")
def site_schema(tmp_path_factory, default_cfg) -> Path:
    return build_site(default_cfg.scenario, tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="session")
def built_in(site_schema) -> Site:
    """The built-in site as a run holds it."""
    return Site.load(site_schema)


@pytest.fixture(scope="session")
def week(site_schema, tmp_path_factory) -> Path:
    """The built-in site's first week: an ensemble's year in closed loop takes seconds, not minutes."""
    return variant(site_schema, tmp_path_factory.mktemp("week"), steps=168)


@pytest.fixture(scope="session")
def week_site(week) -> Site:
    return Site.load(week)


# Like the official CityLearn EV datasets with V2G: one building, a battery, PV, 7.2 kW chargers that can
# also discharge the cars (a commuter's by day, a fleet van's overnight), a battery small enough that
# the cars' energy is worth moving.
V2G = ("scenario.ev_chargers=2", "scenario.charger_kw=7.2", "scenario.charger_discharge_kw=7.2",
       "scenario.battery_kwh=20", "scenario.battery_kw=10")


@pytest.fixture(scope="session")
def v2g_schema(tmp_path_factory) -> Path:
    return build_site(load_config(overrides=list(V2G)).scenario, tmp_path_factory.mktemp("v2g-site"))


def _official(name: str) -> Path:
    roots = [os.environ.get("CITYLEARN_LOCAL_DATASETS_PATH"), str(_SHARED_DATASETS)]
    for root in filter(None, roots):
        schema = Path(root) / name / "schema.json"
        if schema.is_file():
            return schema
    pytest.skip(f"official CityLearn dataset {name} not found (set CITYLEARN_LOCAL_DATASETS_PATH)")


@pytest.fixture(scope="session")
def official_schema() -> Path:
    return _official(OFFICIAL)


@pytest.fixture(scope="session")
def official_ev_schema() -> Path:
    """The shared official district with EV chargers (V2G, curved charging paths drawn from the seed)."""
    return _official(OFFICIAL_EV)


def pytest_unconfigure(config):
    # Each xdist worker ends here too (where atexit does not run); the folder goes with the process that made it.
    if _SCRATCH is not None and _OWNER:
        shutil.rmtree(_SCRATCH, ignore_errors=True)
