"""``python -m serve.synthesize``: WAVs and durations.json from every kind of source, and its errors.

    python -m pytest -q tests/serve/test_synthesize_cli.py
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import soundfile

from export.manifest import DeploymentManifest, write_manifest
from models.registry import get_family
from models.sampling import VitsSampling
from serve.synthesize import load_engine, main, synthesize_lines

pytestmark = pytest.mark.slow  # loads the real voice

# The blank line is skipped; the second line is two sentences, spoken into one WAV.
TEXT = "Bring the red kite.\n\nIs it windy? The flags say yes.\n"
DETERMINISTIC_FLAGS = ["--noise-scale", "0", "--noise-scale-w", "0", "--length-scale", "1", "--seed", "0"]
HOP_SAMPLES = 256  # joe is a medium voice: 256 samples per frame


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "lines.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def out_dirs(text_file, tmp_path_factory) -> dict:
    """One CLI run per engine, noise off."""
    dirs = {}
    for engine in ("torch", "onnxruntime"):
        dirs[engine] = tmp_path_factory.mktemp(engine)
        main(["--text-file", str(text_file), "--out-dir", str(dirs[engine]), "--engine", engine,
              *DETERMINISTIC_FLAGS])
    return dirs


@pytest.fixture(scope="module")
def onnx_voice():
    return load_engine(get_family("piper"), "bundled:joe", "onnxruntime")


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_one_wav_per_line_at_the_voice_rate(out_dirs, engine):
    out_dir = out_dirs[engine]
    assert sorted(p.name for p in out_dir.iterdir()) == ["0001.wav", "0002.wav", "durations.json"]
    durations = json.loads((out_dir / "durations.json").read_text())
    assert [len(durations[name]) for name in ("0001.wav", "0002.wav")] == [1, 2]  # sentences per line
    for name in ("0001.wav", "0002.wav"):
        info = soundfile.info(out_dir / name)
        assert (info.samplerate, info.subtype, info.channels) == (22050, "PCM_16", 1)
        # Each sentence is trimmed to its own frames before the sentences are joined.
        assert info.frames == HOP_SAMPLES * sum(sum(sentence) for sentence in durations[name])


def test_engines_agree(out_dirs):
    torch_dir, onnx_dir = out_dirs["torch"], out_dirs["onnxruntime"]
    assert json.loads((torch_dir / "durations.json").read_text()) == json.loads(
        (onnx_dir / "durations.json").read_text())
    for name in ("0001.wav", "0002.wav"):
        ours, _ = soundfile.read(torch_dir / name, dtype="int16")
        reference, _ = soundfile.read(onnx_dir / name, dtype="int16")
        max_diff = np.abs(ours.astype(np.int32) - reference).max()
        assert max_diff <= 1e-3 * np.abs(reference).max() + 1, f"{name}: max |diff| {max_diff} int16 steps"


def test_synthesize_lines_returns_audio_and_durations(onnx_voice):
    noise = VitsSampling(noise_scale=0.0, noise_scale_w=0.0)
    ((waveform, durations),) = synthesize_lines(onnx_voice, ["Bring the red kite."], noise)
    assert waveform.ndim == 1 and len(durations) == 1
    assert waveform.shape[0] == HOP_SAMPLES * sum(durations[0])


def test_unspeakable_line_fails_before_any_wav(tmp_path, capsys):
    text_file = tmp_path / "lines.txt"
    text_file.write_text("Fine words.\n\n...\n", encoding="utf-8")  # line 3 has nothing to speak
    out_dir = tmp_path / "wavs"
    with pytest.raises(SystemExit):
        main(["--text-file", str(text_file), "--out-dir", str(out_dir), "--engine", "onnxruntime"])
    assert "line 3" in capsys.readouterr().err
    assert not out_dir.exists()


@pytest.mark.parametrize(
    "flags, message",
    [(["--text-file", "/no/such/lines.txt"], "/no/such/lines.txt"),
     (["--noise-scale", "-0.1"], "noise_scale is -0.1"),
     (["--noise-scale-w", "-1"], "noise_scale_w is -1"),
     (["--length-scale", "0"], "length_scale is 0"),
     (["--engine", "tensorrt"], "invalid choice: 'tensorrt'")],
)
def test_bad_flags_exit_with_a_clear_message(text_file, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        main(["--text-file", str(text_file), "--out-dir", str(tmp_path / "wavs"), *flags])
    assert message in capsys.readouterr().err


def test_empty_text_file_exits(tmp_path, capsys):
    text_file = tmp_path / "blank.txt"
    text_file.write_text("\n   \n", encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["--text-file", str(text_file), "--out-dir", str(tmp_path / "wavs")])
    assert "no non-empty line" in capsys.readouterr().err


def test_library_callers_get_value_errors(onnx_voice):
    with pytest.raises(ValueError, match="noise_scale is -1"):
        synthesize_lines(onnx_voice, ["Hello."], VitsSampling(noise_scale=-1.0))
    with pytest.raises(ValueError, match="unknown engine 'tensorrt'"):
        load_engine(get_family("piper"), "bundled:joe", "tensorrt")


@pytest.fixture(scope="module")
def deployed_graph(tmp_path_factory):
    """The original graph as the family's runtime prepares it, saved as an exported variant's graph,
    with a manifest that deploys it."""
    family = get_family("piper")
    folder = tmp_path_factory.mktemp("deployed")
    graph = family.reference.prepare_graph(family.reference.graph_path("bundled:joe"))
    onnx.save(graph, str(folder / "prepared.onnx"))
    write_manifest(folder / "manifest.json", DeploymentManifest(
        variant="prepared", engine="onnxruntime", family="piper", voice="bundled:joe",
        graphs={"synthesizer": "prepared.onnx"}, sample_rate_hz=22050))
    return folder


@pytest.mark.parametrize("source", ["--graph", "--manifest"])
def test_an_exported_graph_or_a_manifest_speaks_as_its_engine(text_file, out_dirs, deployed_graph, tmp_path, source):
    target = deployed_graph / ("prepared.onnx" if source == "--graph" else "manifest.json")
    main(["--text-file", str(text_file), "--out-dir", str(tmp_path), source, str(target), *DETERMINISTIC_FLAGS])
    assert (tmp_path / "durations.json").read_text() == (out_dirs["onnxruntime"] / "durations.json").read_text()
    for name in ("0001.wav", "0002.wav"):
        ours, _ = soundfile.read(tmp_path / name, dtype="int16")
        reference, _ = soundfile.read(out_dirs["onnxruntime"] / name, dtype="int16")
        assert np.array_equal(ours, reference)  # the same graph in the same runtime


def test_a_half_precision_variant_keeps_the_teacher_durations(text_file, out_dirs, tmp_path):
    """fp16 keeps the encoder and duration predictor in float32 (serve.half_keep_fp32): same durations."""
    main(["--text-file", str(text_file), "--out-dir", str(tmp_path), "--variant", "fp16", *DETERMINISTIC_FLAGS])
    assert json.loads((tmp_path / "durations.json").read_text()) == json.loads(
        (out_dirs["torch"] / "durations.json").read_text())


@pytest.mark.parametrize("flags, message", [
    (["--engine", "torch", "--variant", "fp16"], "--engine or --variant"),
    (["--variant", "fp16", "--graph", "x.onnx"], "one of --variant"),
    (["--graph", "/no/such/graph.onnx"], "/no/such/graph.onnx"),
    (["--manifest", "/no/such/manifest.json"], "/no/such/manifest.json"),
])
def test_conflicting_or_missing_sources_exit_with_a_clear_message(text_file, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        main(["--text-file", str(text_file), "--out-dir", str(tmp_path / "wavs"), *flags])
    assert message in capsys.readouterr().err
