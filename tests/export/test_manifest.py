"""The deployment manifest: several graphs and assets per variant round-trip; a one-graph manifest
written by earlier runs (schema 1) still loads; a bad one is a ManifestError naming the field.

    python -m pytest -q tests/export/test_manifest.py
"""
from __future__ import annotations

import json

import pytest

from export.manifest import MANIFEST_SCHEMA_VERSION, DeploymentManifest, ManifestError, load_manifest, write_manifest
from models.graph_contract import SYNTHESIZER
from models.registry import FAMILIES

FAMILY = sorted(FAMILIES)[0]
AUTOREGRESSIVE_GRAPHS = {"prefill": "ar.prefill.onnx", "decode_step": "ar.decode_step.onnx", "decoder": "ar.decoder.onnx"}


def touch(folder, *names):
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"graph")


def test_several_graphs_and_assets_round_trip(tmp_path):
    touch(tmp_path, *AUTOREGRESSIVE_GRAPHS.values(), "assets/codebooks.npy")
    manifest = DeploymentManifest(variant="ar_int8", engine="onnxruntime", family=FAMILY, voice="v",
                                  sample_rate_hz=24000, graphs=AUTOREGRESSIVE_GRAPHS,
                                  assets={"codebooks": "assets/codebooks.npy"}, metrics={"mcd_db": 1.5})
    path = tmp_path / "manifest.json"
    write_manifest(path, manifest)

    loaded = load_manifest(path)
    assert loaded == manifest and loaded.schema_version == MANIFEST_SCHEMA_VERSION
    assert loaded.graph is None  # several graphs: none is "the" graph
    assert loaded.graph_paths(path) == {name: (tmp_path / file).resolve() for name, file in AUTOREGRESSIVE_GRAPHS.items()}
    assert loaded.graph_path(path, "decode_step") == (tmp_path / "ar.decode_step.onnx").resolve()
    assert loaded.asset_paths(path) == {"codebooks": (tmp_path / "assets" / "codebooks.npy").resolve()}
    with pytest.raises(ManifestError, match="name the one wanted"):
        loaded.graph_path(path)
    with pytest.raises(ManifestError, match="no graph 'synthesizer'"):
        loaded.graph_path(path, SYNTHESIZER)


def test_one_graph_shorthand_is_the_synthesizer(tmp_path):
    touch(tmp_path, "fp16.onnx")
    path = tmp_path / "manifest.json"
    write_manifest(path, DeploymentManifest(variant="fp16", engine="onnxruntime", family=FAMILY, voice="v",
                                            graph="fp16.onnx", sample_rate_hz=22050))
    assert json.loads(path.read_text())["graphs"] == {SYNTHESIZER: "fp16.onnx"}
    loaded = load_manifest(path)
    assert loaded.graph == "fp16.onnx" and loaded.graph_path(path) == (tmp_path / "fp16.onnx").resolve()


def test_a_one_graph_manifest_of_an_earlier_run_still_loads(tmp_path):
    """outputs/champion/manifest.json as schema 1 wrote it."""
    touch(tmp_path, "lite_int8.onnx")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({
        "engine": "onnxruntime", "family": FAMILY, "graph": "lite_int8.onnx", "metrics": {"rtf_cpu_b1": 0.02},
        "mlflow_run_id": "abc", "sample_rate_hz": 22050, "schema_version": 1,
        "selection": {"champion": "lite_int8"}, "variant": "lite_int8", "voice": "bundled:joe",
    }))
    loaded = load_manifest(path)
    assert loaded.graphs == {SYNTHESIZER: "lite_int8.onnx"} and loaded.assets == {}
    assert loaded.graph == "lite_int8.onnx" and loaded.graph_path(path) == (tmp_path / "lite_int8.onnx").resolve()
    assert (loaded.variant, loaded.mlflow_run_id, loaded.metrics) == ("lite_int8", "abc", {"rtf_cpu_b1": 0.02})


@pytest.mark.parametrize("change, message", [
    ({"schema_version": 7}, "schema_version 7"),
    ({"graphs": {}}, "graphs is empty"),
    ({"graphs": {SYNTHESIZER: "../elsewhere.onnx"}}, "graphs.synthesizer must be a path inside"),
    ({"graphs": {SYNTHESIZER: "missing.onnx"}}, "graphs.synthesizer file .* does not exist"),
    ({"assets": {"speakers": "missing.npy"}}, "assets.speakers file"),
    ({"graphs": ["fp16.onnx"]}, "graphs must map names to file paths"),
    ({"graph": "fp16.onnx"}, r"unknown fields \['graph'\]"),
    ({"family": "nobody"}, "family 'nobody'"),
    ({"engine": "tensorrt"}, "engine 'tensorrt'"),
    ({"sample_rate_hz": 0}, "sample_rate_hz must be a positive integer"),
])
def test_a_bad_manifest_names_the_field(tmp_path, change, message):
    touch(tmp_path, "fp16.onnx")
    path = tmp_path / "manifest.json"
    write_manifest(path, DeploymentManifest(variant="fp16", engine="onnxruntime", family=FAMILY, voice="v",
                                            graph="fp16.onnx", sample_rate_hz=22050))
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ManifestError, match=message):
        load_manifest(path)


def test_a_manifest_missing_its_graph_field_says_which(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"variant": "v", "engine": "onnxruntime", "family": FAMILY, "voice": "v",
                                "sample_rate_hz": 22050, "schema_version": 1}))
    with pytest.raises(ManifestError, match=r"missing fields \['graph'\]"):
        load_manifest(path)


def _rebuilt(path, **fields):
    values = dict(variant="int8_dynamic", engine="torch", family="emotivoice", voice="random", sample_rate_hz=16000,
                  recipe={"parts": ["style_encoder"], "keep_float": []})
    path.write_text(json.dumps({"schema_version": MANIFEST_SCHEMA_VERSION, "graphs": {}, **values, **fields}))
    return path


def test_a_variant_rebuilt_from_the_teacher_round_trips_with_its_recipe(tmp_path):
    path = tmp_path / "manifest.json"
    manifest = DeploymentManifest(variant="fp16", engine="torch", family="gpt_sovits_v2", voice="random",
                                  sample_rate_hz=32000, recipe={"keep_fp32": ["sovits"]})
    write_manifest(path, manifest)
    assert load_manifest(path) == manifest and load_manifest(_rebuilt(tmp_path / "int8.json")).graphs == {}
    with pytest.raises(ManifestError, match="has no graph: `python -m serve` rebuilds it from the teacher"):
        manifest.graph_path(path)  # what the Triton tools ask of a manifest


@pytest.mark.parametrize("change, message", [
    ({"graphs": {SYNTHESIZER: "fp16.onnx"}}, "graphs must be empty"),
    ({"variant": "lite_int8", "recipe": {}}, "'lite_int8' is not rebuilt from the teacher"),
    ({"recipe": {"parts": ["style_encoder"]}}, r"exactly the fields \['keep_float', 'parts'\]"),
    ({"recipe": {"parts": "style_encoder", "keep_float": []}}, "recipe.parts must be a list of names"),
    ({"engine": "onnxruntime", "graphs": {SYNTHESIZER: "fp16.onnx"}}, "recipe is for engine 'torch'"),
])
def test_a_bad_rebuilt_manifest_names_the_field(tmp_path, change, message):
    touch(tmp_path, "fp16.onnx")
    with pytest.raises(ManifestError, match=message):
        load_manifest(_rebuilt(tmp_path / "manifest.json", **change))
