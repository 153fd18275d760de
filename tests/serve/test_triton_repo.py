"""The Triton model repository: batched-scales graph parity, config dims against the graph, protobuf parse."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from models.piper.onnx_runtime import PiperOnnxRuntimeVoice
from models.piper.triton_graph import triton_graph
from models.interface import SynthesisRequest
from models.registry import get_family
from models.sampling import VitsSampling
from serve.triton_repo import BatchingSettings, load_variant_graph, model_config, triton_layout, write_repository

pytestmark = pytest.mark.slow  # loads the real voice

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TAIL_SAMPLES = 2048  # 8 frames of 256 samples: how far padding reaches back into a row's audio
PYTRITON_PYTHON = Path(os.environ.get("PYTRITON_PYTHON", REPO_ROOT / ".venv-pytriton" / "bin" / "python"))


@pytest.fixture(scope="module")
def variant():
    return load_variant_graph(variant="original_onnx", family="piper")


@pytest.fixture(scope="module")
def repository(variant, tmp_path_factory):
    out = tmp_path_factory.mktemp("triton_models")
    batching = BatchingSettings(max_batch_size=8, preferred_batch_sizes=(2, 4, 8), max_queue_delay_us=1500,
                                instance_kind="cpu", instances=2)
    return out, write_repository(variant, out, batching), batching


SCALE_ORDER = ("noise_scale", "length_scale", "noise_scale_w")  # the graph's scales columns


def test_per_request_scales_match_uniform_runs(variant):
    """Rows with different scales in one batch give each row the audio of a batch run at its scales.

    The reference is the prepared graph on the same batch (same sentences, same noise) with one
    (3,) ``scales``: onnxruntime's numerics then see the same shapes, so any difference would be
    the graph edit's. (Against a batch of one, batching itself moves samples by ~1e-5.) Only a
    row's last frames may move, by ~2e-5, where its padding differs between the two runs: the
    decoder's conv biases on the padding reach up to ~1600 samples back into the row.
    """
    voice = PiperOnnxRuntimeVoice("bundled:joe", threads=1)
    session = ort.InferenceSession(triton_graph(variant.graph).SerializeToString(), providers=["CPUExecutionProvider"])
    sequences = voice.text_to_utterances("Quiet rivers rarely argue. Where did Kenji leave his lantern?")
    feeds = voice.session_feeds(SynthesisRequest.from_utterances(sequences))
    scales = np.array([[0.667, 1.0, 0.8], [0.3, 1.3, 0.5]], np.float32)  # (B, 3); row 1 speaks slower
    audio, durations = session.run(["output", "durations"], {**feeds, "scales": scales})
    for row in range(2):
        uniform = voice.synthesize(SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(
            **dict(zip(SCALE_ORDER, scales[row].tolist())), duration_noise=torch.from_numpy(feeds["duration_noise"]),
            prior_noise=torch.from_numpy(feeds["prior_noise"]))))
        samples = int(uniform.audio_lengths[row])
        assert np.array_equal(durations[row, 0], uniform.durations[row].numpy())
        ours, reference = audio[row].reshape(-1)[:samples], uniform.audio[row, :samples].numpy()
        body = samples - TAIL_SAMPLES
        np.testing.assert_allclose(ours[:body], reference[:body], atol=1e-6)
        np.testing.assert_allclose(ours[body:], reference[body:], atol=1e-4)
    slower = voice.synthesize(SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(**dict(zip(SCALE_ORDER, scales[1].tolist())))))
    assert slower.durations[0].sum() > durations[0, 0].sum()  # length_scale 1.3 did not reach row 0


def test_config_matches_the_written_graph(repository):
    out, configs, batching = repository
    assert set(configs) == {"tts_original_onnx", "tts_original_onnx_trt"}
    session = ort.InferenceSession(str(out / "tts_original_onnx" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    graph_shapes = {t.name: t.shape for t in [*session.get_inputs(), *session.get_outputs()]}
    config = model_config("tts_original_onnx", "onnxruntime_onnx",
                          load_variant_graph(variant="original_onnx", family="piper").graph, batching,
                          get_family("piper").triton)
    declared = config["input"] + config["output"]
    assert {entry["name"] for entry in declared} == set(graph_shapes)
    for entry in declared:
        shape = graph_shapes[entry["name"]]
        model_dims = entry["reshape"]["shape"] if "reshape" in entry else entry["dims"]
        assert len(shape) == 1 + len(model_dims), entry["name"]  # batch first, then the declared dims
        for declared_dim, graph_dim in zip(model_dims, shape[1:]):
            dynamic_in_graph = not isinstance(graph_dim, int)
            assert dynamic_in_graph or declared_dim in (-1, graph_dim), (entry["name"], model_dims, shape)
    text = configs["tts_original_onnx"].read_text()
    assert 'backend: "onnxruntime"' in text and "max_batch_size: 8" in text
    assert "preferred_batch_size: [2, 4, 8]" in text and "max_queue_delay_microseconds: 1500" in text
    assert "kind: KIND_CPU" in text and "count: 2" in text
    trt_text = configs["tts_original_onnx_trt"].read_text()
    assert 'platform: "tensorrt_plan"' in trt_text and "python -m export.tensorrt_engine" in trt_text
    assert not any((out / "tts_original_onnx_trt" / "1").iterdir())  # no fake plan


@pytest.mark.skipif(not PYTRITON_PYTHON.is_file(), reason=(
    "parsing config.pbtxt with Triton's own schema needs tritonclient, which lives in .venv-pytriton "
    "(numpy<2): bash scripts/pytriton_env.sh"))
def test_configs_parse_as_triton_model_config(repository):
    out, configs, _ = repository
    script = (
        "import json, sys\n"
        "from google.protobuf import json_format, text_format\n"
        "from tritonclient.grpc import model_config_pb2\n"
        "parsed = {p: json_format.MessageToDict(text_format.Parse(open(p).read(), model_config_pb2.ModelConfig()))"
        " for p in sys.argv[1:]}\n"
        "print(json.dumps(parsed))\n"
    )
    result = subprocess.run([str(PYTRITON_PYTHON), "-c", script, *map(str, configs.values())],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    onnx_config = parsed[str(configs["tts_original_onnx"])]
    assert onnx_config["backend"] == "onnxruntime" and onnx_config["maxBatchSize"] == 8
    assert [i["name"] for i in onnx_config["input"]] == ["input", "input_lengths", "scales", "duration_noise",
                                                          "prior_noise"]
    scales = next(i for i in onnx_config["input"] if i["name"] == "scales")
    assert scales["dims"] == ["3"] and scales["dataType"] == "TYPE_FP32"
    lengths = next(i for i in onnx_config["input"] if i["name"] == "input_lengths")
    assert lengths["dims"] == ["1"] and "reshape" in lengths  # (B,) in the graph: [1] reshaped to []
    assert onnx_config["dynamicBatching"] == {"preferredBatchSize": [2, 4, 8], "maxQueueDelayMicroseconds": "1500"}
    assert onnx_config["instanceGroup"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert parsed[str(configs["tts_original_onnx_trt"])]["platform"] == "tensorrt_plan"


def test_bad_settings_and_sources_are_refused(tmp_path):
    with pytest.raises(ValueError, match="preferred_batch_sizes"):
        BatchingSettings(max_batch_size=4, preferred_batch_sizes=(8,))
    with pytest.raises(ValueError, match="instance_kind"):
        BatchingSettings(instance_kind="tpu")
    with pytest.raises(ValueError, match="exactly one"):
        load_variant_graph()
    with pytest.raises(ValueError, match="use one of"):
        load_variant_graph(variant="teacher")
    with pytest.raises(ValueError, match="needs --family"):
        load_variant_graph(variant="original_onnx")
    with pytest.raises(ValueError, match="family 'piper' registers no Triton layout"):
        triton_layout(dataclasses.replace(get_family("piper"), triton=None))
    from export.manifest import ManifestError

    with pytest.raises(ManifestError, match="no manifest"):
        load_variant_graph(manifest_path=tmp_path / "manifest.json")


def test_cli_rejects_bad_batch_sizes(tmp_path):
    result = subprocess.run([sys.executable, "-m", "serve.triton_repo", "--variant", "original_onnx", "--family",
                             "piper", "--out", str(tmp_path), "--preferred-batch-sizes", "4,x"], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 2 and "--preferred-batch-sizes" in result.stderr
