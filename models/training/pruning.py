"""Saliency for structured pruning, and the constants every family's pruning shares."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

ROUND_CHANNELS_TO = 8  # widths in multiples of 8 keep oneDNN and tensor-core kernels on their fast paths
CALIBRATION_BATCHES = 2  # batches of calibration data (steps 0, 1) for Taylor importance
FINETUNE_FINAL_LR_FRACTION = 0.1  # recovery fine-tunes decay their learning rate (cosine) to a tenth
PRUNING_SEED = 0


def second_order_taylor_gradients(module: nn.Module, outputs: list[Callable[[], torch.Tensor]]) -> None:
    """Put sqrt(diag(J^T J)) in every parameter's ``.grad``, J the Jacobian of the module's output.

    The distillation loss 0.5 * ||f(w') - f(w)||^2 is zero with a zero gradient at the teacher's
    own weights, so the first-order Taylor term that Torch-Pruning's Taylor importance reads
    (|w * grad|) would rank nothing. Its second-order term is 0.5 * w^2 * diag(J^T J) per
    weight; E[(J^T r)^2] = diag(J^T J) for r ~ N(0, I), one random probe per calibration batch
    (``outputs``: one callable per batch, running the module). With that in ``.grad``,
    |w * grad| is the square root of the second-order saliency.
    """
    generator = torch.Generator().manual_seed(PRUNING_SEED)
    squared = [torch.zeros_like(p) for p in module.parameters()]
    for run_batch in outputs:
        module.zero_grad(set_to_none=True)
        output = run_batch()
        probe = torch.randn(output.shape, generator=generator).to(output.device)
        (output * probe).sum().backward()
        for total, parameter in zip(squared, module.parameters()):
            if parameter.grad is not None:
                total += parameter.grad.detach() ** 2
    for total, parameter in zip(squared, module.parameters()):
        parameter.grad = (total / len(outputs)).sqrt()


def group_importance(module: nn.Module, importance: str, calibration=None):
    """Torch-Pruning's group importance for a convolutional decoder or vocoder: ``"magnitude"`` (L2 of
    the weights), else second-order Taylor saliency from ``calibration`` (a SegmentSampler whose
    ``batch(step)[0]`` is the module's input) in each parameter's ``.grad``."""
    import torch_pruning as tp  # only the machine that prunes needs it

    if importance == "magnitude":
        return tp.importance.GroupMagnitudeImportance(p=2)
    if calibration is None:
        raise ValueError("taylor importance needs calibration batches; pass calibration=SegmentSampler(...)")
    second_order_taylor_gradients(
        module, [lambda step=step: module(calibration.batch(step)[0]) for step in range(CALIBRATION_BATCHES)])
    return tp.importance.GroupTaylorImportance()
