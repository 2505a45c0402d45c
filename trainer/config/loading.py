"""Reading, merging and validating config files: the one path from YAML to a :class:`Config`.

Precedence, in one function (:func:`load_config`): ``trainer/configs/default.yaml`` → a device
profile → each ``--config FILE`` left to right → each ``--set key.path=value``. Errors name the
key (or the file, line and column), what was expected and what was received.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import reprlib
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from trainer.base import logs
from trainer.base.errors import ConfigError
from trainer.config.sections import DEFAULT_CONFIG, Config


class _NoAliases(yaml.SafeLoader):
    """YAML's safe loader without aliases (``*name``): a config has no use for them, and nine nested levels of them
    expand to more than a machine's memory once anything walks the tree."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError(problem="an alias (*name): config files are read without anchors and aliases; "
                                               "write the value out", problem_mark=self.peek_event().start_mark)
        return super().compose_node(parent, index)


def read_yaml(path: Path) -> dict[str, Any]:
    """Read one YAML mapping, with file, line and column on a syntax error."""
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path} is not a file (a config is a YAML file; check the path given to --config)")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (check the path given to --config)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_NoAliases)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                          "save the file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror} (check its permissions)") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level, got {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    """``sac.batch_size=128`` → (["sac", "batch_size"], 128); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set expects key.path=value, got {text!r} (for example --set sac.batch_size=128)")
    path, raw = text.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"--set {text!r}: empty key path (for example --set sac.batch_size=128)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return keys, value


def _set_path(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def _model_at(path: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Config
    for key in path:
        field = model.model_fields.get(str(key))
        if field is None:
            return None
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return None
    return model


# Pydantic names the member of a union a value failed against ('ppo.ent_coef.float'): not a key.
_UNION_MEMBERS = ("float", "int", "str", "bool", "none", "list", "dict")


def _key_path(error: dict[str, Any]) -> tuple[Any, ...]:
    """The config key an error is about (without the union member or validator pydantic adds to its loc)."""
    return tuple(p for p in error["loc"] if not (isinstance(p, str) and (
        p.startswith(("function-", "literal[", "list[", "dict[")) or p in _UNION_MEMBERS)))


def _format_error(loc: tuple[Any, ...], errors: list[dict[str, Any]]) -> str:
    """One line for one key; a union's alternatives (a finite number, 'auto') joined with 'or'."""
    error = errors[0]
    path = ".".join(str(p) for p in loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        choices = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), choices, n=1)
        prefix = ".".join(str(p) for p in loc[:-1])
        hint = (
            f"did you mean '{prefix + '.' if prefix else ''}{close[0]}'?"
            if close
            else f"valid keys: {', '.join(choices)}"
        )
        return f"unknown config key '{path}': {hint}"
    if kind == "missing":
        return f"missing config key '{path}': add it (see trainer/configs/default.yaml for its meaning)"
    where = f"config key '{path}'" if path else "config"
    messages = [e["msg"].removeprefix("Value error, ") for e in errors]
    messages = [m[0].lower() + m[1:] for m in messages]
    if kind == "value_error":  # a cross-field rule: the message names the values itself
        return f"{where}: {messages[0]}"
    if len(messages) > 1:
        wants = [m.removeprefix("input should be ") for m in messages]
        return f"{where}: input should be {' or '.join(wants)}; got {_shown(error.get('input'))}"
    return f"{where}: {messages[0]}; got {_shown(error.get('input'))}"


def _shown(value: Any, most: int = 80) -> str:
    """A value as an error shows it: its repr, cut to ``most`` characters (a wrong value may be a whole tree)."""
    short = reprlib.Repr()  # Python 3.11's takes no arguments
    short.maxlevel, short.maxlist, short.maxdict, short.maxstring, short.maxother = 3, 6, 6, most, most
    text = short.repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def validate(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for error in exc.errors():
            by_key.setdefault(_key_path(error), []).append(error)
        raise ConfigError("; ".join(_format_error(loc, errors) for loc, errors in by_key.items())) from None


# Keys that did nothing and were removed: configs and run folders that still hold them keep loading.
RETIRED = {
    ("gpu", "mixed_precision"): "it had no effect (SB3's learners run in float32)",
    ("sac", "max_grad_norm"): "SAC does not clip gradients",
}


def _drop_retired(data: dict[str, Any]) -> None:
    for (section, key), why in RETIRED.items():
        if isinstance(data.get(section), dict) and key in data[section]:
            del data[section][key]
            logs.get().warning("config key retired and ignored", key=f"{section}.{key}", reason=why)


def load_config(
    files: tuple[str | Path, ...] | list[str | Path] = (),
    overrides: tuple[str, ...] | list[str] = (),
    profile: Path | None = None,
) -> Config:
    """Defaults → device profile → each file left to right → each ``--set``; validated before anything runs."""
    data = read_yaml(DEFAULT_CONFIG)
    if profile is not None:
        data = deep_merge(data, read_yaml(profile))
    for file in files:
        data = deep_merge(data, read_yaml(Path(file)))
    for text in overrides:
        keys, value = parse_override(text)
        _set_path(data, keys, value)
    _drop_retired(data)
    return validate(data)


def with_overrides(cfg: Config, overrides: tuple[str, ...] | list[str]) -> Config:
    """``cfg`` with ``--set`` overrides applied, validated as a loaded config is."""
    data = cfg.to_dict()
    for text in overrides:
        keys, value = parse_override(text)
        _set_path(data, keys, value)
    return validate(data)


def type_text(annotation: Any, nested: bool = False) -> str:
    """A field's type as a person reads it: the allowed values of a Literal, 'or null' for optional keys."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return ("" if nested else "one of ") + "|".join(str(a) for a in args)
    if origin in (Union, UnionType):
        return " or ".join("null" if a is type(None) else type_text(a, nested=True) for a in args)
    if origin is list:
        return f"list of {type_text(args[0], nested=True)}"
    if origin is dict:
        return f"map of {type_text(args[0], nested=True)} to {type_text(args[1], nested=True)}"
    if origin is Annotated:
        return type_text(args[0], nested)
    return getattr(annotation, "__name__", str(annotation))


def describe(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key path, type, description) for every leaf key, for `config show --doc`."""
    rows: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows.extend(describe(annotation, prefix=f"{path}."))
            continue
        bounds = [
            f"{sym}{getattr(m, attr)}"
            for m in field.metadata
            for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
            if getattr(m, attr, None) is not None
        ]
        type_name = type_text(annotation) + (f" ({', '.join(bounds)})" if bounds else "")
        rows.append((path, type_name, field.description or ""))
    return rows


def doc_text(cfg: Config) -> str:
    """`trainer config show --doc`: each key, its meaning, allowed values and current value."""
    rows, values = describe(), cfg.to_dict()
    width = max(len(r[0]) for r in rows)
    lines = []
    for path, type_name, text in rows:
        current = functools.reduce(lambda d, k: d[k], path.split("."), values)
        lines.append(f"{path.ljust(width)}  {text}  [{type_name}]  = {json.dumps(current)}")
    return "\n".join(lines)
