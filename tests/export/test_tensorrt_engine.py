"""Real TensorRT builds of our graphs (export/tensorrt_engine.py): TensorRT-RTX builds without a GPU,
so these run in CI and FAIL, not skip, where no TensorRT builder is installed (`pip install -e .[tensorrt]`).

    python -m pytest -q tests/export/test_tensorrt_engine.py
"""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import export.tensorrt_engine as tensorrt_engine
from export.onnx_export import export_decoder
from export.settings import TensorRTSettings
from export.tensorrt_engine import (EXIT_CANNOT_RUN, EXIT_UNAVAILABLE, RESULT_SUFFIX, build_engine, import_backend,
                                    layers_from_log, runtime_support)
from models.piper.tiny import tiny_voice
from models.precision import PrecisionIsland
from models.registry import family_of

REPO_ROOT = Path(__file__).resolve().parents[2]
CHANNELS = 8
SMALL = TensorRTSettings(axis_ranges={"batch_size": [1, 2, 4], "frames": [2, 64, 512], "phonemes": [2, 32, 64]},
                         workspace_mib=256)


@pytest.fixture(scope="module")
def backend():
    """The builder under test; a missing one fails every test that asks for it."""
    found, reason = import_backend()
    assert found is not None, reason
    return found


def test_a_tensorrt_builder_is_installed(backend):
    assert backend.name in ("tensorrt", "tensorrt_rtx") and backend.version


def conv_graph(path: Path, quantized: bool = False) -> Path:
    """z (B, C, T) -> relu(conv1d(z)): with Q/DQ on the input (per-tensor) and the weight (per
    output channel, symmetric) when ``quantized``, the form modelopt's INT8 decoder graph has."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((CHANNELS, CHANNELS, 3)).astype(np.float32)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch_size", CHANNELS, "frames"])
    audio = helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch_size", CHANNELS, "frames"])
    initializers = [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(np.zeros(CHANNELS, np.float32), "bias")]
    nodes = [helper.make_node("Conv", ["z_in", "weight_in", "bias"], ["conv"], pads=[1, 1], name="conv"),
             helper.make_node("Relu", ["conv"], ["audio"], name="relu")]
    if quantized:
        weight_scale = (np.abs(weight).reshape(CHANNELS, -1).max(axis=1) / 127).astype(np.float32)
        initializers += [numpy_helper.from_array(weight_scale, "weight_scale"),
                         numpy_helper.from_array(np.zeros(CHANNELS, np.int8), "weight_zero"),
                         numpy_helper.from_array(np.array(0.05, np.float32), "z_scale"),
                         numpy_helper.from_array(np.array(0, np.int8), "z_zero")]
        nodes = [helper.make_node("QuantizeLinear", ["z", "z_scale", "z_zero"], ["z_q"], name="z_q"),
                 helper.make_node("DequantizeLinear", ["z_q", "z_scale", "z_zero"], ["z_in"], name="z_dq"),
                 helper.make_node("QuantizeLinear", ["weight", "weight_scale", "weight_zero"], ["weight_q"], axis=0,
                                  name="weight_q"),
                 helper.make_node("DequantizeLinear", ["weight_q", "weight_scale", "weight_zero"], ["weight_in"], axis=0,
                                  name="weight_dq"), *nodes]
    else:
        nodes = [helper.make_node("Identity", ["z"], ["z_in"], name="z_in"),
                 helper.make_node("Identity", ["weight"], ["weight_in"], name="weight_in"), *nodes]
    model = helper.make_model(helper.make_graph(nodes, "conv", [z], [audio], initializers),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def original_style_graph(path: Path) -> Path:
    """The shape of Piper's original alignment: NonZero finds the frames, ScatterND writes them."""
    durations = helper.make_tensor_value_info("durations", TensorProto.FLOAT, ["batch_size", "phonemes"])
    path_out = helper.make_tensor_value_info("path", TensorProto.FLOAT, None)
    nodes = [helper.make_node("NonZero", ["durations"], ["where"], name="/dp/flows.7/NonZero"),
             helper.make_node("Transpose", ["where"], ["indices"], perm=[1, 0], name="/Transpose"),
             helper.make_node("Shape", ["indices"], ["count_shape"], start=0, end=1, name="/Shape"),
             helper.make_node("ConstantOfShape", ["count_shape"], ["ones"],
                              value=numpy_helper.from_array(np.ones(1, np.float32)), name="/ConstantOfShape"),
             helper.make_node("ScatterND", ["durations", "indices", "ones"], ["path"], name="/ScatterND")]
    model = helper.make_model(helper.make_graph(nodes, "original_style", [durations], [path_out]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def tiny_decoder():
    voice = tiny_voice()
    return voice.model.dec.eval(), voice.model.hp.latent_channels


def test_piper_decoder_from_our_exporter_builds_fp32_layers(tiny_decoder, backend, tmp_path):
    decoder, latent_channels = tiny_decoder
    graph = export_decoder(decoder, tmp_path / "decoder.onnx", latent_channels)
    result = build_engine(graph, tmp_path / "decoder.plan", SMALL)
    assert result.status == "built", result.reason
    assert (result.backend, result.backend_version) == (backend.name, backend.version)
    assert result.plan_bytes == (tmp_path / "decoder.plan").stat().st_size > 0
    assert 0 < result.build_time_s < 60
    computing = {precision: count for precision, count in result.precision_counts.items() if precision != "none"}
    assert computing.get("fp32", 0) >= 3 and set(computing) == {"fp32"}, result.precision_counts
    assert result.profile["z"] == {"min": [1, latent_channels, 2], "opt": [2, latent_channels, 64],
                                   "max": [4, latent_channels, 512]}


def test_fp16_graph_builds_fp16_layers(tiny_decoder, tmp_path):
    """The strongly typed network keeps the graph's types: an fp16 island builds fp16 layers."""
    decoder, latent_channels = tiny_decoder
    island = PrecisionIsland(copy.deepcopy(decoder), torch.float16)
    graph = export_decoder(island, tmp_path / "decoder_fp16.onnx", latent_channels, dynamo=False)
    result = build_engine(graph, tmp_path / "decoder_fp16.plan", SMALL)
    assert result.status == "built", result.reason
    counts = result.precision_counts
    assert counts.get("fp16", 0) > counts.get("fp32", 0), counts  # fp32 only at the island's edges
    convolutions = [layer for layer in result.layers if layer["type"] in ("correlation", "deconv")
                    or "Convolution" in layer["type"]]
    assert convolutions and {layer["precision"] for layer in convolutions} == {"fp16"}, result.layers


def test_qdq_graph_builds_int8_layers(tmp_path):
    result = build_engine(conv_graph(tmp_path / "qdq.onnx", quantized=True), tmp_path / "qdq.plan", SMALL)
    assert result.status == "built", result.reason
    assert result.precision_counts.get("int8", 0) >= 1, result.layers
    conv = [layer for layer in result.layers if layer["name"].startswith("conv")]
    assert conv and conv[0]["precision"] == "int8", result.layers


def test_original_style_graph_is_refused_by_the_parser_at_nonzero(backend, tmp_path):
    result = build_engine(original_style_graph(tmp_path / "original.onnx"), tmp_path / "original.plan", SMALL)
    if backend.name == "tensorrt":  # full TensorRT imports NonZero natively (data-dependent shapes)
        assert result.status == "built", result.reason
        return
    assert result.status == "failed" and not (tmp_path / "original.plan").exists()
    assert result.reason.startswith("ONNX parser: ")
    assert "/dp/flows.7/NonZero" in result.reason and "NonZero plugin" in result.reason, result.reason


@pytest.mark.slow  # the tiny synthesizer's dynamo export alone takes ~17 s on 2 cores (shared: conftest.py)
def test_piper_synthesizer_as_one_graph_is_refused_at_the_frame_range(backend, tmp_path, exported_once):
    """What the real builder says of our one-graph Piper synthesizer, verbatim: its frame count is a
    shape computed from float values (durations scaled by ``scales``), and TensorRT computes shapes
    from input shapes and integer inputs only. The pair split at the durations builds instead
    (tests/models/piper/test_tensorrt_pair.py). When the graph changes, this test says so."""
    voice = tiny_voice()
    graph = exported_once(family_of(voice).graph_contracts(voice)["synthesizer"])
    settings = TensorRTSettings(axis_ranges={"batch_size": [1, 1, 2], "phonemes": [2, 16, 32], "frames": [2, 64, 512]})
    result = build_engine(graph, tmp_path / "synthesizer.plan", settings)
    assert result.status == "failed", "our synthesizer graph now builds: update docs/benchmarks.md and this test"
    assert "importScatterElements" not in result.reason, result.reason  # the attention gathers now
    assert "/Range" in result.reason and "scales is a shape tensor" in result.reason, result.reason


def test_an_identical_rebuild_reuses_the_plan_and_every_file_is_written_atomically(backend, tmp_path, monkeypatch):
    graph = conv_graph(tmp_path / "conv.onnx")
    plan = tmp_path / "conv.plan"
    written = []
    real_atomic_write, real_text = tensorrt_engine.atomic_write, tensorrt_engine.write_text_atomic
    monkeypatch.setattr(tensorrt_engine, "atomic_write", lambda path, write: (written.append(Path(path).name),
                                                                             real_atomic_write(path, write)))
    monkeypatch.setattr(tensorrt_engine, "write_text_atomic", lambda path, text: (written.append(Path(path).name),
                                                                                 real_text(path, text)))
    settings = TensorRTSettings(axis_ranges=SMALL.axis_ranges, workspace_mib=256,
                                timing_cache=str(tmp_path / "timing.cache"))
    first = build_engine(graph, plan, settings)
    assert first.status == "built" and not first.reused
    assert sorted(written) == sorted(["conv.plan", "conv.plan" + RESULT_SUFFIX, "conv.plan.build.log"]
                                     + (["timing.cache"] if backend.name == "tensorrt" else []))
    if backend.name == "tensorrt_rtx":  # TensorRT-RTX's builder times no kernels: nothing to cache
        assert first.timing_cache.startswith("not used: TensorRT-RTX") and not (tmp_path / "timing.cache").exists()
    plan_mtime_ns = plan.stat().st_mtime_ns
    second = build_engine(graph, plan, settings)
    assert second.reused and second.status == "built" and plan.stat().st_mtime_ns == plan_mtime_ns
    assert (second.plan_bytes, second.precision_counts, second.build_time_s) == \
           (first.plan_bytes, first.precision_counts, first.build_time_s)
    assert len(written) == 3 + (backend.name == "tensorrt")  # nothing written again
    rebuilt = build_engine(graph, plan, TensorRTSettings(axis_ranges=SMALL.axis_ranges, workspace_mib=128))
    assert not rebuilt.reused  # other settings, another build
    assert not list(tmp_path.glob("*.tmp"))


def test_without_tensorrt_the_build_says_unavailable_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tensorrt_engine, "import_backend", lambda: (None, "no TensorRT is installed here (test)"))
    graph = conv_graph(tmp_path / "conv.onnx")
    result = build_engine(graph, tmp_path / "conv.plan", SMALL)
    assert result.status == "unavailable" and result.profile["z"]["max"] == [4, CHANNELS, 512]
    assert tensorrt_engine.main(["--onnx", str(graph), "--out", str(tmp_path / "conv.plan")]) == EXIT_UNAVAILABLE
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == ["engine_status=unavailable: no TensorRT is installed here (test)"]
    assert not (tmp_path / "conv.plan").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the no-GPU answer cannot be exercised")
def test_cli_builds_then_says_in_one_line_why_it_cannot_run_here(backend, tmp_path):
    graph = conv_graph(tmp_path / "conv.onnx")
    completed = subprocess.run([sys.executable, "-m", "export.tensorrt_engine", "--onnx", str(graph),
                                "--out", str(tmp_path / "conv.plan"), "--run"],
                               capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert completed.returncode == EXIT_CANNOT_RUN, completed.stderr
    built, cannot_run = completed.stdout.strip().splitlines()
    assert built.startswith(f"engine_status=built ({backend.name} {backend.version})")
    assert cannot_run.startswith("engine_run=unsupported: ") and "no CUDA GPU" in cannot_run
    if backend.name == "tensorrt_rtx":
        assert "compute capability 8.0, 8.6, 8.9 and 12.x" in cannot_run
    assert "Traceback" not in completed.stderr


def test_an_h200_is_named_with_the_compute_capability_limit(backend, monkeypatch):
    """TensorRT-RTX refuses compute capability 9.0 (measured on the H200); the answer says so before trying."""
    if backend.name != "tensorrt_rtx":
        pytest.skip("full TensorRT runs on datacenter GPUs")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    reason = runtime_support(backend)
    assert "NVIDIA H200: compute capability 9.0" in reason and "8.0, 8.6, 8.9 and 12.x" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (8, 9))
    assert runtime_support(backend) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (12, 1))
    assert runtime_support(backend) is None


def test_full_tensorrt_layer_information_is_read_too():
    """Full TensorRT 10 prints its engine layers in another form; the same fields come out."""
    message = ("Engine Layer Information:\n"
               "Layer(CaskConvolution): /dec/conv_pre/Conv, Tactic: 0x00000000000003e8, z (Half[1,192,64]) -> "
               "/dec/conv_pre/Conv_output_0 (Half[1,512,64])\n"
               "Layer(Reformat): Reformatting CopyNode for Input Tensor 0 to q, Tactic: 0x0, x (Float[1,4]) -> y (Int8[1,4])")
    assert layers_from_log(["unrelated", message]) == [
        {"name": "/dec/conv_pre/Conv", "type": "CaskConvolution", "precision": "fp16"},
        {"name": "Reformatting CopyNode for Input Tensor 0 to q", "type": "Reformat", "precision": "fp32"},
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="running an engine needs a CUDA GPU")
def test_runner_runs_dynamic_shapes_on_cuda_tensors_and_keeps_its_runtime_cache(tmp_path):
    # Not the ``backend`` fixture: a GPU machine without a builder (the H200 here, which refuses
    # TensorRT-RTX engines anyway) skips with the reason; test_a_tensorrt_builder_is_installed is
    # what fails where the builder belongs.
    backend, missing = import_backend()
    if backend is None:
        pytest.skip(f"no TensorRT builder on this GPU machine: {missing}")
    reason = runtime_support(backend)
    if reason is not None:
        pytest.skip(reason)
    graph = conv_graph(tmp_path / "conv.onnx")
    built = build_engine(graph, tmp_path / "conv.plan", SMALL)
    assert built.status == "built", built.reason
    model = onnx.load(str(graph))
    weight = torch.from_numpy(numpy_helper.to_array(model.graph.initializer[0]))
    runner = tensorrt_engine.TensorRTRunner(built.engine_path, runtime_cache=tmp_path / "conv.runtime_cache")
    for batch, frames in ((1, 7), (3, 300)):  # two shapes inside one profile
        z = torch.randn(batch, CHANNELS, frames, device="cuda")
        (audio,) = runner.run({"z": z}).values()
        expected = torch.relu(torch.nn.functional.conv1d(z, weight.cuda(), padding=1))
        torch.testing.assert_close(audio, expected, rtol=1e-3, atol=1e-3)
    cache = runner.save_runtime_cache()
    if backend.name == "tensorrt_rtx":
        assert cache.is_file() and cache.stat().st_size > 0
        again = tensorrt_engine.TensorRTRunner(built.engine_path, runtime_cache=cache)  # loads the saved kernels
        (audio,) = again.run({"z": torch.zeros(1, CHANNELS, 5, device="cuda")}).values()
        assert audio.shape == (1, CHANNELS, 5)
