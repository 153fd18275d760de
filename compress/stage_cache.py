"""What stages share for resuming: the folders they keep their outputs in (one per family, so two
families' runs never overwrite each other's), keys of their inputs, keyed JSON files, and the
per-block sensitivity table (JSON for the notebook, CSV for people) in one format.

    work_dir = stage_dir(output_dir, "kokoro", "teacher_int8")  # <output_dir>/stages/kokoro/teacher_int8
    key = inputs_key(graph_sha, settings_dict, texts)     # 16 hex digits
    table = read_keyed_json(path, key)                     # None when missing or made from other inputs
    write_sensitivity_table(rows, key, json_path, csv_path)

A rerun of the same family with the same inputs finds its finished work in the same folder.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

from core.atomic_io import write_text_atomic


def stage_dir(output_dir: str | Path, family: str, variant: str) -> Path:
    """``<output_dir>/stages/<family>/<variant>``: what the stage building ``variant`` keeps for a rerun."""
    return Path(output_dir) / "stages" / family / variant


def graph_dir(output_dir: str | Path, family: str, variant: str) -> Path:
    """``<output_dir>/graphs/<family>/<variant>``: the variant's exported graphs and engines."""
    return Path(output_dir) / "graphs" / family / variant


def inputs_key(*parts) -> str:
    """A short content hash of JSON-able ``parts``: a file made from other inputs never matches."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_keyed_json(path: Path, key: str) -> dict | None:
    """The JSON at ``path`` if it was written for ``key`` (same inputs), else None."""
    if not path.is_file():
        return None
    payload = json.loads(path.read_text(encoding="utf-8"))
    return payload if payload.get("key") == key else None


def write_sensitivity_table(rows: list[dict], key: str, json_path: Path, csv_path: Path) -> None:
    write_text_atomic(json_path, json.dumps({"key": key, "blocks": rows}, indent=1))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(csv_path, text.getvalue())
