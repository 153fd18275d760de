"""A direct reference for the inverse rational-quadratic spline the duration predictor runs.

``models.piper.spline.inverse_rational_quadratic_spline`` is the exported form: bin search as a
comparison-sum, plain elementwise ops, no searchsorted. The reference here is written the way
the formula reads (Durkan et al. 2019, eq. 4-6), with ``torch.searchsorted`` for the bin and
float64 throughout, so a test can hold the exported form to it.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from models.piper.spline import MIN_BIN_HEIGHT, MIN_BIN_WIDTH, MIN_DERIVATIVE


def _knot_positions(unnormalized: torch.Tensor, tail_bound: float, min_size: float) -> torch.Tensor:
    num_bins = unnormalized.shape[-1]
    sizes = min_size + (1 - min_size * num_bins) * torch.softmax(unnormalized, dim=-1)
    knots = torch.cat([torch.zeros_like(sizes[..., :1]), torch.cumsum(sizes, dim=-1)], dim=-1)
    knots = 2 * tail_bound * knots - tail_bound
    knots[..., 0], knots[..., -1] = -tail_bound, tail_bound
    return knots


def reference_inverse_spline(y, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound):
    """x with spline(x) = y, identity outside [-tail_bound, tail_bound]; same argument shapes as the exported form."""
    y, widths, heights, derivatives = (t.double() for t in (y, unnormalized_widths, unnormalized_heights,
                                                             unnormalized_derivatives))
    boundary = math.log(math.expm1(1 - MIN_DERIVATIVE))
    derivatives = MIN_DERIVATIVE + F.softplus(F.pad(derivatives, (1, 1), value=boundary))
    x_knots = _knot_positions(widths, tail_bound, MIN_BIN_WIDTH)
    y_knots = _knot_positions(heights, tail_bound, MIN_BIN_HEIGHT)
    inside = (y >= -tail_bound) & (y <= tail_bound)
    y_in = y.clamp(-tail_bound, tail_bound)
    index = torch.searchsorted(y_knots[..., 1:-1].contiguous(), y_in.unsqueeze(-1).contiguous(), right=True)  # (..., 1)

    def pick(t, shift=0):
        return torch.gather(t, -1, index + shift)[..., 0]

    x_k, w_k = pick(x_knots), pick(x_knots, 1) - pick(x_knots)
    y_k, h_k = pick(y_knots), pick(y_knots, 1) - pick(y_knots)
    d_k, d_k1 = pick(derivatives), pick(derivatives, 1)
    s_k = h_k / w_k
    # Solve y - y_k = h_k [s xi^2 + d_k xi (1 - xi)] / [s + (d_k1 + d_k - 2 s) xi (1 - xi)] for xi in [0, 1].
    offset = y_in - y_k
    a = h_k * (s_k - d_k) + offset * (d_k1 + d_k - 2 * s_k)
    b = h_k * d_k - offset * (d_k1 + d_k - 2 * s_k)
    c = -s_k * offset
    xi = 2 * c / (-b - torch.sqrt((b * b - 4 * a * c).clamp_min(0)))
    return torch.where(inside, x_k + xi * w_k, y).to(unnormalized_widths.dtype)


def reference_forward_spline(x, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound):
    """spline(x) itself (float64), so an inverse can be checked by composing the two."""
    x, widths, heights, derivatives = (t.double() for t in (x, unnormalized_widths, unnormalized_heights,
                                                             unnormalized_derivatives))
    boundary = math.log(math.expm1(1 - MIN_DERIVATIVE))
    derivatives = MIN_DERIVATIVE + F.softplus(F.pad(derivatives, (1, 1), value=boundary))
    x_knots = _knot_positions(widths, tail_bound, MIN_BIN_WIDTH)
    y_knots = _knot_positions(heights, tail_bound, MIN_BIN_HEIGHT)
    inside = (x >= -tail_bound) & (x <= tail_bound)
    x_in = x.clamp(-tail_bound, tail_bound)
    index = torch.searchsorted(x_knots[..., 1:-1].contiguous(), x_in.unsqueeze(-1).contiguous(), right=True)

    def pick(t, shift=0):
        return torch.gather(t, -1, index + shift)[..., 0]

    x_k, w_k = pick(x_knots), pick(x_knots, 1) - pick(x_knots)
    y_k, h_k = pick(y_knots), pick(y_knots, 1) - pick(y_knots)
    d_k, d_k1 = pick(derivatives), pick(derivatives, 1)
    s_k = h_k / w_k
    xi = (x_in - x_k) / w_k
    between = xi * (1 - xi)
    y = y_k + h_k * (s_k * xi * xi + d_k * between) / (s_k + (d_k1 + d_k - 2 * s_k) * between)
    return torch.where(inside, y, x)
