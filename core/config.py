"""Config errors and strict dataclass building: Hydra config -> plain dataclasses, checked at start.

    from core.config import ConfigError, build_dataclass
    settings = build_dataclass(ExportSettings, {"opset": 18}, "export")

A key the dataclass does not declare, a non-mapping where a group is expected, or a value its
``__post_init__`` refuses raises ConfigError naming the key, before any work starts.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value the run cannot use; raised before any work starts."""


def build_dataclass(cls: type[T], values: Any, where: str) -> T:
    """``cls(**values)``, recursing into fields typed as dataclasses; lists become tuples.

    ``where`` is the dotted key of ``values`` in the config, for the error message.
    """
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown keys {unknown}; accepted: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        field_type = hints.get(name)
        key = f"{where}.{name}" if where else name
        if isinstance(field_type, type) and dataclasses.is_dataclass(field_type):
            value = build_dataclass(field_type, value, key)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise ConfigError(f"{where or 'config'}: {error}") from error
