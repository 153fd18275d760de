"""The convolution with its elementwise tail in cuDNN's epilogue (models/cudnn_epilogue.py): its
layout, its formula, the operands it refuses and how it picks a plan. On a CPU the operator runs its
PyTorch formula; ``-m gpu`` runs the cuDNN graphs against that formula. This file imports nothing
but the operator, so the GPU machine runs it without the voices' front-end packages."""
from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from models.cudnn_epilogue import (
    build_stats,
    build_stats_since,
    cached_graphs,
    channels_fastest,
    conv_lrelu,
    cudnn_frontend_available,
    fastest_plan,
    reference,
    use_kernel_cache,
)


def test_the_operator_keeps_channels_fastest_and_matches_its_formula():
    torch.manual_seed(1)
    a = channels_fastest(torch.randn(2, 6, 20))
    weight, bias = channels_fastest(torch.randn(4, 6, 5) * 0.3), torch.randn(4)
    mask = (torch.arange(20)[None] < torch.tensor([20, 11])[:, None]).float()[:, None]
    residual = channels_fastest(torch.randn(2, 4, 20))
    out = conv_lrelu(a, weight, bias, mask, padding=6, dilation=3, slope=0.1, residual=residual, residual_slope=10.0)
    assert out.stride() == (20 * 4, 1, 4)
    x = F.conv1d(a, weight, bias, padding=6, dilation=3) + torch.where(residual >= 0, residual, 10 * residual)
    torch.testing.assert_close(out, F.leaky_relu(x, 0.1) * mask)
    assert (out[1, :, 11:] == 0).all()


@pytest.mark.parametrize("change, message", [
    (dict(padding=2), "keeps the length"),
    (dict(mask=torch.ones(2, 1, 19)), "do not fit together"),
    (dict(bias=torch.zeros(3)), "do not fit together"),
    (dict(residual=torch.zeros(2, 4, 19)), "is not the output's"),
    (dict(a=torch.zeros(2, 6)), "wants (B, C, T) input"),
    (dict(mask=torch.ones(2, 1, 20, dtype=torch.float16)), "in the input's dtype and device"),
    (dict(slope=10.0), "must be in [0, 1)"),
])
def test_the_operator_rejects_operands_that_do_not_fit(change, message):
    operands = dict(a=torch.zeros(2, 6, 20), weight=torch.zeros(4, 6, 5), bias=torch.zeros(4),
                    mask=torch.ones(2, 1, 20), padding=6, dilation=3, slope=0.1)
    operands.update(change)
    with pytest.raises(ValueError, match=re.escape(message)):
        conv_lrelu(**operands)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and cudnn_frontend_available()),
                    reason="needs a GPU and nvidia-cudnn-frontend")
@torch.no_grad()
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-3), (torch.float16, 2e-2)])
@pytest.mark.parametrize("shared_kernels", [True, False], ids=["kernel_cache", "per_shape"])
def test_cudnn_graphs_compute_the_formula_at_two_lengths_and_in_a_cuda_graph(dtype, tolerance, shared_kernels,
                                                                            request):
    """Each call against the PyTorch formula: a dilated convolution, one with the residual, the same two at
    a second length (the plan reused by name; with the kernel cache, the kernels too) and a CUDA graph's
    replay of the residual call."""
    policy = build_stats()["kernel_cache"]
    use_kernel_cache(shared_kernels)
    request.addfinalizer(lambda: use_kernel_cache(policy))
    torch.manual_seed(2)
    device = torch.device("cuda")

    def operands(steps: int):
        a = channels_fastest(torch.randn(3, 64, steps, device=device)).to(dtype)
        mask = torch.arange(steps, device=device)[None] < torch.tensor([steps, steps - 99, 77], device=device)[:, None]
        residual = channels_fastest(torch.randn(3, 64, steps, device=device)).to(dtype)
        return a, mask.to(dtype)[:, None], residual

    weight = channels_fastest(torch.randn(64, 64, 11, device=device) * 0.05).to(dtype)
    bias = torch.randn(64, device=device).to(dtype)
    calls = (dict(dilation=5, padding=25), dict(dilation=1, padding=5, residual_slope=10.0))

    def check(got, a, mask, residual, call):
        want = reference(a, weight, bias, mask, residual, call["padding"], call["dilation"], 0.1,
                         call.get("residual_slope", 1.0))
        assert got.stride() == want.stride()
        assert ((got.float() - want.float()).abs().max() / want.float().abs().max()).item() < tolerance

    before, stats_before = cached_graphs(), build_stats()
    for steps in (400, 600):  # one size class at 3 rows (_run_cudnn): the second length is built by plan name
        a, mask, residual = operands(steps)
        for call in calls:
            with_residual = residual if "residual_slope" in call else None
            check(conv_lrelu(a, weight, bias, mask, slope=0.1, residual=with_residual, **call), a, mask,
                  with_residual, call)
    assert cached_graphs() == before + 4
    stats = build_stats()
    assert stats["graphs"] == stats_before["graphs"] + 4 and stats["kernel_cache"] == shared_kernels
    assert stats["timed_kinds"] == stats_before["timed_kinds"] + 2  # the first length's two kinds, not the second's
    assert stats["fallbacks"] == stats_before["fallbacks"]  # the second length found its kind's plan by name
    assert stats["shape_agnostic_failures"] == stats_before["shape_agnostic_failures"]
    a, mask, residual = operands(400)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        conv_lrelu(a, weight, bias, mask, slope=0.1, residual=residual, **calls[1])
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        out = conv_lrelu(a, weight, bias, mask, slope=0.1, residual=residual, **calls[1])
    fresh, fresh_residual = operands(400)[0], operands(400)[2]
    a.copy_(fresh)
    residual.copy_(fresh_residual)
    graph.replay()
    check(out, a, mask, residual, calls[1])


def test_the_fastest_plan_is_timed_with_slow_plans_given_up():
    """Each plan's timer is told when to give up: four times the best so far; failing plans (inf) never win."""
    measured = [3.0, 1.0, math.inf, 0.5, 2.0]
    limits = []

    def timer(index):
        def time(give_up_ms):
            limits.append(give_up_ms)
            return measured[index]
        return time

    assert fastest_plan([timer(index) for index in range(len(measured))]) == 3
    assert limits == [math.inf, 12.0, 4.0, 4.0, 2.0]
    assert fastest_plan([lambda give_up_ms: math.inf] * 3) == 0  # none runs: the heuristics' first
    assert fastest_plan([lambda give_up_ms: 1.0] * 2) == 0  # a tie: the earlier


def test_build_stats_since_an_earlier_reading_counts_what_was_built_in_between():
    now = build_stats()
    assert build_stats_since(now) == dict(graphs=0, build_s=0.0, timed_kinds=0, plans_timed=0, fallbacks=0,
                                          shape_agnostic_failures=0, winner_ranks={},
                                          kernel_cache=now["kernel_cache"])
    earlier = dict(now, graphs=now["graphs"] - 3, build_s=now["build_s"] - 1.5,
                   winner_ranks={**now["winner_ranks"], 0: now["winner_ranks"].get(0, 0) - 2})
    since = build_stats_since(earlier)
    assert (since["graphs"], since["build_s"], since["winner_ranks"]) == (3, 1.5, {0: 2})
