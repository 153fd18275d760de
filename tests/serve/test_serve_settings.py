"""`python -m serve` settings and model source: bad keys fail at start; the champion manifest loads.

    python -m pytest -q tests/test_serve_settings.py
"""
from __future__ import annotations

import json

import onnx
import pytest

from core.config import ConfigError
from export.manifest import DeploymentManifest, ManifestError, write_manifest
from models.dynamic_int8 import DynamicInt8Linear
from models.piper.onnx_runtime import prepare_graph
from models.piper.voice_files import PiperVoiceFiles
from serve.engines import load_served_model
from serve.settings import serve_settings_from_config
from serve_support import serve_settings
from conftest import compose_config


@pytest.mark.parametrize("override, error, message", [
    ("+serve.gpus=4", ConfigError, r"serve: unknown keys \['gpus'\]"),
    ("serve.workers=0", ValueError, "serve.workers=0"),
    ("serve.voice=/voices/joe.safetensors", ValueError, "has no ONNX graph for original_onnx"),
    ("serve.torch_engine=tensorrt", ValueError, "serve.torch_engine='tensorrt'"),
    ("serve.source=int8_ort", ValueError, "serve.source='int8_ort'"),
    ("serve.length_buckets=[128,64]", ValueError, "serve.length_buckets"),
    ("serve.max_batch_size=0", ValueError, "serve.max_batch_size=0"),
    ("serve.max_batch_phonemes=0", ValueError, "serve.max_batch_phonemes=0"),
    ("serve.streaming=tokens", ValueError, "serve.streaming='tokens'"),
    ("serve.api_key=short", ValueError, "serve.api_key: use null"),
    ("serve.max_sentence_chars=0", ValueError, "max_sentence_chars"),
    ("+serve.engine_options.frame_groups=4", ValueError, "family piper has no engine settings"),
    ("serve.engine_options=8", ValueError, r"use a mapping of the family's engine settings \(piper's: \[\]\)"),
    ("serve.warmup_length_scales=[]", ValueError, "serve.warmup_length_scales"),
    ("serve.warmup_length_scales=[1.0,0]", ValueError, "give one or more paces > 0"),
    ("serve.gc_full_collection_after=0", ValueError, "serve.gc_full_collection_after=0: must be >= 1"),
    ("serve.gc_full_collection_after=true", ValueError, "serve.gc_full_collection_after=True: use a whole number"),
])
def test_bad_serve_config_fails_at_start(tmp_path, override, error, message):
    with pytest.raises(error, match=message):
        serve_settings(tmp_path, override)


def test_api_key_is_never_echoed(tmp_path):
    with pytest.raises(ValueError) as failure:
        serve_settings(tmp_path, "serve.api_key=abc")
    assert "abc" not in str(failure.value)


def test_champion_manifest_is_served(tmp_path):
    graph_path = tmp_path / "champion" / "joe_prepared.onnx"
    graph_path.parent.mkdir()
    onnx.save(prepare_graph(PiperVoiceFiles.resolve("bundled:joe").onnx_path), str(graph_path))
    manifest_path = graph_path.parent / "manifest.json"
    write_manifest(manifest_path, DeploymentManifest(variant="lite_int8", engine="onnxruntime", family="piper",
                                                     voice="bundled:joe", graph=graph_path.name,
                                                     sample_rate_hz=22050))
    served = load_served_model(serve_settings(tmp_path, "serve.source=champion",
                                              f"serve.manifest_path={manifest_path}"))
    assert (served.model_id, served.engine, served.voice_name) == ("lite_int8", "onnxruntime", "joe")
    assert served.model.graph_path == graph_path and served.note.startswith("champion from")

    raw = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**raw, "engine": "tensorrt"}))
    with pytest.raises(ManifestError, match="engine 'tensorrt'"):  # a broken manifest stops the server
        load_served_model(serve_settings(tmp_path, "serve.source=champion", f"serve.manifest_path={manifest_path}"))


def test_no_manifest_falls_back_to_the_named_variant(tmp_path):
    served = load_served_model(serve_settings(tmp_path, "serve.source=champion",
                                              f"serve.manifest_path={tmp_path / 'none' / 'manifest.json'}"))
    assert served.model_id == "original_onnx" and "no champion manifest" in served.note


def test_half_precision_source_serves_the_fp16_variant(tmp_path):
    """serve.source=fp16 builds the variant the fp16 stage builds (the stage's keep_fp32), so the
    champion of a run with GPU figures can be served on the torch engines."""
    import torch

    from models.interface import SynthesisRequest
    from models.sampling import VitsSampling
    from models.piper.voice import PiperVoice
    from models.precision import PrecisionIsland, waveform_snr_db

    settings = serve_settings(tmp_path, "serve.source=fp16")
    assert settings.half_keep_fp32 == ("encoder", "duration")  # conf/stages/default.yaml's fp16.keep_fp32
    served = load_served_model(settings)
    assert (served.model_id, served.engine) == ("fp16", "torch")
    parts = served.model.parts()
    assert isinstance(parts["decoder"], PrecisionIsland) and parts["decoder"].dtype == torch.float16
    assert not isinstance(parts["encoder"], PrecisionIsland) and not isinstance(parts["duration"], PrecisionIsland)
    sequences = served.model.text_to_utterances("Glue the sheet to the dark blue background.")
    request = SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(seed=3))
    half, full = served.model.synthesize(request), PiperVoice.load("bundled:joe").synthesize(request)
    assert torch.equal(half.durations, full.durations)  # the parts that set durations stay float32
    assert waveform_snr_db(half.waveforms()[0], full.waveforms()[0]) > 30.0  # 41.5 dB measured


def test_half_precision_source_names_an_unknown_part(tmp_path):
    with pytest.raises(ValueError, match=r"keep_fp32 names unknown parts \['vocoder'\]"):
        load_served_model(serve_settings(tmp_path, "serve.source=bf16", "serve.half_keep_fp32=[vocoder]"))


@pytest.mark.parametrize("override, message", [
    ("+serve.engine_options.groups=4", r"serve.engine_options: unknown keys \['groups'\]"),
    ("+serve.engine_options.frame_groups=0", r"serve.engine_options.frame_groups=0: use a whole number >= 1"),
    ("+serve.engine_options.min_group_rows=1.5", r"serve.engine_options.min_group_rows=1.5"),
    ("+serve.engine_options.compile_dynamic=maybe", r"serve.engine_options.compile_dynamic='maybe': use true or false"),
])
def test_a_family_engine_setting_it_does_not_have_or_refuses_fails_at_start(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        serve_settings(tmp_path, "model=emotivoice", override)


def test_a_family_engine_setting_reaches_its_dataclass(tmp_path):
    settings = serve_settings(tmp_path, "model=emotivoice", "+serve.engine_options.frame_groups=32",
                              "+serve.engine_options.min_group_rows=32")
    options = settings.family_engine_options()
    assert (type(options).__name__, options.frame_groups, options.min_group_rows) == ("ServedEngineOptions", 32, 32)
    assert type(settings).from_json(settings.to_json()).family_engine_options() == options  # as workers read them


def test_the_measured_emotivoice_gpu_preset_composes_into_valid_settings(tmp_path):
    """conf/serve/emotivoice_gpu.yaml: default.yaml's keys with the served configuration docs/benchmarks.md
    measured (session 50), checked like any command line, its engine options read as EmotiVoice's dataclass."""
    settings = serve_settings_from_config(compose_config(tmp_path, ["model=emotivoice", "serve=emotivoice_gpu",
                                                                    "serve.source=teacher"]))
    assert (settings.device, settings.torch_engine, settings.workers, settings.gpu_sharing) == ("cuda", "compile", 2,
                                                                                              "mps")
    assert (settings.max_batch_size, settings.max_batch_phonemes, settings.batches_in_flight) == (1024, 65536, 2)
    assert (settings.queue_capacity, settings.max_requests_per_client, settings.length_buckets) == (1024, 1024, (64,))
    assert (settings.max_wait_ms, settings.warmup_length_scales) == (0, (1.0,))
    options = settings.family_engine_options()
    assert (options.frame_groups, options.min_group_rows, options.frame_bucket) == (32, 32, 8)
    assert options.compile_dynamic and options.fill_frame_shapes
    assert not settings.access_log
    assert settings.speaker_cache_entries == 1024  # a default.yaml key it does not set


def test_int8_dynamic_settings_come_from_the_family_stage_defaults(tmp_path):
    settings = serve_settings(tmp_path, "model=emotivoice", "serve.source=int8_dynamic")
    assert (settings.int8_parts, settings.int8_keep_float) == (("style_encoder",), ())  # conf/stages/family/emotivoice.yaml
    assert serve_settings(tmp_path, "model=gpt_sovits_v2", "serve.source=teacher").int8_keep_float == ("ar_predict_layer",)
    with pytest.raises(ValueError, match="serve.int8_parts=\\(\\): int8_dynamic needs the parts"):
        serve_settings(tmp_path, "serve.source=int8_dynamic")  # Piper's stage defaults name none
    with pytest.raises(ValueError, match="int8_dynamic runs eager on torch's CPU kernels"):
        serve_settings(tmp_path, "model=emotivoice", "serve.source=int8_dynamic", "serve.torch_engine=compile")


def test_a_rebuilt_champion_is_the_variant_its_stage_scored(tmp_path, monkeypatch):
    """A manifest with engine "torch" (a family without a runtime for exported graphs) is served as the
    teacher rebuilt by its recipe: here int8_dynamic of a tiny EmotiVoice, whose weights equal those of
    the variant the int8_dynamic stage builds, Linear layers int8 only in the recipe's part."""
    import dataclasses

    import torch

    from compress.int8_dynamic import Int8DynamicSettings, build
    from compress.variants import StageContext, Variant
    from models.emotivoice.tiny import tiny_voice
    from models.interface import SynthesisRequest
    from models.precision import waveform_snr_db
    from models.registry import FAMILIES
    from models.sampling import Sampling

    tiny = dataclasses.replace(FAMILIES["emotivoice"], load_teacher=lambda voice, cache_dir: tiny_voice(0))
    monkeypatch.setitem(FAMILIES, "emotivoice", tiny)
    manifest_path = tmp_path / "champion" / "manifest.json"
    manifest_path.parent.mkdir()
    write_manifest(manifest_path, DeploymentManifest(variant="int8_dynamic", engine="torch", family="emotivoice",
                                                     voice="checkpoint=None;style_encoder=None;data_dir=None", sample_rate_hz=tiny_voice(0).sample_rate_hz,
                                                     recipe={"parts": ["style_encoder"], "keep_float": []}))
    served = load_served_model(serve_settings(tmp_path, "model=emotivoice", "serve.source=champion",
                                              f"serve.manifest_path={manifest_path}"))
    assert (served.model_id, served.engine) == ("int8_dynamic", "torch") and "rebuilt from the teacher" in served.note
    assert served.voice_name == "random"  # not the files string "checkpoint=None;style_encoder=None;..."
    named = dataclasses.replace(served, voice="checkpoint=/ckpt/g_00140000;style_encoder=None")
    assert named.voice_name == "g_00140000"
    parts = served.model.parts()
    assert any(isinstance(m, DynamicInt8Linear) for m in parts["style_encoder"].modules())
    assert not any(isinstance(m, DynamicInt8Linear) for role, part in parts.items() if role != "style_encoder"
                   for m in part.modules())

    teacher = tiny_voice(0)
    by_stage = build(Variant("teacher", teacher, "torch", "cpu", 0.0, 0.0), Int8DynamicSettings(parts=["style_encoder"]),
                     StageContext([], tmp_path / "stage", 1, tmp_path / "cache", tiny, "random"))
    by_hand = by_stage.model
    served_state, expected_state = served.model.state_dict(), by_hand.state_dict()
    assert served_state.keys() == expected_state.keys()
    for name, expected in expected_state.items():  # the int8 weights, scales and float tensors, exactly
        assert torch.equal(served_state[name], expected), name
    request = SynthesisRequest.from_utterances(by_hand.text_to_utterances("The birch canoe slid."),
                                               sampling=Sampling(seed=1))
    served_result, expected_result = served.model.synthesize(request), by_hand.synthesize(request)
    assert torch.equal(served_result.durations, expected_result.durations)
    # Equal tensors, yet the two models' audio differed by up to 1.4e-5 (peak 0.1) in one run; not traced
    # to a kernel, so the check is on the signal-to-noise ratio.
    assert waveform_snr_db(served_result.waveforms()[0], expected_result.waveforms()[0]) > 50.0


def test_an_autoregressive_family_serves_int8_dynamic_by_token_steps(tmp_path, monkeypatch):
    """GPT-SoVITS's int8_dynamic served: the step decoder's engine runs the voice's int8 layers, and
    a greedy sentence speaks the tokens of the voice the int8_dynamic stage builds."""
    import dataclasses

    import torch

    from compress.int8_dynamic import Int8DynamicSettings, build
    from compress.variants import StageContext, Variant
    from models.gpt_sovits.capabilities import GptSovitsSampling
    from models.gpt_sovits.tiny import tiny_voice
    from models.interface import SynthesisRequest
    from models.registry import FAMILIES

    family = dataclasses.replace(FAMILIES["gpt_sovits_v2"], load_teacher=lambda voice, cache_dir: tiny_voice(0))
    monkeypatch.setitem(FAMILIES, "gpt_sovits_v2", family)
    served = load_served_model(serve_settings(tmp_path, "model=gpt_sovits_v2", "serve.source=int8_dynamic"))
    assert (served.model_id, served.engine) == ("int8_dynamic", "torch")
    decoder = served.model.step_decoder(max_rows=2)
    assert "h.layers.0.linear1" in decoder.engine.weights.int8_projections
    assert "ar_predict_layer" not in decoder.engine.weights.int8_projections  # the family's keep_float

    by_stage = build(Variant("teacher", tiny_voice(0), "torch", "cpu", 0.0, 0.0),
                     Int8DynamicSettings(parts=["t2s"], keep_float=["ar_predict_layer"]),
                     StageContext([], tmp_path / "stage", 1, tmp_path / "cache", family, "random")).model
    sampling = GptSovitsSampling.deterministic(max_tokens=24)
    request = SynthesisRequest.from_utterances(by_stage.text_to_utterances("Where did Kenji leave his lantern?"),
                                               sampling=sampling)
    decoder.join("a", request)
    finished = []
    while decoder.active:
        finished += decoder.step()
    (key, result), = finished
    expected = by_stage.synthesize(request)
    assert key == "a" and torch.equal(result.tokens, expected.tokens)


def test_a_champion_source_falling_back_to_int8_dynamic_is_checked_and_built(tmp_path, monkeypatch):
    import dataclasses

    from models.emotivoice.tiny import tiny_voice
    from models.registry import FAMILIES

    with pytest.raises(ValueError, match="int8_dynamic needs the parts"):  # Piper's stage defaults name none
        serve_settings(tmp_path, "serve.source=champion", "serve.fallback_variant=int8_dynamic")
    monkeypatch.setitem(FAMILIES, "emotivoice", dataclasses.replace(
        FAMILIES["emotivoice"], load_teacher=lambda voice, cache_dir: tiny_voice(0)))
    served = load_served_model(serve_settings(tmp_path, "model=emotivoice", "serve.source=champion",
                                              f"serve.manifest_path={tmp_path / 'none.json'}",
                                              "serve.fallback_variant=int8_dynamic"))
    assert served.model_id == "int8_dynamic" and "no champion manifest" in served.note
    assert any(isinstance(m, DynamicInt8Linear) for m in served.model.parts()["style_encoder"].modules())


def test_cpu_model_threads_run_torch_with_the_configured_thread_count(tmp_path):
    """OpenMP's thread count is per calling thread: the model threads set theirs when they start,
    and the main thread keeps its own."""
    import torch

    from serve.app import model_threads

    main_threads = torch.get_num_threads()
    wanted = main_threads + 2
    executor = model_threads(serve_settings(tmp_path, f"serve.torch_threads={wanted}"))
    try:
        assert executor.submit(torch.get_num_threads).result() == wanted
        assert torch.get_num_threads() == main_threads
    finally:
        executor.shutdown()
        torch.set_num_threads(main_threads)  # torch keeps the last count as later threads' default
    gpu = model_threads(serve_settings(tmp_path, f"serve.torch_threads={wanted}", "serve.device=cuda"))
    try:
        assert gpu.submit(torch.get_num_threads).result() == main_threads  # a GPU device leaves torch's count alone
    finally:
        gpu.shutdown()
    with pytest.raises(ConfigError, match="torch_threads"):
        serve_settings(tmp_path, "serve.torch_threads=0")
