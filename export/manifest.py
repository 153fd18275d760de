"""The deployable description of one variant: what `python -m serve` loads.

The selection step writes ``manifest.json`` beside the variant's graph when it picks a champion;
``serve`` reads it back. The graph follows the Piper input contract (``input``, ``input_lengths``,
``scales``, optional ``sid``) plus explicit noise inputs (``duration_noise``, ``prior_noise``),
which is what ``models.piper.onnx_runtime.PiperOnnxRuntimeVoice(graph_path=...)`` runs.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.atomic_io import write_text_atomic

MANIFEST_SCHEMA_VERSION = 1
KNOWN_ENGINES = ("onnxruntime",)  # engines serve can run from a manifest today
KNOWN_FAMILIES = ("piper",)


class ManifestError(ValueError):
    """A manifest that serve cannot load; the message names the field at fault."""


@dataclass(frozen=True)
class DeploymentManifest:
    variant: str  # e.g. "lite_int8"
    engine: str  # one of KNOWN_ENGINES
    family: str  # one of KNOWN_FAMILIES: decides the frontend and which request fields apply
    voice: str  # "bundled:joe" or a voice path: the phoneme map, espeak voice and sample rate
    graph: str  # the model file, relative to the manifest's folder
    sample_rate_hz: int
    metrics: dict[str, float] = field(default_factory=dict)  # the scores that won the selection
    selection: dict = field(default_factory=dict)  # the rule and why this variant won
    mlflow_run_id: str = ""
    schema_version: int = MANIFEST_SCHEMA_VERSION

    def graph_path(self, manifest_path: Path) -> Path:
        return (Path(manifest_path).parent / self.graph).resolve()


def write_manifest(path: Path, manifest: DeploymentManifest) -> None:
    write_text_atomic(Path(path), json.dumps(asdict(manifest), indent=2, sort_keys=True))


def load_manifest(path: Path) -> DeploymentManifest:
    """Read and validate ``path``; every problem is a ManifestError naming the field."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"no manifest at {path}: run `python -m compress +experiment=full` to pick a champion")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ManifestError(f"{path}: not JSON ({error})") from error
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    known = set(DeploymentManifest.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ManifestError(f"{path}: unknown fields {unknown}; accepted: {sorted(known)}")
    missing = sorted(name for name in ("variant", "engine", "family", "voice", "graph", "sample_rate_hz")
                     if name not in raw)
    if missing:
        raise ManifestError(f"{path}: missing fields {missing}")
    manifest = DeploymentManifest(**raw)
    if manifest.schema_version != MANIFEST_SCHEMA_VERSION:
        raise ManifestError(f"{path}: schema_version {manifest.schema_version}; this code reads "
                            f"{MANIFEST_SCHEMA_VERSION}")
    if manifest.engine not in KNOWN_ENGINES:
        raise ManifestError(f"{path}: engine {manifest.engine!r}; accepted: {list(KNOWN_ENGINES)}")
    if manifest.family not in KNOWN_FAMILIES:
        raise ManifestError(f"{path}: family {manifest.family!r}; accepted: {list(KNOWN_FAMILIES)}")
    if not isinstance(manifest.sample_rate_hz, int) or manifest.sample_rate_hz <= 0:
        raise ManifestError(f"{path}: sample_rate_hz must be a positive integer, got {manifest.sample_rate_hz!r}")
    if Path(manifest.graph).is_absolute() or ".." in Path(manifest.graph).parts:
        raise ManifestError(f"{path}: graph must be a path inside the manifest's folder, got {manifest.graph!r}")
    if not manifest.graph_path(path).is_file():
        raise ManifestError(f"{path}: graph file {manifest.graph_path(path)} does not exist")
    return manifest
