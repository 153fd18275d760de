"""A long run stopped part way resumes from the variants it finished (compress/evaluation_cache.py):
finished evaluations are reused only under the same code, settings, evaluation set, dependencies
and model; the reference's audio comes back whole; speed and memory measured on another processor
are not passed off as this one's; a damaged record is scored again, never trusted or fatal."""
from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
import torch

import compress.evaluation_cache as evaluation_cache
import compress.pipeline as pipeline
from compress.evaluation_cache import EvaluationCache, evaluation_key, with_file_digests
from compress.run_config import settings_from_config
from compress.stages import stage_settings_chain
from core.revision import code_tree_identity
from evaluate.runner import VariantEvaluation
from models.family import VariantMeasures
from models.registry import FAMILIES
from tests.conftest import compose_config

CONFIG = {"model": {"family": "piper", "voice": "bundled:joe"}, "data": {"eval_set": "harvard"},
          "evaluate": {"metrics": ["mcd"], "speed_rounds": 3, "gpu_results": None, "audio_samples": 3},
          "stages": {}, "export": {}, "variants": ["teacher"], "paths": {"root": "/somewhere"}}
PACKAGES = {"torch": "2.13.0"}
METRICS = {"rtf_cpu_b1": 0.1, "latency_first_audio_ms": 5.0, "rss_peak_mib": 900.0, "mcd_db": 0.3}


def _evaluation(utterances: int = 4) -> VariantEvaluation:
    generator = torch.Generator().manual_seed(0)
    waves = [torch.randn(100 + 10 * i, generator=generator) for i in range(utterances)]
    return VariantEvaluation(dict(METRICS), waves, 22050)


def _load(cache, variant, needed, evaluation=None, dependencies=None, **kwargs):
    """Load as the pipeline does, with a probe that speaks as ``evaluation`` spoke (default: _evaluation())."""
    first = (evaluation or _evaluation()).waveforms[0]
    kwargs.setdefault("utterances", 4)
    return cache.load(variant, dependencies or {}, needed_waveforms=needed, probe=lambda: first.clone(), **kwargs)


def test_the_key_follows_code_packages_settings_and_evaluation_set_but_not_speed_rounds_or_paths():
    base = evaluation_key(CONFIG, "set:1", "code:1", PACKAGES)
    assert evaluation_key(CONFIG, "set:1", "code:2", PACKAGES) != base
    assert evaluation_key(CONFIG, "set:2", "code:1", PACKAGES) != base
    assert evaluation_key(CONFIG, "set:1", "code:1", {"torch": "2.14.0"}) != base
    for section, change in (("evaluate", {"metrics": ["mcd", "wer"]}), ("model", {"voice": "other"}),
                            ("export", {"enabled": False})):
        changed = {**CONFIG, section: {**CONFIG[section], **change}}
        assert evaluation_key(changed, "set:1", "code:1", PACKAGES) != base, section
    unchanged = {**CONFIG, "variants": ["teacher", "fp16"], "paths": {"root": "/elsewhere"},
                 "evaluate": {**CONFIG["evaluate"], "speed_rounds": 5, "gpu_results": "/x.json", "audio_samples": 1},
                 "stages": {"fp16": {"dtype": "float16"}}}  # per variant instead: the record's dependencies
    assert evaluation_key(unchanged, "set:1", "code:1", PACKAGES) == base


def test_a_variant_depends_on_the_settings_of_the_stages_behind_it():
    config = {"stages": {"distil": {"checkpoint": "a.safetensors"}, "int8_ort": {"calibrator": "entropy"},
                         "prune": {"ratio": 0.5}}}
    assert stage_settings_chain("teacher", config) == {}
    assert stage_settings_chain("lite_ort", config) == {"distil": {"checkpoint": "a.safetensors"}}
    assert stage_settings_chain("lite_int8", config) == {"int8_ort": {"calibrator": "entropy"},
                                                         "distil": {"checkpoint": "a.safetensors"}}
    assert stage_settings_chain("pruned", config) == {"prune": {"ratio": 0.5}}


def test_other_dependencies_are_another_record(tmp_path):
    cache = EvaluationCache(tmp_path, "abc123")
    for dependencies in ({"stages": {"distil": {"checkpoint": "a"}}}, {"reference_audio": "digest-1"}):
        cache.save("lite", dependencies, _evaluation(), kept_waveforms=2)
        assert _load(cache, "lite", 2, dependencies=dependencies) is not None
    assert _load(cache, "lite", 2, dependencies={"stages": {"distil": {"checkpoint": "b"}}}) is None
    assert _load(cache, "lite", 2, dependencies={"reference_audio": "digest-2"}) is None  # the reference spoke anew


def test_a_checkpoint_counts_by_its_content_not_its_name(tmp_path):
    (tmp_path / "student.safetensors").write_bytes(b"weights one")
    settings = {"distil": {"checkpoint": "student.safetensors", "lr": 0.001, "missing": "nothing/here.pt"}}
    first = with_file_digests(settings, tmp_path)
    assert first["distil"]["checkpoint"]["sha256"] and first["distil"]["lr"] == 0.001
    assert first["distil"]["missing"] == "nothing/here.pt"
    (tmp_path / "student.safetensors").write_bytes(b"weights two")  # retrained under the same name
    assert with_file_digests(settings, tmp_path) != first


def test_a_file_is_hashed_once_per_run(tmp_path):
    (tmp_path / "student.safetensors").write_bytes(b"weights one")
    settings = {"distil": {"checkpoint": "student.safetensors"}, "lite_ort": {"from": "student.safetensors"}}
    known: dict = {}
    first = with_file_digests(settings, tmp_path, known)
    assert list(known) == [tmp_path / "student.safetensors"]
    assert first["distil"]["checkpoint"] == first["lite_ort"]["from"]
    # What the run already read is not read again: the digest the run started with holds for it.
    (tmp_path / "student.safetensors").write_bytes(b"weights two")
    assert with_file_digests(settings, tmp_path, known) == first
    assert with_file_digests(settings, tmp_path) != first  # a new run reads the file anew


def test_round_trip_keeps_the_reference_whole_and_samples_of_the_others(tmp_path):
    cache = EvaluationCache(tmp_path, "abc123")
    reference, other = _evaluation(), _evaluation()
    cache.save("teacher", {}, reference, kept_waveforms=None)
    cache.save("fp16", {}, other, kept_waveforms=2)

    back = _load(cache, "teacher", None)
    assert back.evaluation.metrics == reference.metrics and back.evaluation.sample_rate_hz == 22050
    assert back.origin.reused and back.origin.commit == "abc123" and not back.origin.speed_dropped
    assert len(back.evaluation.waveforms) == 4
    assert all(torch.equal(a, b) for a, b in zip(back.evaluation.waveforms, reference.waveforms))
    assert len(_load(cache, "fp16", 2).evaluation.waveforms) == 2
    assert _load(cache, "fp16", None) is None  # only samples were kept: it cannot serve as a reference
    assert _load(cache, "fp16", 3) is None
    assert _load(cache, "fp16", 2, utterances=5) is None  # the run's frontend made another evaluation set
    assert _load(cache, "int8_ort", 2) is None


def test_a_model_that_no_longer_speaks_as_its_record_is_scored_again(tmp_path):
    cache = EvaluationCache(tmp_path, "abc123")
    evaluation = _evaluation()
    cache.save("teacher", {}, evaluation, kept_waveforms=None)
    first = evaluation.waveforms[0]
    assert cache.load("teacher", {}, utterances=4, needed_waveforms=None,
                      probe=lambda: first + 1e-5 * torch.randn_like(first)) is not None  # rounding: same model
    assert cache.load("teacher", {}, utterances=4, needed_waveforms=None,
                      probe=lambda: first + 0.05 * torch.randn_like(first)) is None  # another voice file, say
    assert cache.load("teacher", {}, utterances=4, needed_waveforms=None, probe=lambda: first[:-1]) is None


def test_damaged_or_unfinished_records_are_scored_again(tmp_path):
    cache = EvaluationCache(tmp_path, "abc123")
    cache.save("teacher", {}, _evaluation(), kept_waveforms=None)
    record = next(tmp_path.glob("teacher-*.json"))
    audio = next(tmp_path.glob("teacher-*.npz"))
    text = record.read_text()
    for damage in ("", "{not json", json.dumps({**json.loads(text), "format": 1}),
                   json.dumps({k: v for k, v in json.loads(text).items() if k != "metrics"})):
        record.write_text(damage)
        assert _load(cache, "teacher", None) is None
    record.write_text(text)
    audio.write_bytes(b"PK\x03\x04 cut short")
    assert _load(cache, "teacher", None) is None
    audio.unlink()  # stopped between the audio and the record (the audio goes first; here, the other way)
    assert _load(cache, "teacher", None) is None


def test_a_failed_save_does_not_stop_the_run(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    EvaluationCache(blocker / "cache", "abc123").save("teacher", {}, _evaluation(), kept_waveforms=None)
    assert "could not keep teacher's evaluation" in caplog.text


def test_speed_and_memory_from_another_processor_are_dropped(tmp_path, monkeypatch):
    cache = EvaluationCache(tmp_path, "abc123")
    cache.save("teacher", {}, _evaluation(), kept_waveforms=None)
    same = _load(cache, "teacher", None)
    assert same.evaluation.metrics == METRICS and "another processor" not in same.origin.describe()
    monkeypatch.setattr(evaluation_cache, "cpu_model", lambda: "Some Other CPU")
    moved = _load(cache, "teacher", None)
    assert moved.evaluation.metrics == {"mcd_db": 0.3}
    assert moved.origin.speed_dropped and "another processor" in moved.origin.describe()
    # A run without interleaved rounds would have no speed at all for it: not reused there.
    assert _load(cache, "teacher", None, same_processor_only=True) is None


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
            "evaluate.metrics=[mcd]", "evaluate.speed_rounds=0", "evaluate.audio_samples=1",
            "stages.fp16.measure_sentences=1", "selection.constraints=[]", "export.enabled=false"]


def test_a_rerun_reuses_finished_variants_and_scores_only_the_new_ones(tmp_path, monkeypatch):
    emotivoice = FAMILIES["emotivoice"]
    monkeypatch.setitem(FAMILIES, "emotivoice", dataclasses.replace(
        emotivoice, load_teacher=lambda voice, cache_dir: emotivoice.tiny_model(0)))
    # The checkout under test may have uncommitted changes; the code's identity is fixed here.
    monkeypatch.setattr(evaluation_cache, "code_tree_identity", lambda root, pathspecs: "code:test")
    evaluated: list[str] = []
    evaluate_variant = pipeline.evaluate_variant

    def counting(variant, *args, **kwargs):
        evaluated.append(variant.name)
        return evaluate_variant(variant, *args, **kwargs)

    monkeypatch.setattr(pipeline, "evaluate_variant", counting)
    first_config = compose_config(tmp_path, [*TINY_RUN[:2], "variants=[teacher]", *TINY_RUN[3:]])
    first = pipeline.run(settings_from_config(first_config), first_config)
    assert evaluated == ["teacher"]

    # The same command with one more variant: the teacher comes back from disk (all its audio: fp16
    # is scored against it), fp16 is scored, as in an uninterrupted run.
    resolved = compose_config(tmp_path, TINY_RUN)
    rows = pipeline.run(settings_from_config(resolved), resolved)
    assert evaluated == ["teacher", "fp16"]
    assert rows["teacher"] == first["teacher"]
    origins = json.loads((tmp_path / "run" / "evaluation_origins.json").read_text(encoding="utf-8"))
    assert origins["fp16"]["reused"] is False and origins["teacher"]["reused"] is True
    # Another fp16 setting: fp16 is scored again, the teacher is still reused.
    changed = compose_config(tmp_path, [*TINY_RUN, "stages.fp16.measure_sentences=2"])
    pipeline.run(settings_from_config(changed), changed)
    assert evaluated == ["teacher", "fp16", "fp16"]
    evaluated.clear()
    monkeypatch.setattr(evaluation_cache, "code_tree_identity", lambda root, pathspecs: None)
    fresh = compose_config(tmp_path, TINY_RUN)  # the same outputs, which hold both records
    uninterrupted = pipeline.run(settings_from_config(fresh), fresh)
    assert evaluated == ["teacher", "fp16"]  # uncommitted code: nothing reused
    assert rows["fp16"]["mcd_db"] == pytest.approx(uninterrupted["fp16"]["mcd_db"], rel=1e-6)


def test_families_with_their_own_measures_are_not_cached(tmp_path, monkeypatch, capsys):
    emotivoice = FAMILIES["emotivoice"]
    monkeypatch.setitem(FAMILIES, "emotivoice", dataclasses.replace(
        emotivoice, load_teacher=lambda voice, cache_dir: emotivoice.tiny_model(0),
        measure_variant=lambda *args: VariantMeasures(metrics={}, reference=None)))
    monkeypatch.setattr(evaluation_cache, "code_tree_identity", lambda root, pathspecs: "code:test")
    resolved = compose_config(tmp_path, [*TINY_RUN[:2], "variants=[teacher]", *TINY_RUN[3:]])
    pipeline.run(settings_from_config(resolved), resolved)
    assert "the family's own measures are not cached" in capsys.readouterr().out
    assert not (tmp_path / "outputs" / "evaluations").exists()


def test_a_run_stopped_part_way_says_where_its_finished_rows_came_from(tmp_path, monkeypatch):
    emotivoice = FAMILIES["emotivoice"]
    monkeypatch.setitem(FAMILIES, "emotivoice", dataclasses.replace(
        emotivoice, load_teacher=lambda voice, cache_dir: emotivoice.tiny_model(0)))
    monkeypatch.setattr(evaluation_cache, "code_tree_identity", lambda root, pathspecs: "code:test")
    evaluate_variant = pipeline.evaluate_variant

    def failing_after_the_teacher(variant, *args, **kwargs):
        if variant.name != "teacher":
            raise RuntimeError("stopped")
        return evaluate_variant(variant, *args, **kwargs)

    monkeypatch.setattr(pipeline, "evaluate_variant", failing_after_the_teacher)
    resolved = compose_config(tmp_path, TINY_RUN)
    with pytest.raises(RuntimeError, match="stopped"):
        pipeline.run(settings_from_config(resolved), resolved)
    origins = json.loads((tmp_path / "run" / "evaluation_origins.json").read_text(encoding="utf-8"))
    assert list(origins) == ["teacher"] and origins["teacher"]["reused"] is False
