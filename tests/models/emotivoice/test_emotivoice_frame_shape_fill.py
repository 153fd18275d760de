"""Filling the frame shapes between those a warm-up met (BucketedEngine.fill_frame_shapes, the served
engine's ``fill_frame_shapes`` option): after it, batches of mixed sentences meet no new frame-stage
shape inside the warmed range. On the CPU the graph cache is a recorder that runs each stage eagerly
(scripts/emotivoice_frame_shape_fill.py), so the keys are the engine's own and the stand-in inputs
really go through the tiny model's frame stage."""
from __future__ import annotations

import types

import pytest

from models.emotivoice.engine_voice import ServedEngineOptions, bucketed_engine
from models.emotivoice.tiny import tiny_voice
from scripts.emotivoice_frame_shape_fill import recorded_engine_voice, shapes_met_first
from serve.speech import capture_shapes_between


@pytest.fixture(scope="module")
def voice():
    return tiny_voice(0)


def test_after_the_fill_mixed_batches_meet_no_new_shape_inside_the_warmed_range(voice):
    arm = shapes_met_first(voice, fill=True)
    assert arm["filled"] > 0 and not arm["met_first_inside_warmed_range"]
    # Captured as synthesis runs: in inference mode, so no graph would keep autograd state alive.
    assert all(arm["engine"].engine.cache.captured.values())


def test_without_the_fill_the_same_batches_meet_new_shapes_inside_the_warmed_range(voice):
    """The same load without the fill: what the other test's assertion would catch."""
    arm = shapes_met_first(voice, fill=False)
    assert arm["filled"] == 0 and arm["met_first_inside_warmed_range"]


def test_group_rows_are_the_padded_group_sizes_and_need_batch_buckets(voice):
    # Buckets 1-16, up to 4 groups of at least 2 rows: batches of 2 and 3 run whole (2 and 4 rows), 4 to 7
    # in groups of 2 (and a last of 1), 8 to 16 in groups of 4 (and a last of 1), so runs have 1, 2 or 4 rows.
    assert recorded_engine_voice(voice, fill=True).engine.group_rows(16) == [1, 2, 4]
    unbucketed, _, _ = bucketed_engine(voice, "eager", False, None, ())
    with pytest.raises(ValueError, match="needs batch buckets"):
        unbucketed.engine.group_rows(16)


def test_the_fill_is_off_by_default_and_refused_where_it_cannot_pay(voice):
    assert ServedEngineOptions().fill_frame_shapes is False
    with pytest.raises(ValueError, match="fill_frame_shapes=1"):
        ServedEngineOptions(fill_frame_shapes=1)
    with pytest.raises(ValueError, match="needs compile_dynamic=true"):  # a compile per filled shape
        bucketed_engine(voice, "compile", False, None, (1, 2), options=ServedEngineOptions(fill_frame_shapes=True))
    eager, _, _ = bucketed_engine(voice, "eager", False, None, (1, 2, 4),
                                  options=ServedEngineOptions(fill_frame_shapes=True))
    assert eager.complete_warm_up(4) == 0  # no graphs, nothing a batch would wait for


def test_the_server_asks_a_model_that_can_fill_with_its_largest_batch():
    asked = []
    model = types.SimpleNamespace(complete_warm_up=lambda max_batch: asked.append(max_batch) or 7)
    settings = types.SimpleNamespace(max_batch_size=1024)
    assert capture_shapes_between(types.SimpleNamespace(model=model), settings) == 7 and asked == [1024]
    assert capture_shapes_between(types.SimpleNamespace(model=object()), settings) == 0
