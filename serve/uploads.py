"""Check and decode an uploaded reference clip (POST /v1/voices) with a real audio library.

    clip = decode_reference(data, limits)     # -> DecodedClip at 16 kHz, or UploadRejected

Every rejection is an ``UploadRejected`` with an HTTP status and an error code the API returns
as JSON, its message naming the form field (``file``) and what is accepted, never a Python
object: too big (413), not audio / empty / too short / too long / silent / clipped / a sample
rate outside the accepted range (400). Clips inside the rate range are resampled to 16 kHz,
the rate of the speaker encoder (resemblyzer). Stereo and wider clips are averaged to mono.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import soundfile

TARGET_SAMPLE_RATE_HZ = 16_000  # resemblyzer's speaker encoder works at 16 kHz
SILENCE_PEAK = 10 ** (-50 / 20)  # a clip whose loudest sample is below -50 dBFS holds no voice
CLIP_LEVEL = 0.999  # |sample| at or above this counts as clipped (full scale, after decoding)
MAX_CLIPPED_FRACTION = 0.001  # 0.1 % clipped samples is audibly distorted speech


ACCEPTED = "send a WAV, FLAC or OGG clip of speech as the multipart file field `file`"


class UploadRejected(ValueError):
    def __init__(self, message: str, code: str, status_code: int = 400):
        super().__init__(message)
        self.code = code
        self.status_code = status_code


@dataclass(frozen=True)
class UploadLimits:
    max_bytes: int
    max_s: float
    min_s: float
    min_sample_rate_hz: int
    max_sample_rate_hz: int


@dataclass(frozen=True)
class DecodedClip:
    waveform: np.ndarray  # (T,) float32 at TARGET_SAMPLE_RATE_HZ
    source_sample_rate_hz: int
    duration_s: float


def _decoder_reason(error: Exception) -> str:
    """libsndfile's own reason: str(error) would print the in-memory file object it was handed."""
    reason = getattr(error, "error_string", None)  # soundfile.LibsndfileError
    return reason.rstrip(".") if reason else type(error).__name__


def decode_reference(data: bytes, limits: UploadLimits) -> DecodedClip:
    if len(data) == 0:
        raise UploadRejected(f"file: the upload is empty; {ACCEPTED}", "empty_audio")
    if len(data) > limits.max_bytes:
        raise UploadRejected(f"file: the upload is {len(data)} bytes; the limit is {limits.max_bytes}",
                             "upload_too_large", 413)
    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as error:
        raise UploadRejected(f"file: the upload is not audio this server can decode ({_decoder_reason(error)}); "
                             f"{ACCEPTED}", "invalid_audio") from error
    if info.frames == 0 or info.samplerate <= 0:
        raise UploadRejected(f"file: the uploaded audio holds no samples; {ACCEPTED}", "empty_audio")
    duration_s = info.frames / info.samplerate
    if duration_s > limits.max_s:
        raise UploadRejected(f"file: the clip lasts {duration_s:.1f} s; the limit is {limits.max_s:g} s",
                             "audio_too_long")
    if duration_s < limits.min_s:
        raise UploadRejected(f"file: the clip lasts {duration_s:.2f} s; give at least {limits.min_s:g} s of speech",
                             "audio_too_short")
    if not limits.min_sample_rate_hz <= info.samplerate <= limits.max_sample_rate_hz:
        raise UploadRejected(f"file: the clip's sample rate is {info.samplerate} Hz; accepted: "
                             f"{limits.min_sample_rate_hz}..{limits.max_sample_rate_hz} Hz", "unsupported_sample_rate")
    try:
        samples, sample_rate_hz = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)  # (T, channels)
    except (soundfile.LibsndfileError, RuntimeError) as error:
        raise UploadRejected(f"file: the audio could not be decoded ({_decoder_reason(error)}); {ACCEPTED}",
                             "invalid_audio") from error
    waveform = samples.mean(axis=1)  # (T,)
    if not np.isfinite(waveform).all():
        raise UploadRejected(f"file: the audio holds NaN or infinite samples; {ACCEPTED}", "invalid_audio")
    peak = float(np.abs(waveform).max())
    if peak < SILENCE_PEAK:
        raise UploadRejected(f"file: the clip is silent (peak {20 * np.log10(max(peak, 1e-12)):.0f} dBFS): "
                             "record speech at a normal level", "silent_audio")
    clipped_fraction = float(np.mean(np.abs(samples) >= CLIP_LEVEL))
    if clipped_fraction > MAX_CLIPPED_FRACTION:
        raise UploadRejected(f"file: {clipped_fraction:.1%} of the samples are clipped at full scale: "
                             "record with less gain", "clipped_audio")
    if sample_rate_hz != TARGET_SAMPLE_RATE_HZ:
        import librosa  # lazy: heavy, and only uploads need it; the server imports this module at start

        waveform = librosa.resample(waveform, orig_sr=sample_rate_hz, target_sr=TARGET_SAMPLE_RATE_HZ)
    return DecodedClip(waveform.astype(np.float32), sample_rate_hz, duration_s)
