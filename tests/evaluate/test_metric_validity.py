"""Each quality metric moves the right way when the teacher's audio is degraded on purpose.

Four evaluation sentences are spoken once by the bundled joe voice as it ships (its family's
reference runtime; seeded noise, so the audio is the same on every run), then degraded: white noise at 20/10/0 dB SNR, a 4 kHz low-pass and
6-bit requantisation. DNSMOS, MCD, speaker similarity and WER must each get worse, and their
fixed points (MCD of a clip with itself, parity with ``speechmos``) must hold exactly. WER is
measured twice: by Whisper (the run's recognizer) and by the domain-LM pocketsphinx it replaced.

    python -m pytest tests/evaluate/test_metric_validity.py
"""
from __future__ import annotations

import librosa
import numpy as np
import pytest
import torch
from speechmos import dnsmos as speechmos_dnsmos

from evaluate.degradations import STANDARD_DEGRADATIONS, add_white_noise, low_pass, requantize
from evaluate.dnsmos import DNSMOSP808, DNSMOSP835, dnsmos_p808, dnsmos_p835
from evaluate.asr import WhisperRecognizer
from evaluate.intelligibility import DomainRecognizer, WordErrorRate, normalize_text
from evaluate.mcd import MelCepstralDistortion, mel_cepstral_distortion
from evaluate.speaker import SpeakerSimilarity, speaker_similarity
from models.interface import SynthesisRequest
from models.registry import get_family
from texts import load_sentences

pytestmark = pytest.mark.slow  # loads the real voice

FAMILY_NAME = "piper"  # the thresholds below were set on its default voice (joe)

SENTENCES = [  # short single-sentence lines of the eval set; "Marisol" takes the espeak-pronunciation path
    "You look like someone who could use a sharper sword.",
    "Thanks so much for the five gifted subs, Marisol!",
    "My grandfather built this lighthouse with his own two hands.",
    "Is there anything else I can help you with today?",
]
DEGRADATIONS = STANDARD_DEGRADATIONS
NOISE_LADDER = ["clean", "snr_20db", "snr_10db", "snr_0db"]


def _strictly_decreasing(values: list[float]) -> bool:
    return all(earlier > later for earlier, later in zip(values, values[1:]))


def _strictly_increasing(values: list[float]) -> bool:
    return all(earlier < later for earlier, later in zip(values, values[1:]))


@pytest.fixture(scope="module")
def teacher() -> tuple[list[torch.Tensor], int]:
    """The original voice's waveforms of SENTENCES, each (T,), and their sample rate."""
    family = get_family(FAMILY_NAME)
    voice = family.reference.load(family.default_voice, 2)
    waveforms = []
    for index, sentence in enumerate(SENTENCES):
        request = SynthesisRequest.from_utterances(voice.text_to_utterances(sentence), sampling=family.sampling(seed=index))
        waveforms.append(voice.synthesize(request).waveforms()[0])
    return waveforms, voice.sample_rate_hz


@pytest.fixture(scope="module")
def degraded(teacher) -> dict[str, list[torch.Tensor]]:
    """Condition name -> the teacher's waveforms under that degradation."""
    waveforms, sample_rate_hz = teacher
    return {
        name: [degrade(wave, sample_rate_hz, index) for index, wave in enumerate(waveforms)]
        for name, degrade in DEGRADATIONS.items()
    }


@pytest.fixture(scope="module")
def dnsmos_scores(degraded, teacher) -> dict[str, dict[str, float]]:
    """Condition -> DNSMOS of the four utterances joined into one clip.

    Joined, they exceed DNSMOS's 9.01 s window, so each condition costs two windows; one short
    clip alone would be repeated to >= 9.01 s and cost up to eight.
    """
    _, sample_rate_hz = teacher
    scores = {}
    for name, waveforms in degraded.items():
        clip = torch.cat(waveforms)  # (T_total,)
        assert len(clip) > 9.01 * sample_rate_hz, "the joined clip must fill one DNSMOS window"
        scores[name] = {"p808": dnsmos_p808(clip, sample_rate_hz, intra_op_threads=2),
                        **dnsmos_p835(clip, sample_rate_hz, intra_op_threads=2)}
    return scores


# DNSMOS


def test_dnsmos_equals_speechmos_on_the_same_16khz_audio(teacher):
    """A 17.5 s clip: its 8th window ends one sample short in the reference's float arithmetic and is skipped."""
    waveforms, sample_rate_hz = teacher
    clip = torch.cat(waveforms * 2)[: int(17.5 * sample_rate_hz)]  # (T,)
    reference = speechmos_dnsmos.run(librosa.resample(clip.numpy(), orig_sr=sample_rate_hz, target_sr=16000), 16000)
    assert dnsmos_p808(clip, sample_rate_hz) == pytest.approx(reference["p808_mos"], abs=1e-6)
    ours = dnsmos_p835(clip, sample_rate_hz)
    for name in ("sig", "bak", "ovrl"):
        assert ours[name] == pytest.approx(reference[f"{name}_mos"], abs=1e-6)


def test_dnsmos_rates_clean_teacher_speech_good_and_white_noise_bad(dnsmos_scores):
    assert dnsmos_scores["clean"]["p808"] >= 3.5
    white_noise = 0.1 * torch.randn(3 * 22050, generator=torch.Generator().manual_seed(0))  # (T,)
    assert dnsmos_p808(white_noise, 22050) < 2.6


def test_dnsmos_falls_as_noise_rises(dnsmos_scores):
    for measure in ("p808", "bak", "ovrl"):
        assert _strictly_decreasing([dnsmos_scores[name][measure] for name in NOISE_LADDER]), measure


def test_dnsmos_falls_with_low_pass_and_requantisation(dnsmos_scores):
    clean = dnsmos_scores["clean"]
    # P.835 barely reacts to band limiting (OVRL 3.20 vs 3.22 over 20 Harvard sentences): P.808 does.
    assert dnsmos_scores["low_pass_4khz"]["p808"] < clean["p808"] - 0.2
    assert dnsmos_scores["requantized_6bit"]["p808"] < clean["p808"] - 0.2
    assert dnsmos_scores["requantized_6bit"]["ovrl"] < clean["ovrl"] - 0.2


def test_dnsmos_metrics_average_utterances(teacher):
    waveforms, sample_rate_hz = teacher
    clip = torch.cat(waveforms)  # (T_total,)
    p808, p835 = DNSMOSP808(intra_op_threads=2), DNSMOSP835(intra_op_threads=2)
    p808.update(clip, sample_rate_hz)
    p808.update(clip, sample_rate_hz)
    p835.update(clip, sample_rate_hz)
    assert float(p808.compute()) == pytest.approx(dnsmos_p808(clip, sample_rate_hz), abs=1e-9)
    assert set(p835.compute()) == {"sig", "bak", "ovrl"}


# MCD


def test_mcd_of_a_clip_with_itself_is_zero(teacher):
    waveforms, sample_rate_hz = teacher
    assert mel_cepstral_distortion(waveforms[0], waveforms[0], sample_rate_hz) == 0.0


def test_mcd_on_the_model_hop_matches_the_default_frame_at_its_rate(teacher):
    """At 22.05 kHz the default frame is hop 256, window 1024: a model of that hop gets the same MCD."""
    waveforms, sample_rate_hz = teacher
    noisy = STANDARD_DEGRADATIONS["snr_10db"](waveforms[0], sample_rate_hz, 0)
    assert sample_rate_hz == 22050
    assert mel_cepstral_distortion(noisy, waveforms[0], sample_rate_hz, hop_length=256) == (
        mel_cepstral_distortion(noisy, waveforms[0], sample_rate_hz))
    assert mel_cepstral_distortion(noisy, waveforms[0], sample_rate_hz, hop_length=512) != (
        mel_cepstral_distortion(noisy, waveforms[0], sample_rate_hz))
    with pytest.raises(ValueError, match="hop_length"):
        mel_cepstral_distortion(noisy, waveforms[0], sample_rate_hz, hop_length=0)


def _mean_mcd_db(test_waveforms, reference_waveforms, sample_rate_hz) -> float:
    metric = MelCepstralDistortion()
    for test, reference in zip(test_waveforms, reference_waveforms):
        metric.update(test, reference, sample_rate_hz)
    return float(metric.compute())


def test_mcd_rises_with_every_degradation(teacher, degraded):
    waveforms, sample_rate_hz = teacher
    mcd_db = {name: _mean_mcd_db(degraded[name], waveforms, sample_rate_hz) for name in degraded}
    assert mcd_db["clean"] == 0.0
    assert _strictly_increasing([mcd_db[name] for name in NOISE_LADDER])
    assert mcd_db["low_pass_4khz"] > 1.0
    assert mcd_db["requantized_6bit"] > 1.0


def test_mcd_aligns_clips_of_different_length(teacher):
    """Leading silence shifts every frame; DTW realigns, so the distortion stays small."""
    waveforms, sample_rate_hz = teacher
    shifted = torch.cat([torch.zeros(2000), waveforms[0]])  # (2000 + T,)
    assert mel_cepstral_distortion(shifted, waveforms[0], sample_rate_hz) < 1.0


# Speaker similarity


def test_speaker_similarity_of_a_clip_with_itself_is_one(teacher):
    waveforms, sample_rate_hz = teacher
    assert speaker_similarity(waveforms[0], waveforms[0], sample_rate_hz) == pytest.approx(1.0, abs=1e-5)


def test_speaker_similarity_falls_as_noise_rises(teacher, degraded):
    waveforms, sample_rate_hz = teacher
    similarity = {}
    for name in NOISE_LADDER:
        metric = SpeakerSimilarity()
        for test, reference in zip(degraded[name], waveforms):
            metric.update(test, reference, sample_rate_hz)
        similarity[name] = float(metric.compute())
    assert _strictly_decreasing([similarity[name] for name in NOISE_LADDER])


# Word error rate


@pytest.fixture(scope="module")
def eval_recognizer() -> DomainRecognizer:
    """Built from the whole eval set, as a run builds it."""
    sentences = load_sentences("eval")
    assert set(SENTENCES) <= set(sentences)
    return DomainRecognizer.from_sentences(sentences)


def test_domain_wer_rises_from_clean_to_0db(teacher, degraded, eval_recognizer):
    _, sample_rate_hz = teacher
    wer = {}
    for name in NOISE_LADDER:
        metric = WordErrorRate(eval_recognizer)
        for wave, sentence in zip(degraded[name], SENTENCES):
            metric.update(wave, sample_rate_hz, sentence)
        wer[name] = float(metric.compute())
    assert wer["clean"] <= 0.05
    assert wer["clean"] <= wer["snr_20db"] <= wer["snr_10db"] <= wer["snr_0db"]
    assert wer["snr_0db"] > wer["clean"] + 0.3


def test_whisper_wer_rises_with_noise(teacher, degraded):
    """Whisper tiny.en, which knows nothing of the sentences. Clean then 20/10/0 dB SNR on these four
    sentences: 0.000, 0.026, 0.077, 0.462 on an Intel Xeon; 0.000, 0.103, 0.308, 0.308 on an AMD EPYC
    (6-bit requantisation: 0.077). The CPU's float kernels move the decoder's beam, so the ladder is
    only asserted to rise, not to rise at every step."""
    _, sample_rate_hz = teacher
    recognizer = WhisperRecognizer("tiny.en", language="en", threads=2)
    wer = {}
    for name in [*NOISE_LADDER, "requantized_6bit"]:
        metric = WordErrorRate(recognizer)
        for wave, sentence in zip(degraded[name], SENTENCES):
            metric.update(wave, sample_rate_hz, sentence)
        wer[name] = float(metric.compute())
    assert wer["clean"] <= 0.03
    ladder = [wer[name] for name in NOISE_LADDER]
    assert ladder == sorted(ladder)
    assert wer["snr_20db"] > wer["clean"]
    assert wer["snr_0db"] > wer["clean"] + 0.2
    assert wer["requantized_6bit"] > wer["clean"]


def test_domain_recognizer_pronounces_words_cmudict_lacks(eval_recognizer):
    assert "marisol" in eval_recognizer.espeak_pronounced_words
    assert "marisol" in eval_recognizer.vocabulary
    assert not eval_recognizer.out_of_vocabulary_words


def test_wer_refuses_text_outside_the_recognizer_vocabulary(teacher, eval_recognizer):
    waveforms, sample_rate_hz = teacher
    with pytest.raises(ValueError, match="xylophone"):
        WordErrorRate(eval_recognizer).update(waveforms[0], sample_rate_hz, "A xylophone sword.")


def test_text_normalisation():
    assert normalize_text("It's 2024, the 21st of 3.5 \"well-known\" men's!") == (
        "it's two thousand twenty four the twenty first of three point five well known men's"
    )


# Degradation helpers


def test_white_noise_has_the_requested_snr(teacher):
    waveforms, _ = teacher
    clean = waveforms[0] * 0.5  # headroom: nothing clips, so the noise is exactly what was added
    noise = add_white_noise(clean, snr_db=10.0, seed=0) - clean  # (T,)
    snr_db = 10 * torch.log10(clean.pow(2).mean() / noise.pow(2).mean())
    assert float(snr_db) == pytest.approx(10.0, abs=0.1)


def test_low_pass_and_requantize_do_what_they_say(teacher):
    waveforms, sample_rate_hz = teacher
    filtered = low_pass(waveforms[0], sample_rate_hz, cutoff_hz=4000.0)
    spectrum = np.abs(np.fft.rfft(filtered.numpy())) ** 2
    frequencies_hz = np.fft.rfftfreq(len(filtered), d=1 / sample_rate_hz)
    assert spectrum[frequencies_hz > 5000].sum() < 1e-4 * spectrum.sum()
    assert len(torch.unique(requantize(waveforms[0], bits=6))) <= 64


# Input checks


@pytest.mark.parametrize("score", [
    lambda wave, rate: dnsmos_p808(wave, rate),
    lambda wave, rate: dnsmos_p835(wave, rate),
    lambda wave, rate: mel_cepstral_distortion(wave, torch.ones(4000) * 0.1, rate),
    lambda wave, rate: speaker_similarity(wave, torch.ones(4000) * 0.1, rate),
    lambda wave, rate: DomainRecognizer.general_english().transcribe(wave, rate),
], ids=["p808", "p835", "mcd", "speaker", "asr"])
def test_bad_inputs_are_named(score):
    with pytest.raises(ValueError, match="empty"):
        score(torch.zeros(0), 22050)
    with pytest.raises(ValueError, match=r"shape \(T,\)"):
        score(torch.zeros(2, 4000), 22050)
    with pytest.raises(ValueError, match="sample_rate_hz"):
        score(torch.zeros(4000), 0)
