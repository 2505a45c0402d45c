"""The site's tables on disk, so that a process reads a dataset into arrays once, not at every stage.

Reading a site steps CityLearn through its whole period (about 10 s for the built-in year, a minute for
the 17-building 2022 dataset). The result depends only on the dataset's files, the seed (CityLearn draws
the curves a schema leaves out from it) and CityLearn's version, so it is kept under the user's cache
folder, named by a digest of those. Files are numpy archives read without pickle: a cache file can hold
numbers, never code. A damaged one is read again from CityLearn and replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from trainer.base import logs
from trainer.base.files import cache_root
from trainer.sim.battery import BatterySpec
from trainer.sim.site import ChargerSpec, SiteTables
from trainer.site import Site

FORMAT = 1  # bump when SiteTables or what it reads changes


def cache_folder() -> Path:
    return cache_root() / "sim"


def dataset_digest(site: Site, seed: int) -> str:
    """The dataset's content (its schema and every CSV beside or under its root), the seed and CityLearn's version."""
    digest = hashlib.sha256(f"{FORMAT} {seed} {metadata.version('citylearn')}".encode())
    digest.update(site.content_digest().encode())
    return digest.hexdigest()[:24]


def _flatten(tables: SiteTables) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for field in dataclasses.fields(tables):
        value = getattr(tables, field.name)
        if isinstance(value, (BatterySpec, ChargerSpec)):
            for inner in dataclasses.fields(value):
                item = getattr(value, inner.name)
                if isinstance(item, tuple):  # the chargers' optional curves
                    out.update({f"{field.name}.{inner.name}.{i}": c for i, c in enumerate(item) if c is not None})
                    out[f"{field.name}.{inner.name}.count"] = np.asarray(len(item))
                else:
                    out[f"{field.name}.{inner.name}"] = np.asarray(item)
        else:
            out[field.name] = np.asarray(value)
    return out


def _unflatten(data: Any) -> SiteTables:
    def spec(cls: type, prefix: str) -> Any:
        values = {}
        for inner in dataclasses.fields(cls):
            key = f"{prefix}.{inner.name}"
            if f"{key}.count" in data:
                values[inner.name] = tuple(data[f"{key}.{i}"] if f"{key}.{i}" in data else None
                                           for i in range(int(data[f"{key}.count"])))
            else:
                values[inner.name] = data[key].item() if data[key].ndim == 0 else data[key]
        return cls(**values)

    kinds = {"batteries": BatterySpec, "cars": BatterySpec, "chargers": ChargerSpec}
    values = {}
    for field in dataclasses.fields(SiteTables):
        if field.name in kinds:
            values[field.name] = spec(kinds[field.name], field.name)
        else:
            values[field.name] = data[field.name].item() if data[field.name].ndim == 0 else data[field.name]
    return SiteTables(**values)


def cached_tables(env: Any, site: Site, seed: int, steps: int | None = None) -> SiteTables:
    """The site's tables (all of its period, or its first ``steps``) from the cache, or read from ``env`` (a
    CityLearnEnv of the whole period) and kept."""
    first = "" if steps is None else f"-first{steps}"
    path = cache_folder() / f"{dataset_digest(site, seed)}{first}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as data:
                return _unflatten(data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logs.get().warning("simulator cache unreadable: reading the site again", path=str(path), error=str(exc))
    tables = SiteTables.read(env, steps)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial.npz")
        np.savez(partial, **_flatten(tables))
        os.replace(partial, path)
    except OSError as exc:  # a full or read-only cache costs the next process a read, nothing more
        logs.get().warning("simulator cache not written", path=str(path), error=exc.strerror)
    return tables
