"""DNSMOS P.808 and P.835 (SIG, BAK, OVRL): non-intrusive MOS predictors for speech quality.

Runs the ONNX models shipped inside the ``speechmos`` package with onnxruntime on CPU and
follows the official DNSMOS computation (Microsoft's ``dnsmos_local.py``, as ``speechmos``
implements it): audio at 16 kHz, a clip shorter than 9.01 s is repeated until it is long
enough, 9.01 s windows with a 1 s hop, P.835 raw scores mapped through the non-personalized
polynomial fits, P.808 scored on a 120-band log-mel spectrogram, window scores averaged.
Numbers equal ``speechmos.dnsmos.run`` on the same 16 kHz audio.

Measured on the first 20 Harvard sentences spoken by the original joe voice: P.808 3.88,
SIG/BAK/OVRL 3.45/4.12/3.22. White noise at 20/10/0 dB SNR takes P.808 to 2.97/2.62/2.27 and
OVRL to 2.61/2.15/1.71; a 4 kHz low-pass P.808 to 3.39 (OVRL hardly moves: 3.20); 6-bit
requantisation P.808 to 2.93, OVRL 2.39. Pure white noise scores P.808 2.1.

Cost is per window (about 0.2 s on 2 cores): a clip is doubled until it fills 9.01 s, so a
2.2 s sentence becomes 17.6 s and 8 windows, while a 9.5 s one is a single window. Samples
outside [-1, 1] are clipped (``speechmos`` refuses them), as a 16-bit WAV would store them.

Usage::

    from evaluate.dnsmos import DNSMOSP808, DNSMOSP835, dnsmos_p808, dnsmos_p835

    dnsmos_p808(waveform, sample_rate_hz=22050)        # -> float, 1 (bad) .. 5 (excellent)
    dnsmos_p835(waveform, sample_rate_hz=22050)        # -> {"sig": .., "bak": .., "ovrl": ..}

    p808 = DNSMOSP808(intra_op_threads=2)
    for waveform in waveforms:                          # each (T,) float in [-1, 1]
        p808.update(waveform, sample_rate_hz=22050)
    p808.compute()                                      # -> tensor, mean over utterances

    DNSMOSP835().compute()                              # after updates: dict sig/bak/ovrl of means
"""
from __future__ import annotations

import functools
from pathlib import Path

import librosa
import numpy as np
import onnxruntime as ort
import speechmos
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from evaluate.audio_input import mono_float32

MODEL_SAMPLE_RATE_HZ = 16000  # both DNSMOS models were trained on 16 kHz audio
WINDOW_S = 9.01  # the P.835 model's fixed input: 144160 samples at 16 kHz
HOP_S = 1.0
_MODEL_DIR = Path(speechmos.__file__).parent / "dnsmos_models"
_P835_MODEL = "sig_bak_ovr.onnx"
_P808_MODEL = "model_v8.onnx"
# Non-personalized mappings from the P.835 model's raw outputs to MOS (dnsmos_local.py).
_P835_POLYFITS = {
    "sig": np.poly1d([-0.08397278, 1.22083953, 0.0052439]),
    "bak": np.poly1d([-0.13166888, 1.60915514, -0.39604546]),
    "ovrl": np.poly1d([-0.06766283, 1.11546468, 0.04602535]),
}


@functools.lru_cache(maxsize=None)
def _session(model_file: str, intra_op_threads: int) -> ort.InferenceSession:
    """One onnxruntime session per (model, thread count) per process: loading costs ~0.5 s."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(_MODEL_DIR / model_file), options, providers=["CPUExecutionProvider"])


def _to_model_input(waveform: torch.Tensor | np.ndarray, sample_rate_hz: int) -> np.ndarray:
    """Check a mono waveform and return it as float32 numpy at 16 kHz, (T_16k,)."""
    audio = mono_float32(waveform, sample_rate_hz=sample_rate_hz)
    if sample_rate_hz != MODEL_SAMPLE_RATE_HZ:
        audio = librosa.resample(audio, orig_sr=sample_rate_hz, target_sr=MODEL_SAMPLE_RATE_HZ)
    # The official pipeline reads 16-bit WAV files, where nothing exceeds full scale.
    return np.clip(audio, -1.0, 1.0)


def _windows(audio_16k: np.ndarray) -> list[np.ndarray]:
    """The 9.01 s windows DNSMOS scores, each (144160,), exactly as dnsmos_local.py cuts them."""
    window_len = int(WINDOW_S * MODEL_SAMPLE_RATE_HZ)
    hop_len = int(HOP_S * MODEL_SAMPLE_RATE_HZ)
    while len(audio_16k) < window_len:  # short clips are repeated, not zero-padded
        audio_16k = np.append(audio_16k, audio_16k)
    num_hops = int(np.floor(len(audio_16k) / MODEL_SAMPLE_RATE_HZ) - WINDOW_S) + 1
    # The end index is computed in floating point on purpose: from window index 7 on,
    # (i + 9.01) * 16000 truncates one sample short, and the reference then skips that window.
    windows = [audio_16k[int(i * hop_len): int((i + WINDOW_S) * hop_len)] for i in range(num_hops)]
    return [w for w in windows if len(w) == window_len]


def _p808_features(window: np.ndarray) -> np.ndarray:
    """120-band log-mel of one window, (1, 900, 120), normalised as the P.808 model expects."""
    mel_power = librosa.feature.melspectrogram(
        y=window[:-160], sr=MODEL_SAMPLE_RATE_HZ, n_fft=321, hop_length=160, n_mels=120
    )  # (120, 900)
    mel_db = (librosa.power_to_db(mel_power, ref=np.max) + 40) / 40
    return mel_db.T[np.newaxis].astype(np.float32)


def dnsmos_p808(waveform: torch.Tensor | np.ndarray, sample_rate_hz: int, intra_op_threads: int = 0) -> float:
    """DNSMOS P.808 MOS of one utterance (T,); ``intra_op_threads=0`` lets onnxruntime choose."""
    session = _session(_P808_MODEL, intra_op_threads)
    scores = [
        session.run(None, {"input_1": _p808_features(window)})[0][0][0]
        for window in _windows(_to_model_input(waveform, sample_rate_hz))
    ]
    return float(np.mean(scores))


def dnsmos_p835(
    waveform: torch.Tensor | np.ndarray, sample_rate_hz: int, intra_op_threads: int = 0
) -> dict[str, float]:
    """DNSMOS P.835 MOS of one utterance (T,): ``{"sig", "bak", "ovrl"}``."""
    session = _session(_P835_MODEL, intra_op_threads)
    per_window = {name: [] for name in _P835_POLYFITS}
    for window in _windows(_to_model_input(waveform, sample_rate_hz)):
        raw = session.run(None, {"input_1": window[np.newaxis].astype(np.float32)})[0][0]  # (3,) sig, bak, ovrl
        for name, raw_score in zip(_P835_POLYFITS, raw):
            per_window[name].append(_P835_POLYFITS[name](raw_score))
    return {name: float(np.mean(scores)) for name, scores in per_window.items()}


class DNSMOSP808(Metric):
    """Mean DNSMOS P.808 over the utterances given to ``update``."""

    higher_is_better = True
    full_state_update = False

    def __init__(self, intra_op_threads: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.intra_op_threads = intra_op_threads
        self.add_state("scores", default=[], dist_reduce_fx="cat")

    def update(self, waveform: torch.Tensor | np.ndarray, sample_rate_hz: int) -> None:
        score = dnsmos_p808(waveform, sample_rate_hz, self.intra_op_threads)
        self.scores.append(torch.tensor([score], dtype=torch.float64))

    def compute(self) -> torch.Tensor:
        if not self.scores:
            raise RuntimeError("DNSMOSP808.compute() called before any update(): score at least one utterance")
        return dim_zero_cat(self.scores).mean()


class DNSMOSP835(Metric):
    """Mean DNSMOS P.835 SIG, BAK and OVRL over the utterances given to ``update``."""

    higher_is_better = True
    full_state_update = False

    def __init__(self, intra_op_threads: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.intra_op_threads = intra_op_threads
        for name in _P835_POLYFITS:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, waveform: torch.Tensor | np.ndarray, sample_rate_hz: int) -> None:
        scores = dnsmos_p835(waveform, sample_rate_hz, self.intra_op_threads)
        for name, score in scores.items():
            getattr(self, name).append(torch.tensor([score], dtype=torch.float64))

    def compute(self) -> dict[str, torch.Tensor]:
        if not self.sig:
            raise RuntimeError("DNSMOSP835.compute() called before any update(): score at least one utterance")
        return {name: dim_zero_cat(getattr(self, name)).mean() for name in _P835_POLYFITS}
