"""What `trainer tune` searches: one table of parameters per agent, each a config key with its range.

A parameter is a config key path (``ppo.learning_rate``, ``warm_start.ppo_bc_weight``), so a trial's settings are
``--set`` overrides and the answer is a YAML file that ``trainer night --config`` takes. The ranges bracket the
defaults (trainer/configs/default.yaml), each measured there or in docs/agent-quality.md: a fine-tuned warm start
drifts off above ~3e-4, the imitation term holds it near the demonstrations, wider networks fit the members' mean
better. Adding a parameter is a row here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.base.errors import ConfigError, UsageError
from trainer.config.loading import read_yaml, with_overrides


@dataclass(frozen=True)
class Param:
    """One searched config key: a float or int range (``log``: sampled on a log scale) or a list of choices."""

    key: str  # the config key path, as --set names it
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple[Any, ...] = ()

    def sample(self, trial: Any) -> Any:
        """This parameter's value for an Optuna trial."""
        if self.choices:
            # Optuna stores choices it can persist (None, bool, int, float, str): a list is chosen by its index.
            index = trial.suggest_categorical(self.key, list(range(len(self.choices))))
            return self.choices[index]
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, log=self.log)

    def stored(self, value: Any) -> Any:
        """What Optuna stores for ``value`` (a choice's index), to enqueue the defaults as a trial."""
        return self.choices.index(value) if self.choices else value

    def shown(self, stored: Any) -> Any:
        """The value a stored one stands for."""
        return self.choices[stored] if self.choices else stored


# The agents' search spaces: their own knobs and the product's (the imitation's hold, exploration after it, sites).
# None changes what the warm start imitates from, so one imitation a seed serves every trial (on 2 cores a network
# size of its own costs ~2.5 minutes of demonstrations and imitation per seed: a 30-minute tune on the built-in site
# that searched it finished one trial); --space searches the network too (docs/tune.md).
SPACES: dict[str, tuple[Param, ...]] = {
    "ppo": (
        Param("ppo.learning_rate", 1e-5, 5e-4, log=True),
        Param("ppo.learning_rate_end", 0.05, 1.0, log=True),
        Param("ppo.n_epochs", 3, 12, integer=True),
        Param("ppo.clip_range", 0.05, 0.3),
        Param("ppo.gae_lambda", 0.8, 0.99),
        Param("warm_start.ppo_bc_weight", 0.3, 30.0, log=True),
        Param("warm_start.policy_std", 0.03, 0.3, log=True),
        Param("train.sites", choices=(32, 64, 128)),
    ),
    "a2c": (
        Param("a2c.learning_rate", 3e-5, 1e-3, log=True),
        Param("a2c.learning_rate_end", 0.05, 1.0, log=True),
        Param("a2c.gae_lambda", 0.8, 1.0),
        Param("warm_start.a2c_bc_weight", 0.3, 30.0, log=True),
        Param("warm_start.policy_std", 0.03, 0.3, log=True),
        Param("train.sites", choices=(32, 64, 128)),
    ),
    "sac": (
        Param("sac.learning_rate", 1e-5, 5e-4, log=True),
        Param("sac.tau", 0.001, 0.02, log=True),
        Param("sac.batch_size", choices=(128, 256, 512)),
        Param("warm_start.sac_bc_alpha", 0.05, 2.0, log=True),
        Param("warm_start.sac_temperature", 1e-5, 1e-3, log=True),
        Param("sac.n_envs", choices=(8, 16, 32)),
    ),
}


def space(agent: str) -> tuple[Param, ...]:
    if agent not in SPACES:
        raise UsageError(f"trainer tune has no search space for {agent!r}: it tunes {', '.join(SPACES)}")
    return SPACES[agent]


def read_space(path: Path) -> tuple[Param, ...]:
    """A search space from a YAML file (--space): each config key mapped to ``{low: L, high: H}`` (``log: true`` for
    a log scale, ``int: true`` for whole numbers) or ``{choices: [a, b, ...]}``; refused in one line where a row is
    not one of those."""
    data = read_yaml(path)
    if not data:
        raise UsageError(f"{path}: the search space is empty; map each config key to {{low: L, high: H}} or "
                         "{choices: [...]}")
    params = []
    for key, row in data.items():
        where = f"{path}: {key}"
        if not isinstance(row, dict) or not (set(row) <= {"low", "high", "log", "int", "choices"}):
            raise UsageError(f"{where}: expected {{low: L, high: H}} (log: true, int: true) or {{choices: [...]}}, "
                             f"got {str(row)[:80]}")
        if "choices" in row:
            choices = row["choices"]
            if not isinstance(choices, list) or not choices or set(row) != {"choices"}:
                raise UsageError(f"{where}: choices should be a non-empty list, alone in its row; got "
                                 f"{str(row)[:80]}")
            params.append(Param(str(key), choices=tuple(choices)))
            continue
        low, high = row.get("low"), row.get("high")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)) \
                or not low < high:
            raise UsageError(f"{where}: low and high should be finite numbers with low < high; got low={low!r}, "
                             f"high={high!r}")
        if row.get("log") and low <= 0:
            raise UsageError(f"{where}: a log scale needs low > 0; got low={low!r}")
        params.append(Param(str(key), float(low), float(high), log=bool(row.get("log")), integer=bool(row.get("int"))))
    return tuple(params)


def check_space(params: tuple[Param, ...], base: Any) -> None:
    """Each parameter's extremes (or each choice) set in ``base``, the config: a key that does not exist, or a
    value its section refuses, is named before the tune's folder is made."""
    for param in params:
        values = param.choices or ((int(param.low), int(param.high)) if param.integer else (param.low, param.high))
        for value in values:
            try:
                with_overrides(base, overrides({param.key: value}))
            except ConfigError as exc:
                raise UsageError(f"search space: {param.key}={_text(value)} is not a setting this config takes "
                                 f"({exc}); fix the range or remove the key") from None


def to_rows(params: tuple[Param, ...]) -> list[dict[str, Any]]:
    """The space as tune.json keeps it."""
    return [{"key": p.key, "low": p.low, "high": p.high, "log": p.log, "integer": p.integer,
             "choices": list(p.choices)} for p in params]


def from_rows(rows: list[dict[str, Any]]) -> tuple[Param, ...]:
    return tuple(Param(r["key"], r["low"], r["high"], r["log"], r["integer"], tuple(r["choices"])) for r in rows)


def overrides(settings: dict[str, Any]) -> list[str]:
    """``--set`` overrides for settings by key (JSON-like values: lists as [a, b])."""
    return [f"{key}={_text(value)}" for key, value in settings.items()]


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def defaults(cfg_dict: dict[str, Any], params: tuple[Param, ...]) -> dict[str, Any]:
    """Each parameter's value in a config (as ``Config.to_dict`` gives it): the defaults' trial."""
    found = {}
    for param in params:
        node: Any = cfg_dict
        for part in param.key.split("."):
            node = node[part]
        found[param.key] = node
    return found


def nested(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings by key path as a config file holds them (``{"ppo": {"learning_rate": ...}}``)."""
    tree: dict[str, Any] = {}
    for key, value in settings.items():
        *sections, last = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    return tree
