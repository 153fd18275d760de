"""The voice string of families whose voice is a set of the user's files (Family.voice_fields):
``random`` for full-size random weights, else ``KEY=PATH;KEY=PATH;...`` as conf/model/<family>.yaml
folds ``model.<key>`` into ``model.voice``. A key left unset reads ``None`` once interpolated."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

RANDOM = "random"
UNSET = ("", "none", "null")  # how an unset config key reads once interpolated into the voice string


def is_random(voice: str) -> bool:
    return voice.strip().lower() == RANDOM


def is_unset(value: str) -> bool:
    return value.strip().lower() in UNSET


def parse_paths(voice: str, known: Iterable[str], spec: str | None = None) -> dict[str, Path]:
    """The set paths of ``spec`` (by default all of ``voice``, which the errors name), by key; a
    ValueError names an item that is not KEY=PATH with a known KEY."""
    known = sorted(known)
    paths: dict[str, Path] = {}
    for item in filter(None, (part.strip() for part in (voice if spec is None else spec).split(";"))):
        key, separator, value = item.partition("=")
        if not separator or key not in known:
            raise ValueError(f"voice {voice!r}: {item!r} is not KEY=PATH with KEY in {known}; or use {RANDOM!r}")
        if not is_unset(value):
            paths[key] = Path(value.strip()).expanduser()
    return paths


def spec_name(voice: str) -> str:
    """A short name for a voice string of this form, as a server lists it: ``random`` when no file is
    set, else the name of the first file set (``g_00140000``)."""
    for item in voice.split(";"):
        _, separator, value = item.partition("=")
        if separator and not is_unset(value):
            return Path(value.strip()).name
    return RANDOM
