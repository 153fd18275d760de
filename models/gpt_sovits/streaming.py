"""A GPT-SoVITS v2 sentence's audio in chunks while its semantic tokens are still being decoded.

    stream = voice.audio_stream(phoneme_ids, prompt, sampling)    # a TokenAudioStream
    for tokens in growing_token_sequence:                          # (n,) the tokens so far
        for chunk in stream.push(tokens):                          # (samples,) each
            play(chunk)
    play(stream.finish(all_tokens))                                # at EOS: the rest

How: the first chunk is decoded once ``first_chunk_tokens`` tokens exist, then one every
``chunk_tokens``. Each chunk runs SoVITS on a window of tokens: the new ones, preceded by
``left_context_tokens`` already spoken (decoded again and dropped), with the sentence's whole
phone sequence (known before the first token). The audio of a window's last ``holdback_tokens``
tokens, decoded without anything to their right, is held back: the next window, which sees them
with context on both sides, speaks them, its first ``crossfade_tokens`` blended in from the
held-back audio by a raised cosine. The concatenated chunks are exactly as long as one decode of
the whole sentence (at speed 1), and the prior noise at each latent frame is the same as in that
decode (``frame_noise``), so they differ only where a window's attention and convolutions see less
than the whole sentence: ``seam_error`` measures by how much. On full-size random weights, 110
tokens in 5 chunks with the defaults: SNR 44 dB against one decode, at most 1.4e-4 off (peak 0.017)
near the seams as elsewhere; with no context, hold-back or cross-fade, 13.5 dB and 0.012
(tests/models/gpt_sovits/test_gpt_sovits_streaming.py; scripts/bench_gpt_sovits_first_chunk.py).

Why a window and not the official streaming's re-encoding of every token so far: the official
``decode_streaming`` runs the prior encoder over the whole prefix for every chunk (cost grows
with the sentence); a window keeps each chunk's cost fixed. SoVITS's encoders attend globally, so
neither is exact. What matters most is the hold-back: on the same full-size run, one held-back
token cross-faded whole gave 20 dB, four 44 dB; left context past 10 tokens changed little.
At another speed (``length_scale`` != 1) a window's frame count is rounded, so chunk boundaries
fall within a frame of where one decode puts them.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ChunkSettings:
    """How a sentence's tokens are cut into audio chunks, in semantic tokens (the model's samples per
    token turn them into samples: 1280 for SoVITS v2 at 32 kHz). Defaults: 25 tokens are 1 s of audio
    at the 25 Hz semantic rate, so the first chunk is decoded once 1 s of tokens exists."""

    first_chunk_tokens: int = 25
    chunk_tokens: int = 25
    # Decoded before the first sample a window speaks, then dropped: what the window's attention and
    # convolutions see of the past.
    left_context_tokens: int = 10
    # A window's last tokens have no right context, so they are held back and spoken by the next
    # window (which sees them with context on both sides); the first chunk is this much shorter.
    holdback_tokens: int = 4
    crossfade_tokens: int = 1  # the seam: from the held-back audio into the next window's, by a raised cosine

    def __post_init__(self):
        for name in ("first_chunk_tokens", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: a chunk needs at least 1 token")
        for name in ("left_context_tokens", "holdback_tokens", "crossfade_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: use 0 or more tokens")
        shortest = min(self.first_chunk_tokens, self.chunk_tokens)
        if self.holdback_tokens >= shortest:
            raise ValueError(f"holdback_tokens={self.holdback_tokens}: a chunk must speak something; use fewer "
                             f"than its {shortest} tokens (first_chunk_tokens, chunk_tokens)")
        if self.crossfade_tokens > self.holdback_tokens:
            raise ValueError(f"crossfade_tokens={self.crossfade_tokens}: the cross-fade runs over held-back "
                             f"audio; use at most holdback_tokens={self.holdback_tokens}")


DEFAULT_CHUNKING = ChunkSettings()


def frame_noise(seed: int, first_frame: int, frames: int, channels: int) -> torch.Tensor:
    """(1, channels, frames) standard-normal prior noise of latent frames ``first_frame ..``: drawn
    frame-major from ``seed``, so a frame's noise does not depend on how many frames a decode has
    (a chunk's window draws what one decode of the whole sentence draws at the same frames)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(first_frame + frames, channels, generator=generator)  # (T, C)
    return noise[first_frame:].T.unsqueeze(0)  # (1, C, frames)


def crossfade(outgoing: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """Two (n,) renderings of the same samples -> (n,): from ``outgoing`` to ``incoming`` by a raised
    cosine whose two gains sum to 1 (the two renderings are of one signal, so their amplitudes add)."""
    n = outgoing.numel()
    fade_in = 0.5 - 0.5 * torch.cos(math.pi * (torch.arange(n, dtype=torch.float32) + 0.5) / n)  # (n,)
    fade_in = fade_in.to(incoming.device, incoming.dtype)
    return outgoing * (1 - fade_in) + incoming * fade_in


class TokenAudioStream:
    """One sentence: its growing tokens in, audio chunks out (module docstring).

    ``decode_window(tokens (n,), first_token) -> (samples,)``: the audio of ``tokens``, which start at
    token ``first_token`` of the sentence (where its prior noise starts). ``samples_per_token``: the
    model's output samples per semantic token (SoVITS v2 at 32 kHz: 1280)."""

    def __init__(self, decode_window: Callable[[torch.Tensor, int], torch.Tensor], samples_per_token: int,
                 settings: ChunkSettings = DEFAULT_CHUNKING):
        if samples_per_token < 1:
            raise ValueError(f"samples_per_token={samples_per_token}: must be >= 1")
        self.decode_window = decode_window
        self.samples_per_token = samples_per_token
        self.settings = settings
        self.decoded_tokens = 0  # tokens the last window reached
        self.spoken_tokens = 0  # tokens whose audio has been handed out (the held-back ones not yet)
        self.chunks_made = 0
        self._held: torch.Tensor | None = None  # the last window's held-back samples

    @property
    def next_chunk_end(self) -> int:
        """How many tokens must exist before the next chunk is decoded."""
        step = self.settings.first_chunk_tokens if self.chunks_made == 0 else self.settings.chunk_tokens
        return self.decoded_tokens + step

    def push(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """``tokens`` (n,): every token of the sentence so far. The chunks (samples,) now due, in order."""
        chunks = []
        while tokens.numel() >= self.next_chunk_end:
            chunks.append(self._decode(tokens, self.next_chunk_end, last=False))
        return chunks

    def finish(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` (n,): all of the sentence's tokens. The rest of its audio (samples,)."""
        if tokens.numel() < self.decoded_tokens:
            raise ValueError(f"finish got {tokens.numel()} tokens but {self.decoded_tokens} were already decoded: "
                             "pass the whole sentence's tokens")
        return self._decode(tokens, tokens.numel(), last=True)

    def _decode(self, tokens: torch.Tensor, end: int, last: bool) -> torch.Tensor:
        held = self._held if self._held is not None else torch.zeros(0)
        self._held = None
        if end == self.decoded_tokens:  # nothing new since the last window: its held-back audio is all that is left
            return held
        start = self.spoken_tokens
        context_from = max(0, start - self.settings.left_context_tokens)
        window = self.decode_window(tokens[context_from:end], context_from)  # (W,)
        held = held.to(window.device, window.dtype)
        # Where token ``start`` falls in the window (W = n x samples per token at speed 1; scaled otherwise).
        boundary = round((start - context_from) * window.numel() / (end - context_from))
        fade = min(self.settings.crossfade_tokens * self.samples_per_token, held.numel(), window.numel() - boundary)
        piece = torch.cat([crossfade(held[:fade], window[boundary: boundary + fade]), window[boundary + fade:]])
        self.decoded_tokens = end
        self.chunks_made += 1
        if last:
            self.spoken_tokens = end
            return piece
        self.spoken_tokens = end - self.settings.holdback_tokens
        hold = round(self.settings.holdback_tokens * window.numel() / (end - context_from))
        self._held = piece[piece.numel() - hold:]
        return piece[: piece.numel() - hold]


@dataclass(frozen=True)
class SeamError:
    """How a streamed sentence differs from one decode of the same tokens."""

    snr_db: float  # the whole decode over the difference, in dB
    max_abs_error_near_seams: float  # within ``seam_radius_samples`` of a chunk boundary
    max_abs_error_elsewhere: float
    chunks: int
    samples: int

    def as_dict(self) -> dict:
        return dict(vars(self))


def seam_error(streamed: list[torch.Tensor], whole: torch.Tensor, seam_radius_samples: int) -> SeamError:
    """Compare chunks (each (samples,)) against ``whole`` (samples,), one decode of the same tokens."""
    joined = torch.cat([chunk.float().cpu() for chunk in streamed]).numpy().astype(np.float64)
    reference = whole.float().cpu().numpy().astype(np.float64)
    if joined.shape != reference.shape:
        raise ValueError(f"streamed chunks hold {joined.size} samples but the whole decode {reference.size}: "
                         "compare the same tokens at speed 1")
    difference = np.abs(joined - reference)
    near = np.zeros(joined.size, dtype=bool)
    for boundary in np.cumsum([chunk.numel() for chunk in streamed])[:-1]:
        near[max(0, boundary - seam_radius_samples): boundary + seam_radius_samples] = True
    signal, noise = float(np.sum(reference ** 2)), float(np.sum(difference ** 2))
    snr_db = math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)
    return SeamError(snr_db=snr_db,
                     max_abs_error_near_seams=float(difference[near].max()) if near.any() else 0.0,
                     max_abs_error_elsewhere=float(difference[~near].max()) if (~near).any() else 0.0,
                     chunks=len(streamed), samples=int(joined.size))
