"""A GPT-SoVITS v2 voice decoded by token steps for the server (models.interface.TokenStepDecoder):
sentences join the static-cache engine (models/gpt_sovits/engine.py) between steps and leave it
as soon as their semantic tokens stop; SoVITS then turns each finished sentence into audio.

    decoder = voice.step_decoder(max_rows=64)
    decoder.join("a", request)            # one sentence; its prompt is prefilled now
    while decoder.active:
        for key, result in decoder.step():  # the sentences that finished with this step
            ...

The engine runs on the voice's device in the voice's dtype (float32 eager on a CPU; CUDA graphs
are captured by ``capture_graphs`` on a GPU). Greedy sentences decode the same tokens alone or in
any batch; sampled ones draw from the engine's one generator, so their tokens depend on their
neighbours (seeded per engine, not per sentence).
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from models.gpt_sovits.engine import T2SEngine, T2SRequest, T2SResult
from models.gpt_sovits.engine_weights import T2SConfig as EngineConfig
from models.gpt_sovits.engine_weights import T2SWeights
from models.gpt_sovits.prompt import Prompt, pad_results
from models.interface import SynthesisRequest, SynthesisResult

CACHE_POSITIONS = 2048  # text + prompt + tokens of one sentence; the engine's default and a multiple of 16


@dataclass
class _Row:
    request_id: int
    phoneme_ids: tuple[int, ...]
    prompt: Prompt
    sampling: object  # GptSovitsSampling


def semantic_tokens(result: T2SResult, prompt_tokens: torch.Tensor) -> torch.Tensor:
    """What SoVITS speaks: the official ``y[-idx:]`` of the prompt followed by the kept tokens."""
    y = torch.cat([prompt_tokens, result.tokens])
    idx = result.official_idx
    return y[-idx:] if idx else y


class GptSovitsStepDecoder:
    """``TokenStepDecoder`` over one engine of ``max_rows`` slots."""

    def __init__(self, voice, max_rows: int, sync_every: int = 1):
        """``voice``: a GptSovitsVoice (models/gpt_sovits/voice.py, which hands these out)."""
        t2s = voice.t2s
        parameter = t2s.ar_predict_layer.weight
        config = EngineConfig(vocab_size=t2s.config.vocab_size, phoneme_vocab_size=t2s.config.phoneme_vocab_size,
                              hidden_dim=t2s.config.hidden_dim, num_heads=t2s.config.heads,
                              num_layers=t2s.config.layers, eos_id=t2s.config.eos_id)
        weights = T2SWeights.from_state_dict(config, t2s.state_dict(), parameter.dtype, parameter.device)
        self.voice = voice
        self.max_rows = max_rows
        # sync_every 1: a finished sentence leaves at the step it stops (its audio is not held back).
        self.engine = T2SEngine(weights, max_batch=max_rows, max_len=CACHE_POSITIONS, sync_every=sync_every)
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
        sampling = voice.sampling_of(request)
        ids = tuple(int(i) for i in request.phoneme_ids[0, : int(request.phoneme_lengths[0])])
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
        for request_id in self.engine.collect():
            result = self.engine.result(request_id)
            key = self._keys.pop(request_id)
            if request_id in self._cancelled:
                self._cancelled.discard(request_id)
                continue
            row = self._rows.pop(key)
            tokens = semantic_tokens(result, row.prompt.tokens)
            waveform = self.voice.tokens_to_audio(tokens, row.phoneme_ids, row.prompt, row.sampling)
            finished.append((key, pad_results([waveform], [tokens], self.voice.sample_rate_hz)))
        return finished

    def cancel(self, key: Hashable) -> None:
        """Forget row ``key``: the engine's slot finishes its step count unheard (the engine has no
        eviction); its audio is never made."""
        row = self._rows.pop(key, None)
        if row is not None:
            self._cancelled.add(row.request_id)
