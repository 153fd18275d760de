"""Audio that leaves before the utterance is done: decoder-chunk streaming and SSE framing.

Decoder chunks (families whose ``capabilities.streaming_unit`` is ``decoder_frames``, on an engine
that offers ``decoder_latent``): everything up to the decoder runs once per sentence
(``model.decoder_latent``), then the decoder (HiFi-GAN in VITS) runs on windows of
``chunk_frames`` latent frames, each with ``context_frames`` more on both sides that are decoded
and dropped. The decoder is a stack of convolutions whose reach is about 12 frames on each
side, so with 16 context frames every kept sample sees the same input as in one-shot decoding:
concatenated chunks match the one-shot waveform to about 1e-6, with no crossfade needed
(tests/serve/test_serve_streaming.py). onnxruntime graphs are one opaque call, and other families
hand out whole sentences: they stream sentence by sentence instead.

SSE: ``speech.audio.delta`` events carry base64 audio bytes, then one ``speech.audio.done``,
as in OpenAI's speech API.
"""
from __future__ import annotations

import asyncio
import base64
import json
from concurrent.futures import Executor
from typing import AsyncIterator, Iterator

import numpy as np
import torch

from serve.batching import SentenceJob, batch_request


def decoder_chunks(voice, job: SentenceJob, noise_channels: int | None, chunk_frames: int,
                   context_frames: int) -> Iterator[np.ndarray]:
    """Waveform pieces (T_chunk,) float32 of one sentence; ``voice`` offers ``decoder_latent`` and a
    ``decoder`` part (``ServedModel.decoder_streaming``).

    Same noise as the batched path (``batch_request`` of the one job), so the concatenation
    equals ``synthesize_jobs(voice, [job], noise_channels)[0]`` up to float rounding.
    """
    if chunk_frames < 1 or context_frames < 0:
        raise ValueError(f"chunk_frames must be >= 1 and context_frames >= 0, got {chunk_frames}, {context_frames}")
    latent = voice.decoder_latent(batch_request([job], noise_channels))
    decoder = voice.parts()["decoder"]
    frames = int(latent.frame_lengths[0])
    z = latent.z[:, :, :frames]  # (1, C_lat, T_frames)
    for start in range(0, frames, chunk_frames):
        end = min(frames, start + chunk_frames)
        window_start, window_end = max(0, start - context_frames), min(frames, end + context_frames)
        with torch.inference_mode():
            window = decoder(z[:, :, window_start:window_end], latent.speaker_embedding)  # (1, 1, T_window)
        samples_per_frame = window.shape[-1] // (window_end - window_start)
        keep_from = (start - window_start) * samples_per_frame
        yield window[0, 0, keep_from: keep_from + (end - start) * samples_per_frame].float().cpu().numpy()


async def iterate_blocking(iterator: Iterator, executor: Executor) -> AsyncIterator:
    """Each ``next(iterator)`` on ``executor``: a blocking generator as an async one."""
    loop = asyncio.get_running_loop()
    done = object()
    while True:
        item = await loop.run_in_executor(executor, next, iterator, done)
        if item is done:
            return
        yield item


def sse_event(payload: dict) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def sse_stream(audio_bytes: AsyncIterator[bytes], usage: dict) -> AsyncIterator[bytes]:
    """``speech.audio.delta`` per chunk of ``audio_bytes`` (base64), then ``speech.audio.done``."""
    async for chunk in audio_bytes:
        if chunk:
            yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode("ascii")})
    yield sse_event({"type": "speech.audio.done", "usage": usage})
