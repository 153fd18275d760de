"""evaluate/gpu_engines.py on the CPU: a family's variants rebuilt from a bundle, each engine measured,
rows compared with the variant's eager run. Tiny random weights, so it runs in seconds."""
from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch
from safetensors.torch import save_file

from core.file_digest import file_sha256
from evaluate import gpu_engines
from evaluate.score_gpu_audio import load_audio
from models.conv_layout import LayoutConv, converted_copy
from models.piper import gpu_bundle
from models.piper.duration_student import NoiseAffineDurationPredictor, save_duration_student
from models.piper.lite import LiteStudent, LiteStudentConfig, build_lite_parts
from models.piper.tiny import tiny_vits
from models.piper.training.lite_training import save_student
from models.precision import PrecisionIsland
from models.registry import get_family

FAMILY_NAME = "piper"  # the family whose suite is measured; its tiny architecture keeps this fast


@pytest.fixture()
def bundle_and_inputs(tmp_path):
    teacher = tiny_vits(num_symbols=30, seed=0)
    bundle_dir = tmp_path / "bundle"
    bundle_dir.mkdir()
    save_file({name: tensor.half().contiguous() for name, tensor in teacher.state_dict().items()},
              str(bundle_dir / "teacher.safetensors"))
    (bundle_dir / "bundle.json").write_text(json.dumps({
        "family": FAMILY_NAME, "hyperparams": dataclasses.asdict(teacher.hp), "sample_rate_hz": 22050}))
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"family": FAMILY_NAME, "eval_set": "eval", "seed": 0, "utterances": [
        {"text": "a", "phoneme_ids": [1, 5, 0, 7, 0, 9, 2]}, {"text": "b", "phoneme_ids": [1, 3, 0, 4, 2]}]}))
    return bundle_dir, inputs


def _run_on_cpu(monkeypatch, bundle_and_inputs, out, *arguments: str) -> dict:
    """``python -m evaluate.gpu_engines`` on this CPU with one warm run and a short warm-up: its report.
    The script sets torch's thread count; the test process gets its own back."""
    bundle_dir, inputs = bundle_and_inputs
    monkeypatch.setattr(sys, "argv", ["gpu_engines", "--bundle", str(bundle_dir), "--inputs", str(inputs),
                                      "--warm-runs", "1", "--warmup-s", "0.1", "--device", "cpu", *arguments,
                                      "--out", str(out)])
    threads = torch.get_num_threads()
    try:
        gpu_engines.main()
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.read_text())


def test_engines_of_a_family_run_and_compare_with_eager(bundle_and_inputs, tmp_path, monkeypatch):
    assert get_family(FAMILY_NAME).gpu_engines.plan == gpu_bundle.ENGINE_PLAN  # the registry carries the suite
    report = _run_on_cpu(monkeypatch, bundle_and_inputs, tmp_path / "engines.json",
                         "--only", "teacher/eager,fp16/eager", "--rounds", "3", "--save-audio", "2")
    engines = report["engines"]
    assert set(engines) == {"teacher/eager", "fp16/eager"}
    assert report["students_sha256"] == {}  # no student ran: none to match a table's Lite rows against
    assert engines["teacher/eager"]["speedup_b1_vs_teacher_eager"] == 1.0
    assert "error" not in engines["fp16/eager"]
    # Three rounds per engine; each figure is their median and its spread their range.
    for row in engines.values():
        rounds = row["rtf_cuda_b1_rounds"]
        assert row["rounds"] == len(rounds) == len(row["rtf_cuda_b16_rounds"]) == 3
        assert row["rtf_cuda_b1"] == sorted(rounds)[1]
        assert row["rtf_cuda_b1_spread"] == max(rounds) - min(rounds) > 0
    # Each engine's own audio is kept for scoring, in the format evaluate.score_gpu_audio reads.
    variant, sample_rate_hz, texts, waveforms = load_audio(str(tmp_path / engines["fp16/eager"]["audio_file"]))
    assert (variant, sample_rate_hz, texts, len(waveforms)) == ("fp16/eager", 22050, ["a", "b"], 2)
    # No student weights: the student variants are not in the run at all.
    assert not any(key.startswith("lite") for key in engines)


def test_rounds_must_be_positive(bundle_and_inputs, tmp_path, monkeypatch, capsys):
    bundle_dir, inputs = bundle_and_inputs
    monkeypatch.setattr(sys, "argv", ["gpu_engines", "--bundle", str(bundle_dir), "--inputs", str(inputs),
                                      "--rounds", "0", "--device", "cpu", "--out", str(tmp_path / "engines.json")])
    with pytest.raises(SystemExit):
        gpu_engines.main()
    assert "--rounds and --warm-runs must be >= 1" in capsys.readouterr().err


def test_bundle_without_a_family_is_refused(bundle_and_inputs, tmp_path, monkeypatch):
    bundle_dir, inputs = bundle_and_inputs
    (bundle_dir / "bundle.json").write_text(json.dumps({"sample_rate_hz": 22050, "hyperparams": {}}))
    monkeypatch.setattr(sys, "argv", ["gpu_engines", "--bundle", str(bundle_dir), "--inputs", str(inputs),
                                      "--device", "cpu", "--out", str(tmp_path / "engines.json")])
    with pytest.raises(ValueError, match="has no 'family'"):
        gpu_engines.main()


def test_the_teacher_rebuilt_from_a_bundle_is_the_teacher(bundle_and_inputs):
    bundle_dir, _ = bundle_and_inputs
    rebuilt = gpu_bundle.teacher_from_bundle(bundle_dir)
    original = tiny_vits(num_symbols=30, seed=0)
    for name, tensor in original.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], tensor.half().float()), name


def test_an_engine_in_another_conv_layout_runs_beside_the_variants_own(bundle_and_inputs, tmp_path, monkeypatch):
    out = tmp_path / "engines.json"
    converted = []

    def spy(model, layout):
        copy = converted_copy(model, layout)
        converted.append((model, copy, layout))
        return copy

    monkeypatch.setattr(gpu_engines, "converted_copy", spy)
    # Named converted-first and twice: each engine runs once, in the plan's order (eager native first).
    report = _run_on_cpu(monkeypatch, bundle_and_inputs, out,
                         "--only", "teacher/eager@channels_last,teacher/eager,teacher/eager", "--rounds", "1")
    engines = report["engines"]
    assert set(engines) == {"teacher/eager", "teacher@channels_last/eager"}
    # The converted engine ran a channels-last copy; the variant's own model kept its Conv1d.
    [(original, copy, layout)] = converted
    assert layout == "channels_last" and copy is not original
    assert any(isinstance(m, LayoutConv) for m in copy.modules())
    assert not any(isinstance(m, LayoutConv) for m in original.modules())
    # The same arithmetic in another memory layout: the same durations, audio equal to rounding.
    row = engines["teacher@channels_last/eager"]
    assert row["durations_equal_vs_eager"] == 1.0
    assert row["snr_db_vs_eager"] > 60
    assert row["cudnn_benchmark"] is False and report["machine"]["cudnn_benchmark"] is False


@pytest.mark.parametrize("only, message", [("teacher/eager@nhwc", "conv layout 'nhwc'"),
                                           ("teacher/warp", "not in the plan")])
def test_an_unknown_pair_or_layout_is_refused(bundle_and_inputs, tmp_path, monkeypatch, capsys, only, message):
    bundle_dir, inputs = bundle_and_inputs
    monkeypatch.setattr(sys, "argv", ["gpu_engines", "--bundle", str(bundle_dir), "--inputs", str(inputs),
                                      "--only", only, "--device", "cpu", "--out", str(tmp_path / "engines.json")])
    with pytest.raises(SystemExit):
        gpu_engines.main()
    assert message in capsys.readouterr().err


@pytest.fixture()
def students(tmp_path):
    """A tiny Lite student and a duration student distilled from nothing: weights for the variants' shapes."""
    teacher = tiny_vits(num_symbols=30, seed=0)
    config = LiteStudentConfig(decoder_initial_channels=32, upsample_rates=(2,), upsample_kernel_sizes=(4,),
                               istft_hop=4, flow_hidden_channels=16, flow_wn_layers=1)  # hop 8, as the tiny voice's
    torch.manual_seed(0)
    acoustic, duration = tmp_path / "lite.safetensors", tmp_path / "duration.safetensors"
    save_student(LiteStudent(*build_lite_parts(teacher.hp, config).values()), config, acoustic, {"steps": 0})
    save_duration_student(NoiseAffineDurationPredictor.from_teacher(teacher.hp, teacher.parts()["duration"]),
                          duration, {"steps": 0})
    return acoustic, duration


def test_each_student_given_adds_the_variants_it_completes(bundle_and_inputs, students):
    bundle_dir, _ = bundle_and_inputs
    acoustic, duration = students
    assert set(gpu_bundle.engine_variants(bundle_dir, ())) == {"teacher", "fp16"}
    assert set(gpu_bundle.engine_variants(bundle_dir, (duration,))) == {"teacher", "fp16"}
    assert set(gpu_bundle.engine_variants(bundle_dir, (acoustic,))) == {"teacher", "fp16", "lite", "lite_fp16"}
    variants = gpu_bundle.engine_variants(bundle_dir, (duration, acoustic))  # in any order
    assert set(variants) == {"teacher", "fp16", "lite", "lite_fp16", "lite_dur_fp16"}
    model = variants["lite_dur_fp16"]()
    parts = model.parts()
    # Only the distilled duration predictor stays in float32; the acoustic parts run channels-last.
    assert isinstance(parts["duration"], NoiseAffineDurationPredictor)
    assert all(isinstance(parts[role], PrecisionIsland) and parts[role].dtype == torch.float16
               for role in ("encoder", "flow", "decoder"))
    layouts = {role: {m.layout for m in parts[role].modules() if isinstance(m, LayoutConv)} for role in parts}
    assert layouts == {"encoder": set(), "duration": set(), "flow": {"channels_last"}, "decoder": {"channels_last"}}
    assert variants["lite_dur_fp16"]() is not model  # a fresh copy per call: engines do not share modules
    # The Lite variants keep the teacher's duration predictor and their own layout.
    assert not any(isinstance(m, (LayoutConv, NoiseAffineDurationPredictor)) for m in variants["lite_fp16"]().modules())


def test_students_must_be_known_and_one_of_each_kind(bundle_and_inputs, students, tmp_path):
    bundle_dir, _ = bundle_and_inputs
    acoustic, _ = students
    with pytest.raises(ValueError, match="two acoustic students"):
        gpu_bundle.engine_variants(bundle_dir, (acoustic, acoustic))
    stranger = tmp_path / "stranger.safetensors"
    save_file({"w": torch.zeros(1)}, str(stranger))
    with pytest.raises(ValueError, match="neither a Lite student"):
        gpu_bundle.engine_variants(bundle_dir, (stranger,))


def test_the_report_names_the_students_it_was_given_by_content(bundle_and_inputs, students, tmp_path, monkeypatch):
    """What a merge into the pipeline's table checks a Lite row against (evaluate/gpu_results.py)."""
    acoustic, duration = students
    report = _run_on_cpu(monkeypatch, bundle_and_inputs, tmp_path / "engines.json",
                         "--student", str(acoustic), str(duration), "--only", "teacher/eager", "--rounds", "1")
    assert report["students_sha256"] == {"lite.safetensors": file_sha256(acoustic),
                                         "duration.safetensors": file_sha256(duration)}
    assert set(report["engines"]) == {"teacher/eager"}
