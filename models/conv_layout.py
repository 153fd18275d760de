"""Run every 1-D convolution of a module tree as the same convolution in another memory layout,
so a GPU A/B of layouts needs no change to a family's forward code.

    from models.conv_layout import convert_convs, converted_copy, layout_copies

    vocoder = converted_copy(generator.generator, "channels_last")  # generator.generator untouched
    audio = vocoder(mel)                                             # (B, C, T) in, (B, 1, T * hop) out
    layout_copies(vocoder, lambda: vocoder(mel))  # released HiFi-GAN: 78 conv calls, 1 input copy

Why: on the H200, FP16 HiFi-GAN is barely faster than FP32. The hypothesis under test: cuDNN's
fastest tensor-core kernels want NHWC (channels-last) tensors, and a Conv1d over an NCW tensor gets
NCHW kernels or transposes around NHWC ones; scripts/bench_conv_layout.py measures it. Each ``nn.Conv1d`` and
``nn.ConvTranspose1d`` becomes a ``LayoutConv`` holding the same weights (weight norm or any other
parametrization evaluated once: folded), in one of ``CONV_LAYOUTS``:

* ``"ncw"``: ``F.conv1d`` / ``F.conv_transpose1d`` on the folded weights, which is exactly what
  ``nn.Conv1d`` runs: the A side of an A/B (``torch.backends.cudnn.benchmark`` is the caller's);
* ``"channels_last"``: ``F.conv2d`` / ``F.conv_transpose2d`` over (N, C, 1, T) with input and
  weight in ``torch.channels_last``. The output goes back as the (N, C, T) view of the NHWC result,
  i.e. an (N, C, T) tensor whose channels are its fastest dimension. Elementwise ops (LeakyReLU,
  tanh, snake, adding residuals, multiplying by a (B, 1, T) mask) keep that layout, so the next
  convolution's (N, C, 1, T) view is already channels-last and costs no copy: the vocoder becomes one
  layout region, converted once at its first convolution, with no change to its code. An op that
  does not keep the layout (``torch.cat``, reflection padding) makes its output contiguous NCW again,
  and the next convolution pays one copy; ``layout_copies`` counts them and names where;
* ``"channels_last_per_conv"``: the same convolutions, each output copied back to contiguous
  (N, C, T): every convolution converts in and out, which is what the region saves.

``fold_dilation`` (any layout) runs a dilated convolution (stride 1, zero padding a multiple of the
dilation d) as an undilated one: time t = h * d + j is read as the 2-D position (h, j) of an
(N, C, T / d, d) view, and the K taps, d samples apart in time, become K rows one apart, a (K, 1)
kernel. No copy when T is a multiple of d; otherwise the input is zero-padded up to one (what the
convolution's own padding does there) and the output trimmed and made dense again in its layout:
two copies. The same sums in another order. Tried because the heaviest kernel of Kokoro's compiled
FP16 engine is an sm80 "indexed" implicit GEMM, guessed to be the dilated convolutions'. Measured on
an H100 at batch 16 (docs/results/h100_32_kokoro_folded.json): 16 of that kernel's 24 calls remain,
and the pads and a pointwise pass the compiler no longer fuses make the frame stage slower (59.6
against 55.6 ms); EmotiVoice's vocoder: throughput within 3 %, batch 1 3.43 against 3.10 ms. Off
in every engine; kept for other GPUs.

``align_channels`` (``"ncw"`` only) zero-pads the input channels of a convolution up to a multiple
of it, and its weights with them: the same sums plus zeros, and a padded copy of each input (which
the compiler can fuse into the pass that produced it). Convolutions with fewer input channels than
the multiple stay as they are (Kokoro's 1-channel F0 convolution would do 32x the work). Why: at the Kokoro student's width
(144, 72) cuDNN runs 24 of the compiled FP16 engine's convolution calls with an sm80 "indexed"
implicit GEMM (9.9 of 66 ms at batch 16 on an H100) which the same engine at (128, 64) never picks
(docs/results/h100_32_kokoro_kernels_*). The likely cause, untested: 72 and 144 are not multiples
of that kernel's 32-deep reduction tile, 64 and 128 are. Off by default until a GPU has timed it.

Outputs of ``"channels_last"`` are not ``is_contiguous()``: code that calls ``.view`` on a
convolution's output fails loudly there (use ``"channels_last_per_conv"`` for such a module).
Weights are stored (C_out, C_in / groups, 1, K) in the channels-last layouts, so convert a module
after loading its checkpoint, not before.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.weight_norm import WeightNorm

CONV_LAYOUTS = ("ncw", "channels_last", "channels_last_per_conv")


def _check_layout(layout: str) -> None:
    if layout not in CONV_LAYOUTS:
        raise ValueError(f"conv layout {layout!r}: use one of {list(CONV_LAYOUTS)}")


def folded_weight(conv: nn.Module, name: str) -> torch.Tensor:
    """The ``weight`` a convolution computes with: a parametrization (weight norm included)
    evaluated, the legacy ``torch.nn.utils.weight_norm`` hook's weight recomputed from its g and v
    (the stored ``weight`` attribute is stale until the next forward), the plain tensor otherwise.
    Nothing on ``conv`` changes: a deep copy of a parametrized module shares its generated class,
    and removing the parametrization from one would strip the other's."""
    for hook in conv._forward_pre_hooks.values():
        if isinstance(hook, WeightNorm) and hook.name == name:
            return hook.compute_weight(conv).detach().clone()
    return getattr(conv, name).detach().clone()


def _check_no_hooks(conv: nn.Module, where: str) -> None:
    """Hooks other than the legacy weight norm would be dropped silently by the replacement."""
    pre_hooks = [h for h in conv._forward_pre_hooks.values() if not isinstance(h, WeightNorm)]
    if pre_hooks or conv._forward_hooks:
        raise ValueError(f"convolution {where!r} has forward hooks ({len(pre_hooks)} pre, "
                         f"{len(conv._forward_hooks)} post) that a layout conversion would drop: remove them "
                         "first, or leave this module unconverted")


def _explicit_padding(conv: nn.Conv1d) -> tuple[int, int]:
    """(left, right) samples that nn.Conv1d pads itself when its padding_mode is not 'zeros'."""
    if conv.padding == "valid":
        return 0, 0
    if conv.padding == "same":
        total = conv.dilation[0] * (conv.kernel_size[0] - 1)
        return total // 2, total - total // 2
    return conv.padding[0], conv.padding[0]


class LayoutConv(nn.Module):
    """One Conv1d or ConvTranspose1d in a chosen layout (module docstring), same outputs.

    Keeps the 1-D module's attributes (``stride``, ``padding``, ... as 1-tuples) because family code
    reads them (``self.ups[i].stride[0]``). Takes (N, C_in, T) or unbatched (C_in, T)."""

    def __init__(self, conv: nn.Conv1d | nn.ConvTranspose1d, layout: str, fold_dilation: bool = False,
                 align_channels: int = 1):
        super().__init__()
        _check_layout(layout)
        if align_channels < 1:
            raise ValueError(f"align_channels={align_channels}: a multiple of at least 1")
        if align_channels > 1 and layout != "ncw":
            raise ValueError(f"align_channels pads NCW inputs; the {layout!r} layout would copy them back")
        self.layout = layout
        self.transposed = isinstance(conv, nn.ConvTranspose1d)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride, self.dilation = conv.kernel_size, conv.stride, conv.dilation
        self.groups, self.padding_mode = conv.groups, conv.padding_mode
        self.output_padding = conv.output_padding if self.transposed else (0,)
        if conv.padding_mode == "zeros":
            self.padding, self.pre_padding = conv.padding, None
        else:  # reflect / replicate / circular: pad as nn.Conv1d does, then convolve unpadded
            self.padding, self.pre_padding = (0,), _explicit_padding(conv)
        with torch.no_grad():
            weight = folded_weight(conv, "weight")  # (C_out, C_in / g, K); transposed: (C_in, C_out / g, K)
            bias = None if conv.bias is None else folded_weight(conv, "bias")
        # Groups would interleave the padding with the channels: only ungrouped convolutions are padded,
        # and only those with at least ``align_channels`` inputs (module docstring).
        paddable = not self.transposed and self.groups == 1 and self.in_channels >= align_channels
        self.input_padding = -self.in_channels % align_channels if paddable else 0
        if self.input_padding:
            weight = F.pad(weight, (0, 0, 0, self.input_padding))  # (C_out, C_in + pad, K): zero taps
        self.dilation_folded = fold_dilation and self._foldable()
        if self.dilation_folded:
            weight = weight.unsqueeze(3)  # (C_out, C_in / g, K, 1): the taps along the rows of the folded view
        elif layout != "ncw":
            weight = weight.unsqueeze(2)  # (C_out, C_in / g, 1, K)
        if layout != "ncw":
            weight = weight.contiguous(memory_format=torch.channels_last)  # NHWC
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)

    def _foldable(self) -> bool:
        """A dilated convolution that the (T / d, d) view turns into an undilated one (module docstring)."""
        dilation = self.dilation[0]
        return (not self.transposed and dilation > 1 and self.stride[0] == 1 and not isinstance(self.padding, str)
                and self.padding[0] % dilation == 0)

    def extra_repr(self) -> str:
        kind = "ConvTranspose1d" if self.transposed else "Conv1d"
        return (f"{kind}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}), "
                f"layout={self.layout}" + (", dilation folded" if self.dilation_folded else "")
                + (f", {self.input_padding} zero input channels" if self.input_padding else ""))

    def _padding_2d(self):
        return self.padding if isinstance(self.padding, str) else (0, self.padding[0])  # "same" / "valid" as they are

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # unbatched (C, T), as nn.Conv1d accepts
            return self._convolve(self.padded(x.unsqueeze(0))).squeeze(0)
        return self._convolve(self.padded(x))

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, T) -> (N, C, T + pads) for a non-'zeros' padding_mode (a contiguous NCW result)."""
        return x if self.pre_padding is None else F.pad(x, self.pre_padding, mode=self.padding_mode)

    def _convolve(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_padding:
            x = F.pad(x, (0, 0, 0, self.input_padding))  # (N, C_in + pad, T), the pad zeros
        if self.dilation_folded:
            return self._convolve_folded(x)
        if self.layout == "ncw":
            if self.transposed:
                return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                          self.groups, self.dilation)
            return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        # A view, no copy, when x already has channels fastest (the previous conv's output)
        x = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)  # (N, C_in, 1, T) NHWC
        if self.transposed:
            y = F.conv_transpose2d(x, self.weight, self.bias, (1, self.stride[0]), self._padding_2d(),
                                   (0, self.output_padding[0]), self.groups, (1, self.dilation[0]))
        else:
            y = F.conv2d(x, self.weight, self.bias, (1, self.stride[0]), self._padding_2d(), (1, self.dilation[0]),
                         self.groups)
        y = y.squeeze(2)  # (N, C_out, T'), channels fastest in memory
        return y.contiguous() if self.layout == "channels_last_per_conv" else y

    def _convolve_folded(self, x: torch.Tensor) -> torch.Tensor:
        """The dilated convolution as an undilated (K, 1) one over the (N, C, T / d, d) view."""
        dilation, samples = self.dilation[0], x.shape[-1]
        tail = -samples % dilation  # zeros up to a multiple of d: the padding the convolution applies anyway
        if tail:
            x = F.pad(x, (0, tail))
        x = x.unflatten(-1, (-1, dilation))  # (N, C_in, T / d, d): a view of (N, C_in, T)
        if self.layout != "ncw":  # a view too when x already has channels fastest (the previous conv's output)
            x = x.contiguous(memory_format=torch.channels_last)
        y = F.conv2d(x, self.weight, self.bias, 1, (self.padding[0] // dilation, 0), 1, self.groups)
        y = y.flatten(-2)  # (N, C_out, T' + tail); NHWC rows are d samples of C_out channels: still a view
        if tail:  # trimmed, then dense again in this layout, so that outputs look as unfolded ones do
            y = y[..., : y.shape[-1] - tail]
            y = y.contiguous() if self.layout != "channels_last" else y.transpose(1, 2).contiguous().transpose(1, 2)
        return y.contiguous() if self.layout == "channels_last_per_conv" else y


def convert_convs(module: nn.Module, layout: str, fold_dilation: bool = False, align_channels: int = 1) -> nn.Module:
    """Replace every Conv1d / ConvTranspose1d under ``module`` (in place) by a ``LayoutConv``; returns
    ``module``, or the new LayoutConv when ``module`` is itself a convolution. Converting an already
    converted tree to another layout is refused: convert the original again. ``fold_dilation``: the
    dilated convolutions that allow it run undilated over a folded view; ``align_channels``: input
    channels zero-padded to a multiple of it (module docstring)."""
    _check_layout(layout)
    if isinstance(module, LayoutConv):
        raise ValueError(f"module is already a LayoutConv ({module.layout}): convert the original module")
    if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
        _check_no_hooks(module, type(module).__name__)
        return LayoutConv(module, layout, fold_dilation, align_channels)
    for name, parent in list(module.named_modules()):
        if isinstance(parent, LayoutConv):
            raise ValueError(f"{name!r} is already a LayoutConv ({parent.layout}): convert the original module")
        for child_name, child in list(parent.named_children()):
            if isinstance(child, (nn.Conv1d, nn.ConvTranspose1d)):
                where = f"{name}.{child_name}" if name else child_name
                _check_no_hooks(child, where)
                setattr(parent, child_name, LayoutConv(child, layout, fold_dilation, align_channels))
    return module


def converted_copy(module: nn.Module, layout: str, fold_dilation: bool = False, align_channels: int = 1) -> nn.Module:
    """A converted deep copy; ``module`` keeps its own convolutions and parametrizations."""
    return convert_convs(copy.deepcopy(module), layout, fold_dilation, align_channels)


def layout_copies(module: nn.Module, run: Callable[[], object]) -> dict:
    """Run ``run()`` once and count the layout conversions of ``module``'s LayoutConvs: an input
    copy where a channels-last conv's (N, C, 1, T) view was not already channels-last, an output copy
    where ``"channels_last_per_conv"`` made a multi-channel output contiguous again, a ``fold_pads``
    where a folded dilated convolution zero-padded an input whose length is not a multiple of its
    dilation (a copy, in NCW). ``copied_at`` names the convolutions whose input was copied, in call
    order (a name repeats per call)."""
    counts = {"conv_calls": 0, "input_copies": 0, "output_copies": 0, "fold_pads": 0, "copied_at": []}
    names = {conv: name for name, conv in module.named_modules() if isinstance(conv, LayoutConv)}

    def before(conv: LayoutConv, args: tuple) -> None:
        counts["conv_calls"] += 1
        x = conv.padded(args[0] if args[0].dim() == 3 else args[0].unsqueeze(0))  # (N, C, T) as convolved
        if conv.layout != "ncw" and not x.unsqueeze(2).is_contiguous(memory_format=torch.channels_last):
            counts["input_copies"] += 1
            counts["copied_at"].append(names[conv])
        if conv.dilation_folded and x.shape[-1] % conv.dilation[0]:
            counts["fold_pads"] += 1

    def after(conv: LayoutConv, args: tuple, output: torch.Tensor) -> None:
        if conv.layout == "channels_last_per_conv" and output.shape[-2] > 1 and output.shape[-1] > 1:
            counts["output_copies"] += 1

    handles = [h for conv in names for h in (conv.register_forward_pre_hook(before), conv.register_forward_hook(after))]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return counts
