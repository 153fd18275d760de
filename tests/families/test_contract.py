"""What every registered family promises, on tiny random weights (seconds, not a real voice).

A new family joins by being registered in models/registry.py: every test here runs for it.
"""
from __future__ import annotations

import dataclasses
import io
import json
import time

import numpy as np
import onnxruntime as ort
import pytest
import soundfile
import torch
from fastapi.testclient import TestClient

from conftest import compose_config
from core.config import build_dataclass
from models.graph_contract import SYNTHESIZER
from models.interface import SynthesisRequest, TTSModel, UnspeakableTextError, VoiceCondition
from models.registry import FAMILIES
from models.text.sanitize import UnsafeTextError
from models.voice_spec import RANDOM
from serve.app import create_app
from serve.engines import served_as_is
from serve.settings import serve_settings_from_config

SENTENCES = "The quick brown fox jumps. Where did Kenji leave his lantern?"


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def model(family):
    torch.set_num_threads(1)
    return family.tiny_model(0)


def test_a_default_voice_of_random_weights_says_its_quality_means_nothing(family):
    """Results tables lead with the family's note when the voice is full-size random weights."""
    if family.default_voice != RANDOM:
        return  # a real voice ships with the family (Piper's joe, Kokoro's jf_alpha)
    note = family.weights_note(family.default_voice) if family.weights_note else None
    assert note and "random weights" in note, f"family {family.name!r}: no weights_note for its random default voice"


def test_tiny_model_implements_the_interface(family, model):
    assert isinstance(model, TTSModel)
    assert model.family == family.name
    assert model.capabilities == family.capabilities
    assert model.sampling_type is family.sampling_type
    assert tuple(model.parts()) == family.part_roles


def test_engine_settings_are_a_frozen_dataclass_with_defaults(family):
    """serve.engine_options fills it by name from an empty mapping up, and worker processes rebuild it from
    the settings' JSON: it must build from nothing and survive that round trip."""
    if family.engine_options is None:
        pytest.skip(f"{family.name}'s engine has no settings")
    assert family.torch_engine is not None, "engine settings without a bucketed engine to read them"
    assert dataclasses.is_dataclass(family.engine_options) and family.engine_options.__dataclass_params__.frozen
    defaults = build_dataclass(family.engine_options, {}, "serve.engine_options")
    assert defaults == family.engine_options()
    as_json = json.loads(json.dumps(dataclasses.asdict(defaults)))
    assert build_dataclass(family.engine_options, as_json, "serve.engine_options") == defaults


def test_frontend_splits_sentences_and_refuses_empty_text(model):
    utterances = model.text_to_utterances(SENTENCES)
    assert len(utterances) == 2
    assert all(len(u.phoneme_ids) > 2 and len(u.phonemes) > 0 for u in utterances)
    with pytest.raises(UnspeakableTextError):
        model.text_to_utterances("   ")


@pytest.mark.parametrize("text, codepoint, position", [
    ("The fox \u0000 jumps.", "U+0000", 8),  # espeak-ng would stop at the NUL: "The fox" alone
    ("Hello\u0007 world.", "U+0007", 5),
    ("Where did \u202eKenji go?", "U+202E", 10),
])
def test_frontend_refuses_control_characters_instead_of_cutting(model, text, codepoint, position):
    """The text that reaches a family's model is the text that was sent (models/text/sanitize.py),
    whether it comes through the server or straight to the model."""
    with pytest.raises(UnsafeTextError) as refused:
        model.text_to_utterances(text)
    assert (refused.value.codepoint, refused.value.position) == (codepoint, position)


def _synthesize(family, model, utterances, seed):
    return model.synthesize(SynthesisRequest.from_utterances(utterances, sampling=family.sampling(seed=seed)))


def test_same_seed_same_audio_and_another_seed_other_audio(family, model):
    """Seeded randomness is reproducible; a family whose default sampling is already deterministic
    (its ``deterministic()`` equals its defaults) gives the same audio for any seed."""
    utterances = model.text_to_utterances(SENTENCES)[:1]
    first, again, other = (_synthesize(family, model, utterances, seed) for seed in (3, 3, 4))
    assert torch.equal(first.audio, again.audio)
    if family.sampling_type.deterministic() == family.sampling_type():
        assert torch.equal(first.audio, other.audio)
    else:
        assert not torch.equal(first.audio, other.audio)
    assert first.sample_rate_hz == model.sample_rate_hz


def test_batch_equals_single(family, model):
    """Padding a sentence into a batch does not change its audio, with randomness off. Not bit-exact
    at the very end: the decoder's convolutions see the padded frames past a shorter item's end."""
    utterances = model.text_to_utterances(SENTENCES)
    sampling = family.sampling_type.deterministic()
    batch = model.synthesize(SynthesisRequest.from_utterances(utterances, sampling=sampling))
    for row, utterance in enumerate(utterances):
        alone = model.synthesize(SynthesisRequest.from_utterances([utterance], sampling=sampling))
        batched, single = batch.waveforms()[row], alone.waveforms()[0]
        assert batched.shape == single.shape
        body = int(0.9 * single.numel())
        torch.testing.assert_close(batched[:body], single[:body], atol=1e-5, rtol=0)
        if family.capabilities.durations:
            assert torch.equal(batch.durations[row, : len(utterance.phoneme_ids)], alone.durations[0])


def test_conditioning_outside_the_capabilities_is_refused(family, model):
    utterances = model.text_to_utterances("Hello.")
    accepted = set(family.capabilities.accepted_conditions())
    refused = next(name for name in ("prompt", "reference_embedding", "speaker_id") if name not in accepted)
    values = {"prompt": "cheerful", "reference_embedding": torch.zeros(1, 256), "speaker_id": torch.zeros(1, dtype=torch.long)}
    request = SynthesisRequest.from_utterances(utterances, sampling=family.sampling(seed=0),
                                               voice=VoiceCondition(**{refused: values[refused]}))
    with pytest.raises(ValueError, match=refused):
        model.synthesize(request)


def _peak_error(actual: np.ndarray, expected: np.ndarray) -> float:
    peak = float(np.abs(expected).max()) if expected.size else 0.0
    return float(np.abs(actual - expected).max()) / max(peak, 1e-12) if expected.size else 0.0


def test_every_graph_exports_and_onnxruntime_matches_its_module(family, model, exported_once):
    """Every graph a family declares exports; onnxruntime on its example inputs gives what the
    module gives (within 1e-4 of each output's peak). A graph another test of this run exported from
    the same contract is read, not exported again (conftest.py ``exported_once``)."""
    assert family.graph_contracts is not None, f"family {family.name} declares no ONNX graph"
    contracts = family.graph_contracts(model)
    assert contracts, f"family {family.name} declares an empty set of graphs"
    for name, contract in contracts.items():
        path = exported_once(contract)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {key: value.numpy() for key, value in contract.example_inputs.items()}
        got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
        with torch.no_grad():
            expected = contract.module(*contract.example_inputs.values())
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        assert len(got) == len(expected) == len(contract.output_names), name
        for output, actual, reference in zip(contract.output_names, got, expected):
            reference = reference.numpy()
            # A contract's postprocess may add unit axes (Piper's (B, 1, T) outputs): same values, same order.
            assert actual.size == reference.size, f"{name}.{output}: {actual.shape} != {reference.shape}"
            actual = actual.reshape(reference.shape)
            if np.issubdtype(reference.dtype, np.integer):
                assert np.array_equal(actual, reference), f"{name}.{output} differs"
            else:
                assert _peak_error(actual, reference) <= 1e-4, f"{name}.{output}: {_peak_error(actual, reference):.2e}"


def test_the_end_to_end_graph_speaks_as_the_model(family, model, exported_once):
    """A family with one end-to-end graph (``SYNTHESIZER``): run in onnxruntime on the contract's
    feeds for a request, it gives the model's audio (and durations) for the same request."""
    contracts = family.graph_contracts(model)
    if SYNTHESIZER not in contracts:
        assert family.capabilities.autoregressive, f"family {family.name} is not autoregressive yet has no {SYNTHESIZER} graph"
        pytest.skip(f"{family.name} decodes tokens step by step: its graphs are checked one by one above")
    contract = contracts[SYNTHESIZER]
    path = exported_once(contract)
    utterances = model.text_to_utterances(SENTENCES)
    request = SynthesisRequest.from_utterances(utterances, sampling=family.sampling(seed=7),
                                               voice=contract.example_voice)
    expected = model.synthesize(request)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = dict(zip(contract.output_names, session.run(None, contract.feeds(request))))
    audio = outputs[contract.audio_output].reshape(len(utterances), -1)
    for row, waveform in enumerate(expected.waveforms()):
        np.testing.assert_allclose(audio[row, : waveform.numel()], waveform.numpy(), atol=1e-4)
    if contract.durations_output is not None:
        durations = outputs[contract.durations_output].reshape(len(utterances), -1)
        assert np.array_equal(durations[:, : expected.durations.shape[1]], expected.durations.numpy())


def test_one_request_served(family, model, tmp_path):
    """The server takes the family's tiny model as it is: a speech request answers 200 with audio at
    the model's rate, and a field its capabilities do not take answers 400 naming the family."""
    settings = serve_settings_from_config(compose_config(tmp_path, ["serve.source=teacher", "serve.warmup=false"]))
    served = served_as_is(model, family, "teacher", family.default_voice)
    with TestClient(create_app(settings, served)) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        speech = {"model": "teacher", "voice": served.voice_name, "input": "Hello there.", "response_format": "wav"}
        response = client.post("/v1/audio/speech", json=speech)
        assert response.status_code == 200, response.text
        audio, sample_rate_hz = soundfile.read(io.BytesIO(response.content))
        assert sample_rate_hz == model.sample_rate_hz and audio.size > 0
        if not family.capabilities.prompt_style:
            refused = client.post("/v1/audio/speech", json={**speech, "prompt": "cheerful"})
            assert refused.status_code == 400 and family.name in refused.json()["error"]["message"]
