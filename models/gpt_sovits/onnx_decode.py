"""Text-to-semantic decoding of one utterance in onnxruntime, over the prefill and decode-step graphs
of models/gpt_sovits/onnx_contract.py: the CPU path that needs no PyTorch model.

    decoder = OnnxT2SDecoder("t2s_prefill.onnx", "t2s_decode_step.onnx", threads=2, eos_id=1024)
    tokens = decoder.decode(phoneme_ids, bert_features, prompt_tokens, sampling)   # as t2s_decode.decode

The prefill's static cache (max_len positions) is cut once per utterance to the positions this
decode can write (text + prompt + max_tokens - 1, rounded up to ``CACHE_BUCKET``), so a step attends
those and not the whole static cache. Each step's new keys and values are written into it by
index. Choosing tokens and stopping is the eager decoder's own loop (``t2s_decode.decode_steps``,
with the generator ``sampling.seed`` gives), so the tokens are the eager decoder's
(tests/models/gpt_sovits/test_gpt_sovits_onnx.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from models.gpt_sovits.t2s_decode import (MIN_STEPS_BEFORE_EOS, check_max_tokens, check_prompt, decode_steps,
                                          make_generator)
from models.sampling import AutoregressiveSampling

CACHE_BUCKET = 64  # cache positions are kept in multiples of this


def _session(path: str | Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxT2SDecoder:
    """The two T2S graphs in onnxruntime sessions on ``threads`` CPU threads; ``decode`` runs one utterance."""

    def __init__(self, prefill_path: str | Path, decode_step_path: str | Path, threads: int, eos_id: int):
        self.prefill = _session(prefill_path, threads)
        self.step = _session(decode_step_path, threads)
        self.eos_id = eos_id

    def decode(self, phoneme_ids: torch.Tensor, bert_features: torch.Tensor, prompt_tokens: torch.Tensor | None,
               sampling: AutoregressiveSampling, eos_from_step: int = MIN_STEPS_BEFORE_EOS) -> torch.Tensor:
        """Tokens (N,) for phoneme_ids (T,), bert_features (1024, T), prompt_tokens (T_prompt,) or None
        (reference-free)."""
        check_max_tokens(sampling)
        phoneme_ids = phoneme_ids.reshape(1, -1).long()  # (1, T)
        if prompt_tokens is None:
            prompt = torch.zeros(1, 0, dtype=torch.long)
        else:
            prompt = prompt_tokens.reshape(1, -1).long()  # (1, T_prompt)
            check_prompt(prompt, self.eos_id)
        logits, keys, values, lengths = self.prefill.run(None, {
            "phoneme_ids": phoneme_ids.numpy(),
            "bert_features": bert_features.reshape(1, bert_features.shape[-2], -1).float().numpy(),
            "text_lengths": np.array([phoneme_ids.shape[1]], np.int64),
            "prompt_tokens": prompt.numpy()})
        # Step s (from 0) writes position lengths + s; the last step that runs is max_tokens - 2.
        written = int(lengths[0]) + sampling.max_tokens - 1
        if written > keys.shape[3]:
            raise ValueError(f"text + prompt + max_tokens - 1 = {written} cache positions; the prefill graph was "
                             f"exported with {keys.shape[3]}")
        cache_positions = min(-(-written // CACHE_BUCKET) * CACHE_BUCKET, keys.shape[3])
        keys = np.ascontiguousarray(keys[:, :, :, :cache_positions])  # (layers, 1, heads, positions, head_dim)
        values = np.ascontiguousarray(values[:, :, :, :cache_positions])

        def next_logits(token: torch.Tensor, step: int) -> torch.Tensor:
            logits, new_keys, new_values = self.step.run(None, {
                "token": token.view(1, 1).numpy(), "audio_position": np.array([prompt.shape[1] + step], np.int64),
                "key_cache": keys, "value_cache": values, "cache_lengths": lengths})
            keys[:, :, :, lengths[0]] = new_keys[:, :, :, 0]  # (layers, 1, heads, head_dim) at the next position
            values[:, :, :, lengths[0]] = new_values[:, :, :, 0]
            lengths[0] += 1
            return torch.from_numpy(logits)

        history, _, _ = decode_steps(torch.from_numpy(logits), next_logits, prompt, sampling, self.eos_id,
                                     eos_from_step, make_generator(sampling, torch.device("cpu")))
        return history[0, prompt.shape[1]:]
