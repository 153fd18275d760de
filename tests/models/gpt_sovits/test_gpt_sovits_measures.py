"""GPT-SoVITS v2's own measures (models/gpt_sovits/measures.py) on tiny random weights: token
agreement on fixed tokens, and every measure of a voice against itself and against a changed copy."""
from __future__ import annotations

import copy

import pytest
import torch

from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.measures import agreement, kv_cache_bytes, measure_variant
from models.gpt_sovits.tiny import tiny_voice
from models.registry import get_family


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


def test_agreement_counts_positions_only_one_reached_as_unequal():
    fraction, leading = agreement([torch.tensor([1, 2, 3]), torch.tensor([7, 8])],
                                  [torch.tensor([1, 2, 4, 5]), torch.tensor([7, 8])])
    assert fraction == pytest.approx(4 / 6)  # 2 of 4, then 2 of 2
    assert leading == pytest.approx((2 + 2) / 2)
    with pytest.raises(ValueError, match="1 utterances of tokens against 2"):
        agreement([torch.tensor([1])], [torch.tensor([1]), torch.tensor([2])])


def test_kv_cache_bytes_follow_the_config(voice):
    config = voice.t2s.config
    assert kv_cache_bytes(voice.t2s, 100) == config.layers * 2 * 100 * config.hidden_dim * 4


def test_a_voice_agrees_with_itself_and_a_changed_copy_does_not(voice):
    utterances = voice.text_to_utterances("Where did Kenji leave his lantern? Thanks so much!")
    sampling = GptSovitsSampling(seed=0, max_tokens=30)
    family = get_family(voice.family)
    reference = family.measure_variant(voice, utterances, sampling, None)
    assert "t2s_token_agreement" not in reference.metrics
    assert reference.metrics["t2s_tokens_per_s"] > 0 and reference.metrics["first_chunk_ms"] > 0
    assert reference.metrics["t2s_memory_peak_mib"] > reference.metrics["t2s_kv_cache_peak_mib"] > 0
    same = measure_variant(voice, utterances, sampling, reference.reference)
    assert same.metrics["t2s_token_agreement"] == 1.0
    assert same.metrics["t2s_tokens_before_divergence"] == pytest.approx(
        sum(t.numel() for t in reference.reference) / len(utterances))
    untimed = measure_variant(voice, utterances, sampling, reference.reference, timed=False).metrics
    assert "t2s_tokens_per_s" not in untimed and "first_chunk_ms" not in untimed  # a GPU-only precision's CPU speed
    assert untimed["t2s_token_agreement"] == 1.0
    changed = copy.deepcopy(voice)
    with torch.no_grad():
        changed.t2s.ar_predict_layer.weight.mul_(-1.0)  # every choice reversed
    other = measure_variant(changed, utterances, sampling, reference.reference).metrics
    assert other["t2s_token_agreement"] < 0.5
