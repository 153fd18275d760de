"""Bytes on the wire: 16-bit PCM, a streaming WAV header, whole WAV/FLAC files.

A streamed WAV starts with a header whose RIFF and data sizes are 0xFFFFFFFF ("as long as
the stream"), then raw PCM: the header goes out before the length is known, as OpenAI's
streamed WAV does. libsndfile (soundfile), ffmpeg and browsers read such a file to its end.
"""
from __future__ import annotations

import io
import struct

import numpy as np
import soundfile

RESPONSE_FORMATS = ("wav", "pcm", "flac")
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}
STREAMING_SIZE = 0xFFFFFFFF  # the largest size a RIFF header can state: "unknown, read to the end"


def pcm16_bytes(waveform: np.ndarray) -> bytes:
    """Little-endian signed 16-bit samples of ``waveform`` (T,) float in [-1, 1] (clipped)."""
    return (np.clip(waveform, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate_hz: int, data_bytes: int | None = None) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV; ``data_bytes`` None for a stream of unknown length."""
    data_size = STREAMING_SIZE if data_bytes is None else data_bytes
    riff_size = STREAMING_SIZE if data_bytes is None else 36 + data_bytes
    byte_rate_hz = sample_rate_hz * 2
    return (b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate_hz, byte_rate_hz, 2, 16)
            + b"data" + struct.pack("<I", data_size))


def encode_file(waveform: np.ndarray, sample_rate_hz: int, response_format: str) -> bytes:
    """A whole file of ``waveform`` (T,): ``wav`` or ``flac`` (16-bit), or headerless ``pcm``."""
    if response_format == "pcm":
        return pcm16_bytes(waveform)
    if response_format == "wav":
        data = pcm16_bytes(waveform)
        return wav_header(sample_rate_hz, len(data)) + data
    if response_format == "flac":
        buffer = io.BytesIO()
        soundfile.write(buffer, np.clip(waveform, -1.0, 1.0), sample_rate_hz, format="FLAC", subtype="PCM_16")
        return buffer.getvalue()
    raise ValueError(f"response_format {response_format!r}: accepted {list(RESPONSE_FORMATS)}")
