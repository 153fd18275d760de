"""Lite training's machinery on a tiny random teacher: prefetched teacher batches and optimizer states.

    python -m pytest -q tests/models/piper/training/test_lite_training.py

Training itself (a resumed run equals an uninterrupted one) is tested on the real voice in
tests/models/piper/test_lite.py.
"""
from __future__ import annotations

import copy
import threading
from contextlib import closing

import pytest
import torch

from models.piper.training.lite_training import TeacherTargets, load_optimizer_state, prefetched_batches
from models.piper.vits import PiperVits, VitsHyperParams

PHONEME_IDS = [[1, 5, 7, 2, 9, 3], [1, 4, 2], [1, 8, 8, 6, 2, 5, 7, 3, 2]]


def tiny_targets(device: str) -> TeacherTargets:
    torch.manual_seed(0)
    hp = VitsHyperParams(num_symbols=10, hidden_channels=16, filter_channels=32, n_layers=1, latent_channels=8,
                         flow_layers=1, flow_wn_layers=1, dp_filter_channels=16, upsample_initial_channel=16,
                         upsample_rates=(4, 2), upsample_kernel_sizes=(8, 4), resblock_kernel_sizes=(3,),
                         resblock_dilations=((1, 2),))
    return TeacherTargets(PiperVits(hp).eval(), PHONEME_IDS, batch_size=2, segment_frames=4, seed=3, device=device)


def teacher_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("teacher-targets")]


def assert_batches_equal(got: list[dict[str, torch.Tensor]], expected: list[dict[str, torch.Tensor]]) -> None:
    assert len(got) == len(expected)
    for step, (batch, reference) in enumerate(zip(got, expected)):
        assert batch.keys() == reference.keys()
        for key in reference:
            assert torch.equal(batch[key], reference[key]), (step, key)


@pytest.mark.parametrize("prefetch", [False, True])
def test_prefetched_batches_are_the_steps_batches(prefetch):
    targets = tiny_targets("cpu")
    expected = [targets.batch(step) for step in range(3, 7)]
    assert not torch.equal(expected[0]["audio"], expected[1]["audio"])  # steps do differ
    assert_batches_equal(list(prefetched_batches(targets, 3, 7, prefetch)), expected)
    assert list(prefetched_batches(targets, 7, 7, prefetch)) == []
    assert not teacher_threads()


def test_closing_early_stops_the_worker():
    targets = tiny_targets("cpu")
    with closing(prefetched_batches(targets, 0, 100, prefetch=True)) as batches:
        first = next(batches)
        assert teacher_threads()  # step 1's batch is being made
    assert not teacher_threads()
    assert torch.equal(first["audio"], targets.batch(0)["audio"])


def test_a_failing_batch_reaches_the_caller_and_stops_the_worker():
    targets = tiny_targets("cpu")
    targets.phoneme_ids = [[1, 99, 2]]  # an id past the teacher's 10 symbols
    with pytest.raises(IndexError):
        list(prefetched_batches(targets, 0, 3, prefetch=True))
    assert not teacher_threads()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the worker's CUDA stream needs a GPU: run `pytest -m gpu`")
def test_prefetched_batches_on_a_side_stream_are_the_steps_batches():
    targets = tiny_targets("cuda")
    expected = [targets.batch(step) for step in range(5)]
    make_batch = targets.batch

    def late_batch(step: int) -> dict[str, torch.Tensor]:
        # The GPU spins on the worker's stream before the batch's kernels: a caller that read the
        # batch without waiting for its event would read memory not yet written.
        torch.cuda._sleep(50_000_000)
        return make_batch(step)

    targets.batch = late_batch
    got = []
    for batch in prefetched_batches(targets, 0, 5, prefetch=True):
        got.append({key: value.clone() for key, value in batch.items()})  # read on the caller's stream
        torch.randn(1 << 20, device="cuda")  # allocations on the caller's stream while the worker runs
    assert_batches_equal(got, expected)


def adamw_state_after_steps(fused: bool | None) -> tuple[torch.nn.Parameter, torch.optim.AdamW]:
    torch.manual_seed(0)
    parameter = torch.nn.Parameter(torch.randn(5, 3))
    optimizer = torch.optim.AdamW([parameter], lr=1e-2, betas=(0.8, 0.99), fused=fused)
    for _ in range(3):
        parameter.grad = torch.randn(5, 3)
        optimizer.step()
    return parameter, optimizer


@pytest.mark.parametrize(("saved_fused", "loading_fused"), [(None, True), (True, None)])
def test_optimizer_state_loads_across_fused_and_unfused(saved_fused, loading_fused):
    """A run's state saved by the unfused AdamW resumes under the fused one (and back): same moments
    and step count, the loading optimizer keeps its own implementation, and its next step matches."""
    saved_parameter, saved_optimizer = adamw_state_after_steps(saved_fused)
    saved = copy.deepcopy(saved_optimizer.state_dict())  # as from the shards: tensors of its own
    parameter = torch.nn.Parameter(saved_parameter.detach().clone())
    optimizer = torch.optim.AdamW([parameter], lr=1e-2, betas=(0.8, 0.99), fused=loading_fused)
    load_optimizer_state(optimizer, saved)
    assert optimizer.param_groups[0]["fused"] == loading_fused
    loaded = optimizer.state_dict()
    assert loaded["state"][0].keys() == saved["state"][0].keys()
    for key, value in saved["state"][0].items():
        assert torch.equal(loaded["state"][0][key].float(), value.float()), key
    gradient = torch.randn(5, 3)
    for param, opt in ((saved_parameter, saved_optimizer), (parameter, optimizer)):
        param.grad = gradient.clone()
        opt.step()
    assert torch.allclose(parameter, saved_parameter, atol=1e-6)
