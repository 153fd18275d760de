"""1-D convolutions over channels-last activations (B, T, C) as Triton kernels, with the
elementwise work around a HiFi-GAN convolution done inside it.

In a HiFi-GAN vocoder every convolution reads ``mask * leaky_relu(x)`` and most of them add a
residual afterwards. As separate kernels that is four passes over an activation per convolution
(activation, mask, convolution, residual sum); at batch 32-64 on the H200 the vocoder is about 90 %
of EmotiVoice's engine time and bound by those passes, not by arithmetic
(docs/results/h200_13_emotivoice_profile.json). Here one kernel

    loads the input rows it needs, zeroes rows past the row's valid length (the padding mask and
    the convolution's own zero padding at once), applies LeakyReLU,
    multiplies by the weights tap by tap (tensor-core dot products, FP32 accumulation),
    adds bias, residual, a scale and an accumulator, optionally tanh, and stores once.

    packed = pack_conv1d(conv.weight, conv.bias, torch.float16)        # once
    out = conv1d(x, packed, dilation=3, slope=0.1, lengths=frame_lengths, length_factor=64,
                 residual=x)                                          # x + conv(mask * lrelu(x))
    up = conv_transpose1d(x, pack_conv_transpose1d(up_conv.weight, up_conv.bias, torch.float16),
                          stride=8, slope=0.1, lengths=frame_lengths, length_factor=8)

Weights come in torch's own layouts (Conv1d (C_out, C_in, K), ConvTranspose1d (C_in, C_out, K)) and
are packed once by ``pack_conv1d`` / ``pack_conv_transpose1d`` into (K, C_in, C_out_pad) tiles.

Measured on the H200 (docs/benchmarks.md, EmotiVoice rows), these kernels lose to cuDNN's
convolutions with torch.compile's fusions around them: the fusion saves less than the convolution
itself costs in these tiles. The engines keep them as an opt-in (``vocoder_kernels="triton"``).

Triton runs on the GPU machine; on a CPU the kernels run (slowly) under ``TRITON_INTERPRET=1``,
which is how the tests check them against torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MIN_DOT = 16  # tl.dot wants every dimension >= 16
BLOCK_T = 128  # output rows per program
NUM_WARPS = 4
MAX_BLOCK_CO = 64
MAX_BLOCK_CI = 64


@dataclass(frozen=True)
class PackedConv:
    """A convolution's weights as (K, C_in, C_out_pad) tiles, bias (C_out_pad,) float32."""
    weight: torch.Tensor
    bias: torch.Tensor
    out_channels: int
    kernel_size: int

    @property
    def in_channels(self) -> int:
        return self.weight.shape[1]


def _padded_out(channels: int) -> int:
    return max(MIN_DOT, triton.next_power_of_2(channels))


def _pack(taps: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> PackedConv:
    """taps (K, C_in, C_out) -> zero-padded tiles; bias None means zeros."""
    kernel, in_channels, out_channels = taps.shape
    if in_channels % MIN_DOT:
        raise ValueError(f"{in_channels} input channels: the kernels need a multiple of {MIN_DOT}")
    padded = torch.zeros(kernel, in_channels, _padded_out(out_channels), dtype=dtype, device=taps.device)
    padded[:, :, :out_channels] = taps
    full_bias = torch.zeros(padded.shape[-1], dtype=torch.float32, device=taps.device)
    if bias is not None:
        full_bias[:out_channels] = bias.float()
    return PackedConv(padded.contiguous(), full_bias, out_channels, kernel)


def pack_conv1d(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> PackedConv:
    """Conv1d weight (C_out, C_in, K) -> tiles."""
    return _pack(weight.detach().permute(2, 1, 0), bias, dtype)


def pack_conv_transpose1d(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> PackedConv:
    """ConvTranspose1d weight (C_in, C_out, K) -> tiles."""
    return _pack(weight.detach().permute(2, 0, 1), bias, dtype)


@triton.jit
def _activated(x_ptr, rows, row_ok, ci, C_IN: tl.constexpr, PRO_LRELU: tl.constexpr, slope):
    """(BLOCK_T, BLOCK_CI) input tile: rows outside [0, valid length) are zeros, then LeakyReLU."""
    a = tl.load(x_ptr + rows[:, None] * C_IN + ci[None, :], mask=row_ok[:, None], other=0.0)
    if PRO_LRELU:
        a32 = a.to(tl.float32)
        a = tl.where(a32 >= 0, a32, a32 * slope).to(a.dtype)
    return a


@triton.jit
def _dot(a, w, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, w, acc, input_precision="ieee")
    return tl.dot(a, w, acc)


@triton.jit
def _epilogue(acc, out_ptr, res_ptr, accum_ptr, bias_ptr, rows, row_ok, co, out_scale,
              C_OUT: tl.constexpr, HAS_RES: tl.constexpr, HAS_ACCUM: tl.constexpr, TANH: tl.constexpr):
    """out = tanh?((acc + bias + residual) * out_scale + accumulator), stored in out's dtype."""
    acc += tl.load(bias_ptr + co)[None, :]
    offsets = rows[:, None] * C_OUT + co[None, :]
    ok = row_ok[:, None] & (co < C_OUT)[None, :]
    if HAS_RES:
        acc += tl.load(res_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    acc = acc * out_scale
    if HAS_ACCUM:
        acc += tl.load(accum_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    if TANH:
        acc = 2.0 * tl.sigmoid(2.0 * acc) - 1.0
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=ok)


# Lengths and dilations stay runtime values: specialising on them (Triton's default for ints equal to
# 1 or divisible by 16) would compile each layer again for every bucket length.
@triton.jit(do_not_specialize=["T", "length_factor", "dilation"])
def _conv1d_kernel(x_ptr, w_ptr, bias_ptr, res_ptr, accum_ptr, out_ptr, len_ptr,
                   T, length_factor, slope, out_scale, dilation,
                   C_IN: tl.constexpr, C_OUT: tl.constexpr, C_OUT_PAD: tl.constexpr, K: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_CI: tl.constexpr, BLOCK_CO: tl.constexpr,
                   PRO_LRELU: tl.constexpr, HAS_LEN: tl.constexpr, HAS_RES: tl.constexpr,
                   HAS_ACCUM: tl.constexpr, TANH: tl.constexpr, IEEE: tl.constexpr):
    """Same-padded, dilated convolution of one batch row's (T, C_IN) into (T, C_OUT)."""
    row = tl.program_id(2)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    valid = T
    if HAS_LEN:
        valid = tl.minimum(tl.load(len_ptr + row).to(tl.int32) * length_factor, T)
    x_row = x_ptr + row.to(tl.int64) * T * C_IN
    acc = tl.zeros((BLOCK_T, BLOCK_CO), dtype=tl.float32)
    for k in tl.static_range(K):
        src = t + (k - (K - 1) // 2) * dilation
        src_ok = (src >= 0) & (src < valid)
        for c0 in range(0, C_IN, BLOCK_CI):  # a loop, not unrolled: compile time grows with unrolled dots
            ci = c0 + tl.arange(0, BLOCK_CI)
            a = _activated(x_row, src, src_ok, ci, C_IN, PRO_LRELU, slope)
            w = tl.load(w_ptr + (k * C_IN + ci)[:, None] * C_OUT_PAD + co[None, :])
            acc = _dot(a, w, acc, IEEE)
    out_offset = row.to(tl.int64) * T * C_OUT
    _epilogue(acc, out_ptr + out_offset, res_ptr + out_offset, accum_ptr + out_offset, bias_ptr, t, t < T, co,
              out_scale, C_OUT, HAS_RES, HAS_ACCUM, TANH)


@triton.jit(do_not_specialize=["T_IN", "length_factor"])
def _conv_transpose1d_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, len_ptr,
                             T_IN, length_factor, slope,
                             C_IN: tl.constexpr, C_OUT: tl.constexpr, C_OUT_PAD: tl.constexpr,
                             STRIDE: tl.constexpr, PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                             BLOCK_CI: tl.constexpr, BLOCK_CO: tl.constexpr, PRO_LRELU: tl.constexpr,
                             HAS_LEN: tl.constexpr, IEEE: tl.constexpr):
    """Transposed convolution with kernel 2 * STRIDE, one output phase per program: output row
    q * STRIDE + phase - PAD = x[q] . W[phase] + x[q - 1] . W[phase + STRIDE]."""
    row = tl.program_id(2)
    phase = tl.program_id(1) % STRIDE
    co = (tl.program_id(1) // STRIDE) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    q = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # input rows, 0..T_IN inclusive
    valid = T_IN
    if HAS_LEN:
        valid = tl.minimum(tl.load(len_ptr + row).to(tl.int32) * length_factor, T_IN)
    x_row = x_ptr + row.to(tl.int64) * T_IN * C_IN
    acc = tl.zeros((BLOCK_T, BLOCK_CO), dtype=tl.float32)
    for tap in tl.static_range(2):
        src = q - tap
        src_ok = (src >= 0) & (src < valid)
        for c0 in range(0, C_IN, BLOCK_CI):  # a loop, not unrolled: compile time grows with unrolled dots
            ci = c0 + tl.arange(0, BLOCK_CI)
            a = _activated(x_row, src, src_ok, ci, C_IN, PRO_LRELU, slope)
            w = tl.load(w_ptr + ((phase + tap * STRIDE) * C_IN + ci)[:, None] * C_OUT_PAD + co[None, :])
            acc = _dot(a, w, acc, IEEE)
    t_out = q * STRIDE + phase - PAD
    t_ok = (t_out >= 0) & (t_out < T_IN * STRIDE)
    out_offset = row.to(tl.int64) * T_IN * STRIDE * C_OUT
    _epilogue(acc, out_ptr + out_offset, out_ptr, out_ptr, bias_ptr, t_out, t_ok, co, 1.0, C_OUT, False, False, False)


def _blocks(packed: PackedConv) -> tuple[int, int]:
    """(BLOCK_CI, BLOCK_CO): the largest power-of-two input tile (16-64) that divides the input
    channels, and an output tile of the padded output channels, at most 64."""
    block_ci = MAX_BLOCK_CI
    while packed.in_channels % block_ci:
        block_ci //= 2
    return block_ci, min(packed.weight.shape[-1], MAX_BLOCK_CO)


def _check_operands(x: torch.Tensor, packed: PackedConv, lengths: torch.Tensor | None, stride: int = 1,
                    **addends: torch.Tensor | None) -> None:
    """The kernels index raw pointers: a mis-shaped or strided operand would read the wrong memory.
    ``addends`` must have the output's shape, (B, T * stride, C_out)."""
    if x.dim() != 3 or x.shape[-1] != packed.in_channels or not x.is_contiguous():
        raise ValueError(f"input must be contiguous (B, T, {packed.in_channels}), got {tuple(x.shape)}")
    out_shape = (x.shape[0], x.shape[1] * stride, packed.out_channels)
    if lengths is not None and (lengths.shape != (x.shape[0],) or lengths.device != x.device):
        raise ValueError(f"lengths must be ({x.shape[0]},) on {x.device}, got {tuple(lengths.shape)} on {lengths.device}")
    for name, tensor in addends.items():
        if tensor is not None and (tuple(tensor.shape) != out_shape or not tensor.is_contiguous()
                                   or tensor.device != x.device):
            raise ValueError(f"{name} must be contiguous {out_shape} on {x.device}, got {tuple(tensor.shape)}")


def conv1d(x: torch.Tensor, packed: PackedConv, dilation: int = 1, slope: float | None = None,
           lengths: torch.Tensor | None = None, length_factor: int = 1, residual: torch.Tensor | None = None,
           scale: float = 1.0, accumulate: torch.Tensor | None = None, tanh: bool = False,
           block_t: int = BLOCK_T, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """x (B, T, C_in) -> (B, T, C_out): tanh?((conv(mask * lrelu(x)) + residual) * scale + accumulate).
    ``slope`` None: no LeakyReLU; ``lengths`` (B,) int: rows at or past lengths * length_factor read
    as zeros (None: all T rows are valid). Odd kernels only (same padding). ``block_t`` output rows
    and ``num_warps`` warps per program: launch tuning, same results."""
    if packed.kernel_size % 2 == 0:
        raise ValueError(f"kernel {packed.kernel_size}: same padding needs an odd kernel")
    _check_operands(x, packed, lengths, residual=residual, accumulate=accumulate)
    batch, steps, _ = x.shape
    out = torch.empty(batch, steps, packed.out_channels, dtype=x.dtype, device=x.device)
    block_ci, block_co = _blocks(packed)
    grid = (triton.cdiv(steps, block_t), packed.weight.shape[-1] // block_co, batch)
    _conv1d_kernel[grid](
        x, packed.weight, packed.bias, residual if residual is not None else out,
        accumulate if accumulate is not None else out, out, lengths if lengths is not None else out,
        steps, length_factor, 0.0 if slope is None else slope, scale, dilation,
        C_IN=packed.in_channels, C_OUT=packed.out_channels, C_OUT_PAD=packed.weight.shape[-1],
        K=packed.kernel_size, BLOCK_T=block_t, BLOCK_CI=block_ci, BLOCK_CO=block_co,
        PRO_LRELU=slope is not None, HAS_LEN=lengths is not None, HAS_RES=residual is not None,
        HAS_ACCUM=accumulate is not None, TANH=tanh, IEEE=x.dtype == torch.float32, num_warps=num_warps)
    return out


def conv_transpose1d(x: torch.Tensor, packed: PackedConv, stride: int, slope: float | None = None,
                     lengths: torch.Tensor | None = None, length_factor: int = 1, block_t: int = BLOCK_T,
                     num_warps: int = NUM_WARPS) -> torch.Tensor:
    """x (B, T, C_in) -> (B, T * stride, C_out) for kernel 2 * stride and padding stride // 2 (the
    HiFi-GAN upsampling layers); input rows masked and activated as in ``conv1d``."""
    if packed.kernel_size != 2 * stride or stride % 2:
        raise ValueError(f"kernel {packed.kernel_size}, stride {stride}: the kernel handles kernel = 2 * an even stride")
    _check_operands(x, packed, lengths, stride)
    batch, steps, _ = x.shape
    out = torch.empty(batch, steps * stride, packed.out_channels, dtype=x.dtype, device=x.device)
    block_ci, block_co = _blocks(packed)
    grid = (triton.cdiv(steps + 1, block_t), stride * (packed.weight.shape[-1] // block_co), batch)
    _conv_transpose1d_kernel[grid](
        x, packed.weight, packed.bias, out, lengths if lengths is not None else out,
        steps, length_factor, 0.0 if slope is None else slope,
        C_IN=packed.in_channels, C_OUT=packed.out_channels, C_OUT_PAD=packed.weight.shape[-1],
        STRIDE=stride, PAD=stride // 2, BLOCK_T=block_t, BLOCK_CI=block_ci, BLOCK_CO=block_co,
        PRO_LRELU=slope is not None, HAS_LEN=lengths is not None, IEEE=x.dtype == torch.float32, num_warps=num_warps)
    return out
