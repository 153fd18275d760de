"""The quality curve of a chunked training run: eval files are read without pickles, scored on real
audio, and the best step follows the stated rule."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import lfilter

from compress.training_curve import StepScore, best_step, eval_files, read_eval_audio, score_file


def _score(step: int, dnsmos: float, mcd: float, sim: float) -> StepScore:
    return StepScore(step, 3, dnsmos, 3.9, mcd, sim, f"eval_step{step:06d}.npz")


def test_best_step_maximizes_dnsmos_within_the_constraints():
    scores = [_score(0, 3.2, 0.9, 0.97), _score(4000, 3.6, 1.3, 0.96), _score(8000, 3.4, 0.95, 0.955)]
    assert best_step(scores, min_spk_sim=0.95, max_mcd_db=1.0) == (scores[2], True)


def test_without_an_eligible_step_the_closest_speaker_is_kept_and_flagged():
    scores = [_score(0, 3.2, 1.2, 0.93), _score(4000, 3.6, 1.3, 0.91)]
    assert best_step(scores, min_spk_sim=0.95, max_mcd_db=1.0) == (scores[0], False)


def _vowels(seconds: float, rate: int = 16000) -> np.ndarray:
    """Speech-like int16 audio: a 120 Hz pulse train through three formants, at four syllables a second
    (the speaker encoder's voice-activity trimming drops pure tones)."""
    t = np.arange(int(seconds * rate)) / rate
    x = np.zeros_like(t)
    x[:: rate // 120] = 1.0
    for formant_hz, bandwidth_hz in ((700, 130), (1220, 70), (2600, 160)):
        radius, angle = np.exp(-np.pi * bandwidth_hz / rate), 2 * np.pi * formant_hz / rate
        x = lfilter([1.0], [1.0, -2 * radius * np.cos(angle), radius**2], x)
    x *= 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    return np.round(0.3 * x / np.abs(x).max() * 32767).astype(np.int16)


def test_eval_files_are_read_and_scored(tmp_path):
    for step in (1200, 300):
        np.savez(tmp_path / f"eval_step{step:06d}.npz", step=np.array(step), sample_rate_hz=np.array(16000),
                 teacher_000=_vowels(1.5), student_000=_vowels(1.5))
    files = eval_files(tmp_path)
    assert [p.name for p in files] == ["eval_step000300.npz", "eval_step001200.npz"]  # by step, not by name
    step, rate, pairs = read_eval_audio(files[0])
    assert (step, rate, len(pairs)) == (300, 16000, 1)
    score = score_file(files[0])
    assert score.mcd_db == pytest.approx(0.0, abs=1e-6)  # identical audio
    assert score.spk_sim == pytest.approx(1.0, abs=1e-4)
    assert score.dnsmos_p808 == pytest.approx(score.teacher_dnsmos_p808)


def test_a_file_without_pairs_is_refused(tmp_path):
    np.savez(tmp_path / "eval_step000001.npz", step=np.array(1), sample_rate_hz=np.array(16000),
             teacher_000=_vowels(1.0))
    with pytest.raises(ValueError, match="has no student_000"):
        read_eval_audio(tmp_path / "eval_step000001.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no eval_step"):
        eval_files(tmp_path / "empty")
