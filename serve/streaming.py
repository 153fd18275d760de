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

Sending: ``PacedAudioResponse`` holds a client to real time. The time it keeps a send waiting
(the socket full because the client does not read) builds a debt, which the audio seconds
those bytes carry pay back; past ``grace_s`` of debt the connection is dropped. A player that
reads as it plays never runs into debt, however far ahead synthesis is; a client that never
reads is dropped ``grace_s`` plus the length of the chunk in flight after the kernel's buffers
fill. Chunks are sent as they are made (a sentence, or a decoder window): one send of a sentence
writes it all into the transport and waits until the client has read most of it, which a
real-time player takes the sentence's length to do.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from concurrent.futures import Executor
from typing import AsyncIterator, Callable, Iterator

import numpy as np
import torch
from starlette.responses import StreamingResponse

from serve.batching import SentenceJob, batch_request
from serve.client_limits import ClientConnection

log = logging.getLogger(__name__)


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


class PacedAudioResponse(StreamingResponse):
    """A streamed audio body whose client must keep up with real time (module docstring).

    ``bytes_per_audio_s``: how many body bytes carry one second of audio (2 x the sample rate for
    16-bit PCM, 4/3 of that in base64 for SSE). ``on_slow_reader()`` runs once if the client is dropped."""

    def __init__(self, content: AsyncIterator[bytes], *, connection: ClientConnection, bytes_per_audio_s: float,
                 grace_s: float, on_slow_reader: Callable[[], None], media_type: str, headers: dict[str, str]):
        super().__init__(content, media_type=media_type, headers=headers)
        self.connection = connection
        self.bytes_per_audio_s = bytes_per_audio_s
        self.grace_s = grace_s
        self.on_slow_reader = on_slow_reader

    async def stream_response(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        debt_s = 0.0  # how long the client has kept sends waiting beyond the audio it was given
        try:
            async for chunk in self.body_iterator:
                if self.connection.cut:
                    break
                audio_s = len(chunk) / self.bytes_per_audio_s
                sent_at_s = time.monotonic()
                try:
                    await asyncio.wait_for(send({"type": "http.response.body", "body": chunk, "more_body": True}),
                                           self.grace_s - debt_s + audio_s)
                except asyncio.TimeoutError:
                    self.on_slow_reader()
                    log.warning("slow reader disconnected: more than %g s behind real time "
                                "(serve.slow_client_grace_s)", self.grace_s)
                    await self.connection.cut_off()
                    return
                debt_s = max(0.0, debt_s + time.monotonic() - sent_at_s - audio_s)
        finally:
            # Closing the audio generator now, not when it is collected, stops the synthesis of a
            # client that is gone and gives its admission slot back.
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
        if self.connection.cut:  # the stream was cut short (past its deadline): no final chunk
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
