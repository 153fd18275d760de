"""GPT-SoVITS v2's own measures of a variant (``Family.measure_variant``), logged beside the generic
ones by the pipeline (compress/pipeline.py):

    measured = measure_variant(voice, utterances, sampling, None)                 # the teacher
    measure_variant(lite, utterances, sampling, measured.reference).metrics      # a variant, against it

* ``t2s_tokens_per_s``: semantic tokens the transformer decodes per second, prefill included (greedy);
* ``first_chunk_ms``: the first utterance's first ``FIRST_CHUNK_TOKENS`` tokens and their audio,
  from its phones (what a stream waits for before it can play);
* ``t2s_kv_cache_peak_mib`` and ``t2s_memory_peak_mib``: the transformer's key/value cache at the
  longest utterance's last step, and that plus its weights;
* ``t2s_token_agreement``: the fraction of greedy tokens equal to the reference variant's at the same
  positions, same prompt and same text (a position only one of them reached counts as unequal), and
  ``t2s_tokens_before_divergence``, the mean count of leading tokens equal.

Greedy decoding (top-k 1, the run's repetition penalty) makes the tokens a function of the weights
alone, so agreement says how far a compressed transformer moved from its teacher.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from models.family import VariantMeasures
from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.t2s_decode import decode
from models.interface import Utterance

FIRST_CHUNK_TOKENS = 25  # 1 s of audio at 25 tokens per second: a first chunk worth playing
MIB = 1024 * 1024


def greedy_sampling(sampling: GptSovitsSampling) -> GptSovitsSampling:
    """The run's sampling made deterministic (top-k 1, no prior noise); each sentence's decode holds
    it to the voice's ``token_cap``."""
    return dataclasses.replace(GptSovitsSampling.of(sampling), top_k=1, noise_scale=0.0)


def _state_bytes(module: torch.nn.Module) -> int:
    """Bytes of the weights and buffers a module holds (a dynamic int8 Linear's are int8 and float32 buffers)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def kv_cache_bytes(t2s, positions: int) -> int:
    """Keys and values of every layer for ``positions`` columns, batch 1, in the cache's dtype (the
    transformer's activations: its embeddings' dtype)."""
    config = t2s.config
    element = t2s.ar_audio_embedding.word_embeddings.weight.element_size()
    return config.layers * 2 * positions * config.hidden_dim * element


def agreement(tokens: list[torch.Tensor], reference: list[torch.Tensor]) -> tuple[float, float]:
    """(fraction of positions equal, mean leading tokens equal) of ``tokens`` against ``reference``,
    utterance by utterance; a position only one of the two reached counts as unequal."""
    if len(tokens) != len(reference):
        raise ValueError(f"{len(tokens)} utterances of tokens against {len(reference)} of the reference")
    equal = positions = 0
    leading = []
    for ours, theirs in zip(tokens, reference):
        shared = min(ours.numel(), theirs.numel())
        same = ours[:shared] == theirs[:shared]  # (shared,)
        equal += int(same.sum())
        positions += max(ours.numel(), theirs.numel())
        differ = (~same).nonzero()
        leading.append(shared if differ.numel() == 0 else int(differ[0, 0]))
    return (equal / positions if positions else 1.0), sum(leading) / len(leading)


@torch.inference_mode()
def measure_variant(voice, utterances: list[Utterance], sampling: GptSovitsSampling,
                    reference: list[torch.Tensor] | None, timed: bool = True) -> VariantMeasures:
    """``voice``: a GptSovitsVoice (any variant: fp16 parts, int8 Linear layers, a Lite transformer);
    ``reference``: the reference variant's greedy tokens per utterance, or None for the reference;
    ``timed`` False (a GPU-only precision on the CPU): no tokens/s and no first chunk, whose CPU
    figures say nothing of how it ships."""
    if not utterances:
        raise ValueError("measure_variant needs at least one utterance")
    greedy = greedy_sampling(sampling)
    prompt = voice.prompt_of(voice.default_reference)  # cached: every variant decodes after the same prompt

    metrics = {}
    if timed:
        first = utterances[0].phoneme_ids
        start = time.perf_counter()
        text_ids, bert = voice.decode_input(first, prompt)
        chunk = decode(voice.t2s, text_ids, bert, prompt.tokens,
                       dataclasses.replace(greedy, max_tokens=FIRST_CHUNK_TOKENS))
        voice.tokens_to_audio(chunk.tokens, first, prompt, greedy)
        metrics["first_chunk_ms"] = (time.perf_counter() - start) * 1e3

    tokens, seconds, longest = [], 0.0, 0
    for utterance in utterances:
        text_ids, bert = voice.decode_input(utterance.phoneme_ids, prompt)
        sentence = voice.sentence_sampling(greedy, len(utterance.phoneme_ids))
        start = time.perf_counter()
        decoded = decode(voice.t2s, text_ids, bert, prompt.tokens, sentence)
        seconds += time.perf_counter() - start
        tokens.append(decoded.tokens)
        longest = max(longest, text_ids.numel() + prompt.tokens.numel() + decoded.tokens.numel())
    cache_bytes = kv_cache_bytes(voice.t2s, longest)
    if timed:
        metrics["t2s_tokens_per_s"] = sum(t.numel() for t in tokens) / seconds
    metrics["t2s_kv_cache_peak_mib"] = cache_bytes / MIB
    metrics["t2s_memory_peak_mib"] = (cache_bytes + _state_bytes(voice.t2s)) / MIB
    if reference is not None:
        metrics["t2s_token_agreement"], metrics["t2s_tokens_before_divergence"] = agreement(tokens, reference)
    return VariantMeasures(metrics, tokens)
