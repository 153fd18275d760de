"""A long run stopped part way resumes from the variants it finished (compress/evaluation_cache.py):
finished evaluations are reused only under the same code, settings and sentences, the reference's
audio comes back whole, and speed measured on another processor is not passed off as this one's."""
from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
import torch

import compress.evaluation_cache as evaluation_cache
import compress.pipeline as pipeline
from compress.evaluation_cache import EvaluationCache, evaluation_key
from compress.pipeline import stage_settings_chain
from compress.run_config import settings_from_config
from core.revision import code_tree_identity
from evaluate.runner import VariantEvaluation
from models.registry import FAMILIES
from tests.conftest import compose_config

CONFIG = {"model": {"family": "piper", "voice": "bundled:joe"}, "data": {"eval_set": "harvard"},
          "evaluate": {"metrics": ["mcd"], "speed_rounds": 3, "gpu_results": None}, "stages": {}, "export": {},
          "variants": ["teacher"], "paths": {"root": "/somewhere"}}


def _evaluation(utterances: int = 4) -> VariantEvaluation:
    generator = torch.Generator().manual_seed(0)
    waves = [torch.randn(100 + 10 * i, generator=generator) for i in range(utterances)]
    return VariantEvaluation({"rtf_cpu_b1": 0.1, "latency_first_audio_ms": 5.0, "mcd_db": 0.3}, waves, 22050)


def test_the_key_follows_code_settings_and_sentences_but_not_speed_rounds_or_paths():
    base = evaluation_key(CONFIG, ["a.", "b."], "code:1")
    assert evaluation_key(CONFIG, ["a.", "b."], "code:2") != base
    assert evaluation_key(CONFIG, ["a."], "code:1") != base
    for section, change in (("evaluate", {"metrics": ["mcd", "wer"]}), ("model", {"voice": "other"}),
                            ("export", {"enabled": False})):
        changed = {**CONFIG, section: {**CONFIG[section], **change}}
        assert evaluation_key(changed, ["a.", "b."], "code:1") != base, section
    unchanged = {**CONFIG, "variants": ["teacher", "fp16"], "paths": {"root": "/elsewhere"},
                 "evaluate": {**CONFIG["evaluate"], "speed_rounds": 5, "gpu_results": "/x.json"},
                 "stages": {"fp16": {"dtype": "float16"}}}  # per variant instead: stage_settings_chain
    assert evaluation_key(unchanged, ["a.", "b."], "code:1") == base


def test_a_variant_is_keyed_by_the_settings_of_the_stages_behind_it():
    config = {"stages": {"distil": {"checkpoint": "a.safetensors"}, "int8_ort": {"calibrator": "entropy"},
                         "prune": {"ratio": 0.5}}}
    assert stage_settings_chain("teacher", config) == {}
    assert stage_settings_chain("lite_ort", config) == {"distil": {"checkpoint": "a.safetensors"}}
    assert stage_settings_chain("lite_int8", config) == {"int8_ort": {"calibrator": "entropy"},
                                                         "distil": {"checkpoint": "a.safetensors"}}
    assert stage_settings_chain("pruned", config) == {"prune": {"ratio": 0.5}}


def test_other_stage_settings_are_another_record(tmp_path):
    cache = EvaluationCache(tmp_path, "abc123")
    cache.save("lite", {"distil": {"checkpoint": "a"}}, _evaluation(), keep_waveforms=2)
    assert cache.load("lite", {"distil": {"checkpoint": "a"}}, 2) is not None
    assert cache.load("lite", {"distil": {"checkpoint": "b"}}, 2) is None


def test_a_checkpoint_counts_by_its_content_not_its_name(tmp_path):
    (tmp_path / "student.safetensors").write_bytes(b"weights one")
    cache = EvaluationCache(tmp_path / "cache", "abc123", root=tmp_path)
    settings = {"distil": {"checkpoint": "student.safetensors", "lr": 0.001}}
    cache.save("lite", settings, _evaluation(), keep_waveforms=2)
    assert cache.load("lite", settings, 2) is not None
    (tmp_path / "student.safetensors").write_bytes(b"weights two")  # retrained under the same name
    assert cache.load("lite", settings, 2) is None


def test_round_trip_keeps_the_reference_whole_and_samples_of_the_others(tmp_path):
    cache = EvaluationCache(tmp_path, "abc123")
    reference, other = _evaluation(), _evaluation()
    cache.save("teacher", {}, reference, keep_waveforms=None)
    cache.save("fp16", {}, other, keep_waveforms=2)

    back = cache.load("teacher", {}, None).evaluation
    assert back.metrics == reference.metrics and back.sample_rate_hz == 22050
    assert len(back.waveforms) == 4
    assert all(torch.equal(a, b) for a, b in zip(back.waveforms, reference.waveforms))
    assert len(cache.load("fp16", {}, 2).evaluation.waveforms) == 2
    assert cache.load("fp16", {}, None) is None  # only samples were kept: it cannot serve as a reference
    assert cache.load("fp16", {}, 3) is None
    assert cache.load("int8_ort", {}, 2) is None


def test_an_unfinished_record_is_not_reused(tmp_path):
    cache = EvaluationCache(tmp_path, "abc123")
    cache.save("teacher", {}, _evaluation(), keep_waveforms=None)
    next(tmp_path.glob("teacher-*.json")).unlink()  # stopped between the audio and the record
    assert cache.load("teacher", {}, None) is None


def test_speed_from_another_processor_is_dropped(tmp_path, monkeypatch):
    cache = EvaluationCache(tmp_path, "abc123")
    cache.save("teacher", {}, _evaluation(), keep_waveforms=None)
    same = cache.load("teacher", {}, None)
    assert same.evaluation.metrics["rtf_cpu_b1"] == 0.1 and "another processor" not in same.origin
    monkeypatch.setattr(evaluation_cache, "cpu_model", lambda: "Some Other CPU")
    moved = cache.load("teacher", {}, None)
    assert moved.evaluation.metrics == {"mcd_db": 0.3}
    assert "another processor" in moved.origin


def test_code_identity_is_none_while_a_code_folder_has_changes(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    def commit(message):
        git("add", ".")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)

    code = ("models", ":(exclude)models/checkpoints")
    git("init", "-q")
    (tmp_path / "models" / "checkpoints").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "models" / "a.py").write_text("x = 1\n")
    (tmp_path / "models" / "checkpoints" / "state.bin").write_text("step 1\n")
    (tmp_path / "docs" / "a.md").write_text("text\n")
    commit("one")
    first = code_tree_identity(tmp_path, code)
    assert first is not None and len(first) == 64
    (tmp_path / "docs" / "a.md").write_text("other text\n")  # outside the code folders
    (tmp_path / "models" / "checkpoints" / "state.bin").write_text("step 2\n")  # data, not code
    assert code_tree_identity(tmp_path, code) == first
    commit("two")
    assert code_tree_identity(tmp_path, code) == first
    (tmp_path / "models" / "b.py").write_text("y = 2\n")  # untracked code counts
    assert code_tree_identity(tmp_path, code) is None
    commit("three")
    assert code_tree_identity(tmp_path, code) not in (None, first)
    assert code_tree_identity(tmp_path / "models", ("nothing-here",)) is None


# EmotiVoice on its tiny random weights: a run of the whole pipeline in seconds.
TINY_RUN = ["model=emotivoice", "+debug=default", "variants=[teacher,fp16]", "data.max_eval_sentences=2",
            "evaluate.metrics=[mcd]", "evaluate.speed_rounds=0", "stages.fp16.measure_sentences=1",
            "selection.constraints=[]", "export.enabled=false"]


def test_a_rerun_reuses_finished_variants_and_scores_only_the_new_ones(tmp_path, monkeypatch):
    emotivoice = FAMILIES["emotivoice"]
    monkeypatch.setitem(FAMILIES, "emotivoice", dataclasses.replace(
        emotivoice, load_teacher=lambda voice, cache_dir: emotivoice.tiny_model(0)))
    # The checkout under test may have uncommitted changes; the code's identity is fixed here.
    monkeypatch.setattr(evaluation_cache, "code_tree_identity", lambda root, folders: "code:test")
    evaluated: list[str] = []
    evaluate_variant = pipeline.evaluate_variant

    def counting(variant, *args, **kwargs):
        evaluated.append(variant.name)
        return evaluate_variant(variant, *args, **kwargs)

    monkeypatch.setattr(pipeline, "evaluate_variant", counting)
    first_config = compose_config(tmp_path, [*TINY_RUN[:2], "variants=[teacher]", *TINY_RUN[3:]])
    first = pipeline.run(settings_from_config(first_config), first_config)
    assert evaluated == ["teacher"]

    # The same command with one more variant: the teacher comes back from disk, fp16 is scored
    # against the teacher's kept audio, as in an uninterrupted run.
    resolved = compose_config(tmp_path, TINY_RUN)
    rows = pipeline.run(settings_from_config(resolved), resolved)
    assert evaluated == ["teacher", "fp16"]
    assert rows["teacher"] == first["teacher"]
    origins = json.loads((tmp_path / "run" / "evaluation_origins.json").read_text(encoding="utf-8"))
    assert origins["fp16"] == "this run" and origins["teacher"].startswith("reused: measured ")
    # Another fp16 setting: fp16 is scored again, the teacher is still reused.
    changed = compose_config(tmp_path, [*TINY_RUN, "stages.fp16.measure_sentences=2"])
    pipeline.run(settings_from_config(changed), changed)
    assert evaluated == ["teacher", "fp16", "fp16"]
    evaluated.clear()
    monkeypatch.setattr(evaluation_cache, "code_tree_identity", lambda root, folders: None)
    fresh = compose_config(tmp_path, TINY_RUN)  # the same outputs, which hold both records
    uninterrupted = pipeline.run(settings_from_config(fresh), fresh)
    assert evaluated == ["teacher", "fp16"]  # uncommitted code: nothing reused
    assert rows["fp16"]["mcd_db"] == pytest.approx(uninterrupted["fp16"]["mcd_db"], rel=1e-6)
