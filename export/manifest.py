"""The deployable description of one variant: what `python -m serve` loads.

The selection step writes ``manifest.json`` beside the variant's files when it picks a champion;
``serve`` reads it back. A variant is one or more graphs by the family's graph name
(models/graph_contract.py): ``{"synthesizer": "fp16.onnx"}`` for a family with one end-to-end
graph, ``{"prefill": ..., "decode_step": ..., "decoder": ...}`` for an autoregressive one, plus
assets by name (a codec's codebooks, a speaker table), every path relative to the manifest's
folder. Each graph follows its family's graph contract, which is what the family's runtime runs.

    write_manifest(path, DeploymentManifest(variant="fp16", engine="onnxruntime", family=family.name,
                                            voice=voice, graphs={"synthesizer": "fp16.onnx"}, sample_rate_hz=22050))
    load_manifest(path).graph_path(path)   # the one graph, resolved

A variant with no graph that the server can rebuild from the family's teacher (the teacher
itself, fp16/bf16, int8_dynamic: ``REBUILT_VARIANTS``) is deployed with ``engine="torch"``, no
graphs, and the ``recipe`` the stage built it with, so a family whose runtime runs no exported
graph still serves its champion:

    DeploymentManifest(variant="int8_dynamic", engine="torch", family="emotivoice", voice=voice,
                       sample_rate_hz=16000, recipe={"parts": ["style_encoder"], "keep_float": []})

Schema 1 (one graph under ``graph``) is still read: ``load_manifest`` turns it into
``graphs={"synthesizer": graph}``, so a deployment written by an earlier run keeps loading.
"""
from __future__ import annotations

import json
from dataclasses import InitVar, asdict, dataclass, field, fields
from pathlib import Path

from core.atomic_io import write_text_atomic
from models.graph_contract import SYNTHESIZER
from models.registry import FAMILIES

MANIFEST_SCHEMA_VERSION = 2
ONE_GRAPH_SCHEMA_VERSION = 1  # ``graph``: one file, the synthesizer
GRAPH_ENGINE = "onnxruntime"  # runs the manifest's graphs
REBUILD_ENGINE = "torch"  # rebuilds the variant from the teacher's weights by the manifest's recipe
KNOWN_ENGINES = (GRAPH_ENGINE, REBUILD_ENGINE)
REQUIRED_FIELDS = ("variant", "engine", "family", "voice", "sample_rate_hz")
# Variants the server rebuilds from the teacher, and the recipe fields (lists of names) each one reads:
# the settings of the stage that built it (stages.fp16.keep_fp32, stages.int8_dynamic.parts ...).
REBUILT_VARIANTS = {"teacher": (), "fp16": ("keep_fp32",), "bf16": ("keep_fp32",),
                    "int8_dynamic": ("parts", "keep_float")}


def rebuild_refusal(variant: str) -> str | None:
    """Why the server cannot rebuild ``variant`` from its family's teacher; None when it can."""
    if variant not in REBUILT_VARIANTS:
        return f"is not rebuilt from the teacher (rebuilt: {sorted(REBUILT_VARIANTS)})"
    return None


class ManifestError(ValueError):
    """A manifest that serve cannot load; the message names the field at fault."""


@dataclass(frozen=True)
class DeploymentManifest:
    variant: str  # e.g. "lite_int8"
    engine: str  # one of KNOWN_ENGINES
    family: str  # a registered family (models/registry.py): decides the runtime and which request fields apply
    voice: str  # "bundled:joe" or a voice path: the phoneme map, espeak voice and sample rate
    sample_rate_hz: int
    graphs: dict[str, str] = field(default_factory=dict)  # graph name -> file, relative to the manifest's folder
    # engine "torch": how the server rebuilds the variant from the teacher (REBUILT_VARIANTS' fields)
    recipe: dict[str, list[str]] = field(default_factory=dict)
    assets: dict[str, str] = field(default_factory=dict)  # asset name -> file, relative to the manifest's folder
    metrics: dict[str, float] = field(default_factory=dict)  # the scores that won the selection
    selection: dict = field(default_factory=dict)  # the rule and why this variant won
    mlflow_run_id: str = ""
    schema_version: int = MANIFEST_SCHEMA_VERSION
    # Shorthand for a one-graph variant: ``graph="fp16.onnx"`` is ``graphs={"synthesizer": "fp16.onnx"}``.
    graph: InitVar[str | None] = None

    def __post_init__(self, graph: str | None):
        if graph is not None:
            if self.graphs and self.graphs != {SYNTHESIZER: graph}:
                raise ManifestError(f"give graph={graph!r} or graphs={self.graphs!r}, not both")
            object.__setattr__(self, "graphs", {SYNTHESIZER: graph})
        # ``manifest.graph`` reads the one graph's file (None for several), as callers of schema 1 did.
        object.__setattr__(self, "graph", next(iter(self.graphs.values())) if len(self.graphs) == 1 else None)

    def graph_path(self, manifest_path: Path, name: str | None = None) -> Path:
        """Graph ``name`` resolved beside ``manifest_path``; ``name`` may be left out when there is one graph."""
        if self.engine == REBUILD_ENGINE:
            raise ManifestError(f"variant {self.variant!r} has no graph: `python -m serve` rebuilds it from the "
                                f"teacher (engine {REBUILD_ENGINE!r}, recipe {self.recipe})")
        if name is None:
            if len(self.graphs) != 1:
                raise ManifestError(f"variant {self.variant!r} has graphs {sorted(self.graphs)}: name the one wanted")
            name = next(iter(self.graphs))
        if name not in self.graphs:
            raise ManifestError(f"variant {self.variant!r} has no graph {name!r}; it has {sorted(self.graphs)}")
        return (Path(manifest_path).parent / self.graphs[name]).resolve()

    def graph_paths(self, manifest_path: Path) -> dict[str, Path]:
        return {name: self.graph_path(manifest_path, name) for name in self.graphs}

    def asset_paths(self, manifest_path: Path) -> dict[str, Path]:
        return {name: (Path(manifest_path).parent / relative).resolve() for name, relative in self.assets.items()}


def write_manifest(path: Path, manifest: DeploymentManifest) -> None:
    write_text_atomic(Path(path), json.dumps(asdict(manifest), indent=2, sort_keys=True))


def _fields_of(raw: dict, path: Path) -> dict:
    """The constructor's fields of a schema 1 or 2 manifest; unknown and missing fields raise."""
    # Written manifests always carry schema_version; one written by hand may not, and says by
    # its files field which schema it follows.
    version = raw.get("schema_version", ONE_GRAPH_SCHEMA_VERSION if "graph" in raw else MANIFEST_SCHEMA_VERSION)
    schema_fields = {f.name for f in fields(DeploymentManifest)}
    if version == ONE_GRAPH_SCHEMA_VERSION:
        files_field, known = "graph", (schema_fields - {"graphs", "assets"}) | {"graph"}
    elif version == MANIFEST_SCHEMA_VERSION:
        files_field, known = "graphs", schema_fields
    else:
        raise ManifestError(f"{path}: schema_version {version!r}; this code reads "
                            f"{[ONE_GRAPH_SCHEMA_VERSION, MANIFEST_SCHEMA_VERSION]}")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ManifestError(f"{path}: unknown fields {unknown}; accepted in schema {version}: {sorted(known)}")
    missing = sorted(name for name in (*REQUIRED_FIELDS, files_field) if name not in raw)
    if missing:
        raise ManifestError(f"{path}: missing fields {missing}")
    values = dict(raw, schema_version=MANIFEST_SCHEMA_VERSION)
    if version == ONE_GRAPH_SCHEMA_VERSION:
        if not isinstance(raw["graph"], str):
            raise ManifestError(f"{path}: graph must be a file name, got {raw['graph']!r}")
        values["graphs"] = {SYNTHESIZER: values.pop("graph")}
    return values


def _check_files(kind: str, files: object, manifest_path: Path, required: bool) -> None:
    """Every file of ``files`` ({name: relative path}) is inside the manifest's folder and exists."""
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ManifestError(f"{manifest_path}: {kind} must map names to file paths, got {files!r}")
    if required and not files:
        raise ManifestError(f"{manifest_path}: {kind} is empty; a variant needs at least one graph")
    for name, relative in files.items():
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise ManifestError(f"{manifest_path}: {kind}.{name} must be a path inside the manifest's folder, "
                                f"got {relative!r}")
        if not (manifest_path.parent / relative).is_file():
            raise ManifestError(f"{manifest_path}: {kind}.{name} file {(manifest_path.parent / relative).resolve()} "
                                "does not exist")


def load_manifest(path: Path) -> DeploymentManifest:
    """Read and validate ``path`` (schema 1 or 2); every problem is a ManifestError naming the field."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"no manifest at {path}: run `python -m compress +experiment=full` to pick a champion")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ManifestError(f"{path}: not JSON ({error})") from error
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    values = _fields_of(raw, path)
    if values["engine"] not in KNOWN_ENGINES:
        raise ManifestError(f"{path}: engine {values['engine']!r}; accepted: {list(KNOWN_ENGINES)}")
    rebuilt = values["engine"] == REBUILD_ENGINE
    _check_files("graphs", values["graphs"], path, required=not rebuilt)
    _check_files("assets", values.get("assets", {}), path, required=False)
    manifest = DeploymentManifest(**values)
    if manifest.family not in FAMILIES:
        raise ManifestError(f"{path}: family {manifest.family!r}; accepted: {sorted(FAMILIES)}")
    if rebuilt:
        _check_recipe(manifest, path)
    elif manifest.recipe:
        raise ManifestError(f"{path}: recipe is for engine {REBUILD_ENGINE!r}; engine {manifest.engine!r} runs graphs")
    if isinstance(manifest.sample_rate_hz, bool) or not isinstance(manifest.sample_rate_hz, int) \
            or manifest.sample_rate_hz <= 0:
        raise ManifestError(f"{path}: sample_rate_hz must be a positive integer, got {manifest.sample_rate_hz!r}")
    return manifest


def _check_recipe(manifest: DeploymentManifest, path: Path) -> None:
    """A rebuilt variant: no graphs, a variant its family can rebuild, and exactly its recipe's fields."""
    if manifest.graphs:
        raise ManifestError(f"{path}: engine {REBUILD_ENGINE!r} rebuilds the variant from the teacher; "
                            f"graphs must be empty, got {sorted(manifest.graphs)}")
    refusal = rebuild_refusal(manifest.variant)
    if refusal is not None:
        raise ManifestError(f"{path}: variant {manifest.variant!r} {refusal}")
    recipe = manifest.recipe
    expected = set(REBUILT_VARIANTS[manifest.variant])
    if not isinstance(recipe, dict) or set(recipe) != expected:
        raise ManifestError(f"{path}: recipe of {manifest.variant!r} must have exactly the fields "
                            f"{sorted(expected)}, got {recipe!r}")
    for name, value in recipe.items():
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ManifestError(f"{path}: recipe.{name} must be a list of names, got {value!r}")
