"""Filling the frame shapes between those a warm-up met (BucketedEngine.fill_frame_shapes, the served
engine's ``fill_frame_shapes`` option): after it, batches of mixed sentences meet no new frame-stage
shape inside the warmed range. On the CPU the graph cache is a recorder that runs each stage eagerly, so
the keys are the engine's own and the stand-in inputs really go through the tiny model's frame stage."""
from __future__ import annotations

import random
import types

import pytest
import torch

from models.cuda_graphs import as_tuple
from models.emotivoice.engine_voice import ServedEngineOptions, bucketed_engine
from models.emotivoice.tiny import tiny_voice
from models.interface import SynthesisRequest
from serve.speech import capture_shapes_between

WORDS = "the train leaves at nine and we will all be there before the doors close again".split()
BATCH_BUCKETS = (1, 2, 4, 8, 16)


class RecordingCache:
    """GraphCache's bookkeeping without a GPU: each stage runs eagerly, and every key met is kept."""

    def __init__(self):
        self.captured: dict[tuple, None] = {}

    def run(self, key: tuple, stage: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        self.captured.setdefault(key, None)
        return as_tuple(stage(*inputs))


@pytest.fixture(scope="module")
def voice():
    return tiny_voice(0)


def recorded_engine_voice(voice, fill: bool):
    served, _, _ = bucketed_engine(voice, "eager", False, None, BATCH_BUCKETS,
                                   options=ServedEngineOptions(frame_groups=4, min_group_rows=2, frame_bucket=8,
                                                               fill_frame_shapes=fill))
    served.engine.graphs, served.engine.cache = True, RecordingCache()  # keys recorded, stages run eagerly
    return served


def batch_request(voice, rng: random.Random, rows: int, most_words: int) -> SynthesisRequest:
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(1, most_words))) + "." for _ in range(rows)]
    utterances = [voice.text_to_utterances(sentence)[0] for sentence in sentences]
    return SynthesisRequest.from_utterances(utterances)


def frame_keys(served) -> set[tuple]:
    return {key for key in served.engine.cache.captured if key[0] == "frames"}


def new_keys_under_load(voice, fill: bool) -> tuple[set[tuple], dict[int, int], int]:
    """A warm-up of a few batches, the fill if asked, then mixed batches: (the frame keys the mixed batches
    met first, the longest frame bucket warmed at each text bucket, how many shapes the fill captured)."""
    served = recorded_engine_voice(voice, fill)
    rng = random.Random(0)
    for rows in (16, 4, 1):  # the warm-up: long sentences, so the warmed range covers what follows
        served.synthesize(batch_request(voice, random.Random(rows), rows, len(WORDS)))
    filled = served.complete_warm_up(16)
    warmed = frame_keys(served)
    longest: dict[int, int] = {}
    for _, _, text, bucket in warmed:
        longest[text] = max(bucket, longest.get(text, 0))
    for _ in range(12):
        served.synthesize(batch_request(voice, rng, rng.choice(range(1, 17)), len(WORDS) // 2))
    return frame_keys(served) - warmed, longest, filled


def test_after_the_fill_mixed_batches_meet_no_new_shape_inside_the_warmed_range(voice):
    met_first, longest, filled = new_keys_under_load(voice, fill=True)
    assert filled > 0
    inside = {key for key in met_first if key[2] in longest and key[3] <= longest[key[2]]}
    assert not inside


def test_without_the_fill_the_same_batches_meet_new_shapes_inside_the_warmed_range(voice):
    """The same load without the fill: what the other test's assertion would catch."""
    met_first, longest, filled = new_keys_under_load(voice, fill=False)
    assert filled == 0
    assert any(key[2] in longest and key[3] <= longest[key[2]] for key in met_first)


def test_group_rows_are_the_padded_group_sizes_and_need_batch_buckets(voice):
    served = recorded_engine_voice(voice, fill=True)
    rows = served.engine.group_rows(16)
    assert set(rows) <= set(BATCH_BUCKETS) and rows[0] == 1 and rows[-1] <= 16
    unbucketed, _, _ = bucketed_engine(voice, "eager", False, None, ())
    with pytest.raises(ValueError, match="needs batch buckets"):
        unbucketed.engine.group_rows(16)


def test_the_fill_is_off_by_default_and_needs_graphs(voice):
    assert ServedEngineOptions().fill_frame_shapes is False
    with pytest.raises(ValueError, match="fill_frame_shapes=1"):
        ServedEngineOptions(fill_frame_shapes=1)
    eager, _, _ = bucketed_engine(voice, "eager", False, None, BATCH_BUCKETS,
                                  options=ServedEngineOptions(fill_frame_shapes=True))
    assert eager.complete_warm_up(16) == 0  # no graphs, nothing a batch would wait for


def test_the_server_asks_a_model_that_can_fill_with_its_largest_batch():
    asked = []
    model = types.SimpleNamespace(complete_warm_up=lambda max_batch: asked.append(max_batch) or 7)
    settings = types.SimpleNamespace(max_batch_size=1024)
    assert capture_shapes_between(types.SimpleNamespace(model=model), settings) == 7 and asked == [1024]
    assert capture_shapes_between(types.SimpleNamespace(model=object()), settings) == 0
