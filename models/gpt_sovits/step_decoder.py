"""A GPT-SoVITS v2 voice decoded by token steps for the server (models.interface.TokenStepDecoder):
sentences join the static-cache engine (models/gpt_sovits/engine.py) between steps and leave it
as soon as their semantic tokens stop; SoVITS then turns each finished sentence into audio.

    decoder = voice.step_decoder(max_rows=64)
    decoder.join("a", request)            # one sentence; its prompt is prefilled now
    while decoder.active:
        for key, result in decoder.step():  # the sentences that finished with this step
            ...

``step_chunks`` instead of ``step`` streams (models.interface.StreamingTokenStepDecoder): each row's
audio leaves in chunks while it decodes (models/gpt_sovits/streaming.py), the first once it has
``chunking.first_chunk_tokens`` tokens. A decoder is driven by one of the two, never both.

    for key, waveform, last in decoder.step_chunks():   # (samples,) each, in order per row
        ...

The engine runs on the voice's device in the voice's dtype (float32 eager on a CPU; CUDA graphs
are captured by ``capture_graphs`` on a GPU), with the voice's dynamic int8 Linear layers where the
int8_dynamic variant converted them (models/dynamic_int8.py; CPU). Greedy sentences decode the same
tokens alone or in any batch; sampled ones draw from the engine's one generator, so their tokens
depend on their neighbours (seeded per engine, not per sentence).
"""
from __future__ import annotations

import importlib.util
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from models.gpt_sovits.engine import T2SEngine, T2SRequest, T2SResult
from models.gpt_sovits.engine_weights import T2SWeights
from models.gpt_sovits.prompt import Prompt, pad_results
from models.gpt_sovits.streaming import (
    DEFAULT_CHUNKING,
    ChunkSettings,
    TokenAudioStream,
)
from models.interface import SynthesisRequest, SynthesisResult

CACHE_POSITIONS = 2048  # text + prompt + tokens of one sentence; the engine's default and a multiple of 16


@dataclass
class _Row:
    request_id: int
    phoneme_ids: tuple[int, ...]
    prompt: Prompt
    sampling: object  # GptSovitsSampling
    stream: TokenAudioStream | None = None  # made by the first ``step_chunks`` (``step`` needs none)
    steps: int = 0  # decode steps run since the prompt's prefill chose the first token


def semantic_tokens(result: T2SResult, prompt_tokens: torch.Tensor) -> torch.Tensor:
    """What SoVITS speaks: the official ``y[-idx:]`` of the prompt followed by the kept tokens."""
    y = torch.cat([prompt_tokens, result.tokens])
    idx = result.official_idx
    return y[-idx:] if idx else y


MAX_STEPS_UNREAD = 8  # streaming: token steps between two reads of the stop flags, at most


def fastest_engine(weights: T2SWeights, max_rows: int, sync_every: int) -> T2SEngine:
    """The engine for the weights' device: on CUDA with Triton, the persistent step at batch 1 and
    the fused / cuBLAS + attention-kernel steps above it (``engine_persistent``, ``engine_triton``;
    every step reads only each row's valid keys, so one length bucket serves all); else, and for
    dynamic int8 projections (whose kernels are the torch step's), the torch step."""
    if weights.device.type != "cuda" or weights.int8_projections or importlib.util.find_spec("triton") is None:
        return T2SEngine(weights, max_batch=max_rows, max_len=CACHE_POSITIONS, sync_every=sync_every)
    # Imported here: Triton exists on GPU machines only, not in the CPU install.
    from models.gpt_sovits.engine_persistent import PersistentT2SEngine
    from models.gpt_sovits.engine_triton import TritonT2SEngine

    buckets = {"max_batch": max_rows, "max_len": CACHE_POSITIONS, "length_buckets": [CACHE_POSITIONS],
               "sync_every": sync_every}
    sm_count = torch.cuda.get_device_properties(weights.device).multi_processor_count
    if sm_count >= PersistentT2SEngine.least_programs(weights.config.num_heads):
        return PersistentT2SEngine(weights, **buckets)
    return TritonT2SEngine(weights, **buckets)


class GptSovitsStepDecoder:
    """``TokenStepDecoder`` over one engine of ``max_rows`` slots."""

    def __init__(self, voice, max_rows: int, sync_every: int = 1, chunking: ChunkSettings = DEFAULT_CHUNKING):
        """``voice``: a GptSovitsVoice (models/gpt_sovits/voice.py, which hands these out)."""
        weights = T2SWeights.from_model(voice.t2s)
        self.voice = voice
        self.max_rows = max_rows
        self.chunking = chunking
        # sync_every 1: a finished sentence leaves at the step it stops (its audio is not held back).
        self.engine = fastest_engine(weights, max_rows, sync_every)
        self._rows: dict[Hashable, _Row] = {}
        self._keys: dict[int, Hashable] = {}  # engine request id -> row key
        self._cancelled: set[int] = set()

    @property
    def active(self) -> int:
        return len(self._rows)

    def join(self, key: Hashable, request: SynthesisRequest) -> None:
        if len(self._rows) >= self.max_rows:
            raise ValueError(f"all {self.max_rows} rows are decoding; wait for one to finish")
        if request.phoneme_ids.shape[0] != 1:
            raise ValueError(f"a row decodes one sentence; got a batch of {request.phoneme_ids.shape[0]}")
        voice = self.voice
        voice.capabilities.check(request.voice, voice.family)
        reference = request.voice.reference if request.voice and request.voice.reference else voice.default_reference
        prompt = voice.prompt_of(reference)
        ids = tuple(int(i) for i in request.phoneme_ids[0, : int(request.phoneme_lengths[0])])
        sampling = voice.sentence_sampling(request.sampling, len(ids))
        text_ids, bert = voice.decode_input(ids, prompt)
        request_id = self.engine.submit(T2SRequest(
            phoneme_ids=text_ids, bert_features=bert, prompt_tokens=prompt.tokens, top_k=sampling.top_k,
            top_p=sampling.top_p, temperature=sampling.temperature,
            repetition_penalty=sampling.repetition_penalty, max_steps=sampling.max_tokens))
        self.engine.admit()  # a free slot exists: the prompt is prefilled now
        self._rows[key] = _Row(request_id, ids, prompt, sampling)
        self._keys[request_id] = key

    def step(self) -> list[tuple[Hashable, SynthesisResult]]:
        self.engine.advance(1)
        finished = []
        for key, row, result in self._collect():
            tokens = semantic_tokens(result, row.prompt.tokens)
            waveform = self.voice.tokens_to_audio(tokens, row.phoneme_ids, row.prompt, row.sampling)
            finished.append((key, pad_results([waveform], [tokens], self.voice.sample_rate_hz)))
        return finished

    def step_chunks(self) -> list[tuple[Hashable, torch.Tensor, bool]]:
        """Token steps up to the next chunk due (at most MAX_STEPS_UNREAD); the audio chunks made
        with them: (key, waveform (samples,), last). A row that
        finished hands out the rest of its audio (last=True); a row whose tokens reached its next
        chunk hands out that chunk. The chunks of a row joined are its sentence's audio, spoken
        from every generated token (the whole-sentence path, after a max_tokens stop, drops the
        first one as the official ``y[-idx:]`` does; a stream has spoken it already)."""
        # Steps until the earliest chunk is due run without reading the stop flags (a host sync per
        # read), at most MAX_STEPS_UNREAD: a row that stops meanwhile is seen that much later.
        due_in = [self._stream_of(row).next_chunk_end - (row.steps + 1) for row in self._rows.values()]
        steps = max(1, min([MAX_STEPS_UNREAD, *due_in]))
        self.engine.advance(steps)
        chunks = [(key, self._stream_of(row).finish(result.tokens), True) for key, row, result in self._collect()]
        for key, row in self._rows.items():
            row.steps += steps
            stream = self._stream_of(row)
            # The prefill chose one token and each step one more: read them (a host sync) only when due.
            if row.steps + 1 >= stream.next_chunk_end:
                for chunk in stream.push(self.engine.tokens_so_far(row.request_id)):
                    chunks.append((key, chunk, False))
        return chunks

    def _collect(self) -> list[tuple[Hashable, _Row, T2SResult]]:
        """The rows that stopped (one host sync), removed from the decoder; cancelled ones dropped."""
        stopped = []
        for request_id in self.engine.collect():
            result = self.engine.result(request_id)
            key = self._keys.pop(request_id)
            if request_id in self._cancelled:
                self._cancelled.discard(request_id)
                continue
            stopped.append((key, self._rows.pop(key), result))
        return stopped

    def _stream_of(self, row: _Row) -> TokenAudioStream:
        if row.stream is None:
            row.stream = self.voice.audio_stream(row.phoneme_ids, row.prompt, row.sampling, self.chunking)
        return row.stream

    def cancel(self, key: Hashable) -> None:
        """Forget row ``key``: the engine's slot finishes its step count unheard (the engine has no
        eviction); its audio is never made."""
        row = self._rows.pop(key, None)
        if row is not None:
            self._cancelled.add(row.request_id)
