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


def _bin_of(value, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound, search: str):
    """The bin each ``value`` falls in (searched on the x knots or the y knots) and its parameters, float64.

    Returns (inside, value clamped to the bound, x_k, w_k, y_k, h_k, d_k, d_k1, s_k): knot, width,
    height, the derivatives at both ends and the bin's slope.
    """
    value, widths, heights, derivatives = (t.double() for t in (value, unnormalized_widths, unnormalized_heights,
                                                                 unnormalized_derivatives))
    boundary = math.log(math.expm1(1 - MIN_DERIVATIVE))
    derivatives = MIN_DERIVATIVE + F.softplus(F.pad(derivatives, (1, 1), value=boundary))
    x_knots = _knot_positions(widths, tail_bound, MIN_BIN_WIDTH)
    y_knots = _knot_positions(heights, tail_bound, MIN_BIN_HEIGHT)
    inside = (value >= -tail_bound) & (value <= tail_bound)
    value_in = value.clamp(-tail_bound, tail_bound)
    knots = x_knots if search == "x" else y_knots
    index = torch.searchsorted(knots[..., 1:-1].contiguous(), value_in.unsqueeze(-1).contiguous(), right=True)  # (..., 1)

    def pick(t, shift=0):
        return torch.gather(t, -1, index + shift)[..., 0]

    x_k, w_k = pick(x_knots), pick(x_knots, 1) - pick(x_knots)
    y_k, h_k = pick(y_knots), pick(y_knots, 1) - pick(y_knots)
    return inside, value_in, x_k, w_k, y_k, h_k, pick(derivatives), pick(derivatives, 1), h_k / w_k


def reference_inverse_spline(y, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound):
    """x with spline(x) = y, identity outside [-tail_bound, tail_bound]; same argument shapes as the exported form."""
    inside, y_in, x_k, w_k, y_k, h_k, d_k, d_k1, s_k = _bin_of(
        y, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound, search="y")
    # Solve y - y_k = h_k [s xi^2 + d_k xi (1 - xi)] / [s + (d_k1 + d_k - 2 s) xi (1 - xi)] for xi in [0, 1].
    offset = y_in - y_k
    a = h_k * (s_k - d_k) + offset * (d_k1 + d_k - 2 * s_k)
    b = h_k * d_k - offset * (d_k1 + d_k - 2 * s_k)
    c = -s_k * offset
    xi = 2 * c / (-b - torch.sqrt((b * b - 4 * a * c).clamp_min(0)))
    return torch.where(inside, x_k + xi * w_k, y.double()).to(unnormalized_widths.dtype)


def reference_forward_spline(x, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound):
    """spline(x) itself (float64), so an inverse can be checked by composing the two."""
    inside, x_in, x_k, w_k, y_k, h_k, d_k, d_k1, s_k = _bin_of(
        x, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound, search="x")
    xi = (x_in - x_k) / w_k
    between = xi * (1 - xi)
    y = y_k + h_k * (s_k * xi * xi + d_k * between) / (s_k + (d_k1 + d_k - 2 * s_k) * between)
    return torch.where(inside, y, x.double())
