r"""Kokoro-82M on CUDA as two static-shape stages, each replayed as a CUDA graph.

    from models.kokoro.engines import BucketedEngine
    engine = BucketedEngine(model, graphs=True)
    out = engine.synthesize(input_ids, ref_s)  # input_ids (B, T) with the 0 pads, ref_s (B, 256)
    out["audio"]  # (B, max frames * 600) float32 on the host; out["audio_lengths"] (B,)

Why: at batch 1 the eager model is launch bound (RTF 0.02 on the H200, hundreds of small kernels;
docs/results/h200_7_kokoro.json). The frame count is known only after the duration head, so
synthesis splits there (models/piper/engines.py is the same pattern for Piper):

    text stage  (B, T) exact, FP32:        ALBERT, duration encoder and head, text encoder
    frame stage (B, T, F_bucket):          alignment, F0/energy curves, decoder, iSTFTNet -> audio

with one device-to-host read of the frame count between them. The text stage is captured per
exact (B, T): the model's text side has no padding mask (BiLSTMs over pads would move real
tokens), so every item of a batch has the same T. The frame stage pads frames to a multiple of
``frame_bucket`` and runs the model's masked frame path (``frame_lengths``: masked AdaIN
statistics, zeros past each item's end before every convolution), so padding moves no sample;
only the frame-rate BiLSTM is run here as two one-way LSTMs (MaskedBiLstm), because the model's
packed form reads the lengths on the host, which a CUDA graph cannot.

``frame_dtype`` float16/bfloat16 runs the frame stage in half precision except where it does not
hold (FP32 islands): every AdaIN (its instance-norm statistics), the F0 projection (a 0.1 Hz error integrates
into whole cycles of phase over a sentence), the harmonic source, the STFT of the source, and
the last projection with its exp and the inverse STFT (exp overflows float16 above 11). Its
waveform is not the FP32 one (real voice: 12-15 dB waveform SNR, against 113 dB for FP32 buckets:
the generator's sin() turns small logit errors into phase), but its sound is: on six Japanese
evaluation sentences DNSMOS P.808 3.773 against 3.776, MCD 0.22 dB, speaker similarity 0.9995
(magnitude SNR 28-29 dB; docs/results/cpu_23_kokoro_frame_precision.json). On the H200 it pays only
compiled and batched: 1.3x at batch 16, nothing at batch 1 (docs/results/h200_23_kokoro_*.json). FP32
stays the default, the one that equals the model sample for sample (the parity tests' form).

``compile_stages`` runs each stage shape through torch.compile (static shapes) before it is captured:
a graph replays the kernels eager mode launched, so the many small elementwise kernels around the
convolutions (Snake, AdaIN's scale and shift, the masks) stay separate passes over memory unless
the compiler fuses them. The LSTMs stay eager inside the compiled stage (torch.compile leaves
recurrent modules to eager mode), which the CUDA graph captures all the same.
"""
from __future__ import annotations

import contextlib
import copy
import math
import threading

import torch
from torch import nn

from models.conv_layout import convert_convs
from models.cuda_graphs import GraphCache, as_tuple, to_host
from models.kokoro.decoder import SourceNoise, samples_of
from models.kokoro.layers import AdaIN1d, set_statistics_dtype
from models.kokoro.lstm import length_mask
from models.kokoro.model import KokoroModel
from models.kokoro.prosody import alignment_matrix, durations_from_logits

FRAME_BUCKET = 16  # frames round up to a multiple of this (0.4 s at 600 samples per frame, 24 kHz)
TOKEN_BUCKET = 16  # synthesize_rows pads the frame stage's token axis to a multiple of this
COMPILED_SHAPES = 256  # compiled stage shapes kept before torch.compile would fall back to eager


@contextlib.contextmanager
def tf32_products(enabled: bool):
    """cuBLAS and cuDNN may use TF32 for FP32 products inside the block (a captured graph keeps the
    kernels chosen at capture)."""
    if not enabled:
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _cast(outputs, dtype: torch.dtype | None):
    if dtype is None:
        return outputs
    return tuple(t.to(dtype) for t in outputs) if isinstance(outputs, tuple) else outputs.to(dtype)


def _float32(args: tuple) -> tuple:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


class Float32Island(nn.Module):
    """A module kept in FP32 inside a half-precision stage: tensor inputs cast up, the output cast
    to ``output_dtype`` (None keeps FP32)."""

    def __init__(self, module: nn.Module, output_dtype: torch.dtype | None):
        super().__init__()
        self.module, self.output_dtype = module, output_dtype

    def forward(self, *args):
        with torch.autocast(args[0].device.type, enabled=False):
            return _cast(self.module(*_float32(args)), self.output_dtype)


class Float32Stft(nn.Module):
    """The generator's STFT in FP32: ``transform`` (of the harmonic source) returns the stage's
    dtype, as it feeds the network; ``inverse`` returns the FP32 waveform."""

    def __init__(self, stft: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.stft, self.dtype, self.hop_length = stft, dtype, stft.hop_length

    def transform(self, *args):
        with torch.autocast(args[0].device.type, enabled=False):
            return _cast(self.stft.transform(*_float32(args)), self.dtype)

    def inverse(self, *args):
        with torch.autocast(args[0].device.type, enabled=False):
            return self.stft.inverse(*_float32(args))


class MaskedBiLstm(nn.Module):
    """A batch-first one-layer BiLSTM over padded items, each direction starting at its item's own
    ends: the backward LSTM reads each item's frames reversed within its length.

    ``fused``: both directions as one LSTM of twice the width whose weights are block-diagonal (the
    forward cell sees only the frames and its own state, the backward cell only the reversed frames
    and its own), so the F sequential steps run once instead of twice. Its products are twice as
    large, half of them multiplying zeros; at the batch sizes of a server a step is bound by its
    launch and latency, not its arithmetic."""

    def __init__(self, lstm: nn.LSTM, fused: bool = False):
        super().__init__()
        if lstm.num_layers != 1 or not lstm.bidirectional or not lstm.batch_first:
            raise ValueError(f"MaskedBiLstm takes a one-layer batch-first bidirectional LSTM, not {lstm}")
        weights = lstm.state_dict()
        names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
        directions = ({name: weights[name] for name in names}, {name: weights[f"{name}_reverse"] for name in names})
        self.fused, self.hidden_size = fused, lstm.hidden_size
        if fused:
            self.lstm = nn.LSTM(2 * lstm.input_size, 2 * lstm.hidden_size, batch_first=True)
            self.lstm.load_state_dict(block_diagonal_lstm_weights(*directions, lstm.input_size, lstm.hidden_size))
            return
        self.forward_lstm, self.backward_lstm = (nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True)
                                                 for _ in range(2))
        self.forward_lstm.load_state_dict(directions[0])
        self.backward_lstm.load_state_dict(directions[1])

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x (B, F, C), lengths (B,) <= F -> (B, F, 2H), zero past each item's length."""
        steps = torch.arange(x.shape[1], device=x.device)
        valid = (steps < lengths[:, None]).unsqueeze(-1)  # (B, F, 1)
        mirror = (lengths[:, None] - 1 - steps).clamp_min(0).unsqueeze(-1)  # (B, F, 1): t -> length - 1 - t
        reversed_x = torch.gather(x, 1, mirror.expand(-1, -1, x.shape[2])) * valid
        if self.fused:
            both = self.lstm(torch.cat([x, reversed_x], dim=-1))[0]  # (B, F, 2H): forward | backward reversed
            forward, backward = both[..., : self.hidden_size], both[..., self.hidden_size:]
        else:
            forward, backward = self.forward_lstm(x)[0], self.backward_lstm(reversed_x)[0]  # (B, F, H) each
        backward = torch.gather(backward, 1, mirror.expand(-1, -1, backward.shape[2]))  # back in frame order
        return torch.cat([forward, backward], dim=-1) * valid  # (B, F, 2H)


def block_diagonal_lstm_weights(forward: dict[str, torch.Tensor], backward: dict[str, torch.Tensor],
                                input_size: int, hidden: int) -> dict[str, torch.Tensor]:
    """One LSTM (input 2C, hidden 2H) computing two independent LSTMs (input C, hidden H each): in
    each of the four gates' row blocks (i, f, g, o), the first H rows are the forward cell's and
    read only the first C inputs and H states, the last H rows the backward cell's."""
    fused = {"weight_ih_l0": torch.zeros(8 * hidden, 2 * input_size), "weight_hh_l0": torch.zeros(8 * hidden, 2 * hidden),
             "bias_ih_l0": torch.zeros(8 * hidden), "bias_hh_l0": torch.zeros(8 * hidden)}
    for gate in range(4):
        source = slice(gate * hidden, (gate + 1) * hidden)
        for direction, weights in enumerate((forward, backward)):
            rows = slice((2 * gate + direction) * hidden, (2 * gate + direction + 1) * hidden)
            fused["weight_ih_l0"][rows, direction * input_size:(direction + 1) * input_size] = weights["weight_ih_l0"][source]
            fused["weight_hh_l0"][rows, direction * hidden:(direction + 1) * hidden] = weights["weight_hh_l0"][source]
            fused["bias_ih_l0"][rows] = weights["bias_ih_l0"][source]
            fused["bias_hh_l0"][rows] = weights["bias_hh_l0"][source]
    return fused


class UnpaddedBiLstm(nn.Module):
    """A stand-in for a one-layer batch-first bidirectional ``nn.LSTM`` called on whole items (no
    packing, no initial state), as the engine's text stage calls its token-rate LSTMs: both
    directions as one LSTM of twice the width (``MaskedBiLstm(fused=True)`` with every item full), so
    each token's step runs once instead of once a direction."""

    def __init__(self, lstm: nn.LSTM):
        super().__init__()
        weight = lstm.weight_ih_l0
        self.both = MaskedBiLstm(lstm, fused=True).to(weight.device, weight.dtype)

    def forward(self, x: torch.Tensor, state: None = None) -> tuple[torch.Tensor, None]:
        """x (B, T, C) -> ((B, T, 2H), None), the first of ``nn.LSTM``'s outputs."""
        if state is not None or not isinstance(x, torch.Tensor):
            raise TypeError("UnpaddedBiLstm takes whole unpacked items and no initial state")
        lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long, device=x.device)
        return self.both(x, lengths), None


def text_side_copy(model: KokoroModel) -> KokoroModel:
    """A copy of ``model`` whose token-rate bidirectional LSTMs are ``UnpaddedBiLstm``s, for the text
    stage only (it runs them on whole items). What that stage never runs, the decoder and the
    frame-rate BiLSTM, is shared with ``model``: neither copied nor converted."""
    frame_rate_lstm = model.predictor.shared
    text_model = copy.deepcopy(model, memo={id(model.decoder): model.decoder, id(frame_rate_lstm): frame_rate_lstm})
    for module in list(text_model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.LSTM) and child.bidirectional and child is not frame_rate_lstm:
                setattr(module, name, UnpaddedBiLstm(child))
    return text_model


class TextStage(nn.Module):
    """(ids (B, T), ref_s (B, 2S), speed (1,)) -> d (B, T, H + S), t_en (B, H, T), frames per token."""

    def __init__(self, model: KokoroModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, ref_s, speed):
        _, prosody_style = self.model.split_style(ref_s)
        features = self.model.prosody_features(input_ids, prosody_style)
        _, frames_per_token = durations_from_logits(features["duration_logits"], speed)
        no_pads = torch.zeros_like(input_ids, dtype=torch.bool)
        return features["d"], self.model.text_encoder(input_ids, None, no_pads), frames_per_token


class FrameStage(nn.Module):
    """(d, t_en, frames per token, ref_s) -> audio (B, frames * samples per frame) for a fixed
    ``frames`` bucket, through the model's masked frame path (each item as it would be alone)."""

    def __init__(self, model: KokoroModel, shared_lstm: MaskedBiLstm, frames: int,
                 projections: nn.ModuleDict | None = None):
        """``projections``: StyleProjections of the model's "prosody" and "decoder" sides, when its
        AdaINs read them (BucketedEngine's ``stacked_projections``)."""
        super().__init__()
        self.model, self.shared_lstm, self.frames = model, shared_lstm, frames
        self.projections = projections
        self.dtype = model.bert_encoder.weight.dtype

    def forward(self, d, t_en, frames_per_token, ref_s, *noise):
        """``noise``: nothing (no source noise, as the shipped graph), or the two SourceNoise draws
        as tensors, initial phases (B, HARMONICS) and additive noise (B, frames * spf, HARMONICS)."""
        # Autocast as well as half weights: the model's masks are FP32 and promote what they
        # multiply, and autocast casts such tensors back before each convolution.
        with torch.autocast(d.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            return self._forward(d, t_en, frames_per_token, ref_s, SourceNoise(*noise) if noise else None)

    def _forward(self, d, t_en, frames_per_token, ref_s, noise=None):
        acoustic_style, prosody_style = self.block_style(ref_s, "decoder"), self.block_style(ref_s, "prosody")
        en, asr, frame_lengths = self.frame_features(d, t_en, frames_per_token)
        f0_curve, energy = self.f0_and_energy(en, prosody_style, frame_lengths)
        return self.model.decoder(asr, f0_curve, energy, acoustic_style, noise, frame_lengths)[:, 0]  # (B, F * spf)

    def block_style(self, ref_s, side: str):
        """ref_s (B, 2S) -> what the ``side`` ("decoder" or "prosody") blocks take as their style: its
        half of ref_s (B, S), or with ``projections`` that side's stacked AdaIN projections (B, sum 2C)
        float32."""
        acoustic_style, prosody_style = self.model.split_style(ref_s.to(self.dtype))
        style = acoustic_style if side == "decoder" else prosody_style
        return style if self.projections is None else self.projections[side](style)

    def frame_features(self, d, t_en, frames_per_token):
        """The text features spread over the bucket's frames: en (B, H + S, F), asr (B, H, F), and
        each item's frame count (B,)."""
        alignment = alignment_matrix(frames_per_token, self.frames).to(self.dtype)  # (B, T, F_bucket)
        frame_lengths = frames_per_token.sum(dim=-1).clamp_max(self.frames)  # (B,)
        return d.to(self.dtype).transpose(-1, -2) @ alignment, t_en.to(self.dtype) @ alignment, frame_lengths

    def f0_and_energy(self, en, style, frame_lengths):
        """ProsodyPredictor.F0Ntrain with its frame lengths, the BiLSTM run without packing (packing
        reads the lengths on the host, which a CUDA graph cannot)."""
        predictor = self.model.predictor
        shared = self.shared_lstm(en.transpose(1, 2), frame_lengths).transpose(1, 2)  # (B, H, F)
        mask = length_mask(frame_lengths, en.shape[-1]).to(self.dtype)  # (B, 1, F)
        curves = []
        for blocks, projection in ((predictor.F0, predictor.F0_proj), (predictor.N, predictor.N_proj)):
            x, block_mask = shared, mask
            for block in blocks:
                x = block(x, style, block_mask)
                if block.upsample:
                    block_mask = block_mask.repeat_interleave(2, dim=-1)  # (B, 1, 2F)
            curves.append(projection(x).squeeze(1) * block_mask.squeeze(1))  # (B, 2F)
        return curves[0], curves[1]


def frame_side_copy(model: KokoroModel, dtype: torch.dtype) -> KokoroModel:
    """A copy of ``model`` in ``dtype`` with the FP32 islands of the module docstring."""
    frame_model = copy.deepcopy(model)
    islands = []
    for module in list(frame_model.modules()):
        islands += [(module, name, dtype) for name, child in module.named_children() if isinstance(child, AdaIN1d)]
    predictor, decoder, generator = frame_model.predictor, frame_model.decoder, frame_model.decoder.generator
    islands += [(predictor, "F0_proj", None), (predictor, "N_proj", dtype), (decoder, "F0_conv", dtype),
                (decoder, "N_conv", dtype), (generator, "m_source", None), (generator, "conv_post", None)]
    for owner, name, output_dtype in islands:
        setattr(owner, name, Float32Island(getattr(owner, name), output_dtype))
    generator.stft = Float32Stft(generator.stft, dtype)
    frame_model.to(dtype)
    for owner, name, _ in islands:
        getattr(owner, name).float()
    generator.stft.float()
    return frame_model.eval()


class TableColumns(nn.Module):
    """An AdaIN's style projection read from a table of all of them: (B, sum 2C) -> (B, 2C)."""

    def __init__(self, start: int, stop: int):
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, table: torch.Tensor) -> torch.Tensor:
        return table[:, self.start:self.stop]


class StyleProjections(nn.Module):
    """Every AdaIN1d style projection under ``root`` as one product.

    Each AdaIN maps the style vector to its scale and shift with a product of its own: 70 in the
    frame stage, each a (B, S) x (S, 2C) matrix product far too small to fill a GPU yet a kernel of
    its own (on an H100 at batch 16, 40 us each for the narrow ones). Stacked, they are one
    (B, S) x (S, sum 2C) product. Building this replaces each AdaIN's ``fc`` under ``root`` by its
    columns of that table, so ``root``'s blocks must then be passed ``self(style)`` where they were
    passed the style (they use the style for nothing else). The table is float32, as the AdaIN
    islands compute their projections; the sums are the same."""

    def __init__(self, root: nn.Module):
        super().__init__()
        adains = [module for module in root.modules() if isinstance(module, AdaIN1d)]
        if not adains:
            raise ValueError(f"no AdaIN1d under {type(root).__name__}: nothing to stack")
        weights, biases, start = [], [], 0
        for adain in adains:
            fc = adain.fc
            weights.append(fc.weight.detach().float())  # (2C, S)
            biases.append(fc.bias.detach().float())  # (2C,)
            adain.fc = TableColumns(start, start + fc.out_features)
            start += fc.out_features
        self.register_buffer("weight", torch.cat(weights))  # (sum 2C, S)
        self.register_buffer("bias", torch.cat(biases))  # (sum 2C,)

    def forward(self, style: torch.Tensor) -> torch.Tensor:
        """style (B, S) -> (B, sum 2C) float32."""
        with torch.autocast(style.device.type, enabled=False):
            return nn.functional.linear(style.float(), self.weight, self.bias)


class BucketedEngine:
    """Kokoro synthesis over exact text shapes and frame buckets (see the module docstring).

    ``graphs`` replays each stage as a CUDA graph (CUDA only); without it the same padded stages run
    eagerly, which is what the CPU tests compare with the model.
    """

    def __init__(self, model: KokoroModel, graphs: bool = True, frame_dtype: torch.dtype = torch.float32,
                 frame_bucket: int = FRAME_BUCKET, compile_stages: bool = False, conv_layout: str = "ncw",
                 compile_mode: str | None = None, pinned_output: bool = True, fused_bilstm: bool = False,
                 text_tf32: bool = False, fold_dilation: bool = False, align_channels: int = 1,
                 statistics_dtype: torch.dtype = torch.float64, stacked_projections: bool = True,
                 fused_text_lstms: bool = False):
        """``compile_stages``: both stages through torch.compile, one compile per shape (module
        docstring); the first batch of a new shape pays it. ``conv_layout``: the frame stage's
        convolutions in that layout (models/conv_layout.py). "channels_last" removes the NCHW <-> NHWC
        transposes cuDNN runs around each tensor-core convolution (438 kernels, 8.3 ms of the compiled
        batch-16 pair at width (128, 64) on the H200). With the model's float64 statistics it measured
        no faster: the compiled AdaIN and Snake passes, which reduce over time, then read channels-
        fastest tensors and take that time (docs/results/h200_23_kernels_compiled_graphs_fp16_channels_
        last_b16.json). With float32 statistics and stacked projections it pays: frame stage 24.3
        against 28.8 ms and RTF 0.000193 at batch 16, compiled, with both BiLSTM knobs on as well
        (docs/results/h200_34_kokoro_128_64.json).
        NCW stays the default: the server runs this engine uncompiled, where the layout is untimed.
        ``compile_mode``: torch.compile's mode for both stages (None: its default); with
        "max-autotune-no-cudagraphs" the compiler times its own convolution and matmul kernels against
        the library's for each shape (minutes a shape; the engine captures its own graphs).
        ``pinned_output``: the audio comes back through page-locked memory (models/cuda_graphs.to_host).
        ``fused_bilstm``: the frame-rate BiLSTM's two directions as one LSTM (MaskedBiLstm); at batch
        16 on the H200 within run-to-run spread (that LSTM is 1.3 of 51 ms), so off by default.
        ``text_tf32``: the text stage's FP32 products on tensor cores in TF32 (10-bit mantissas): 8.5 ->
        5.9 ms of a 61 ms batch of 16 on the H200 (docs/benchmarks.md, session 31). The stage is FP32
        because the durations are rounded from its output, where a rounding that tips moves a whole
        frame: emulated on the CPU (scripts/kokoro_tf32_durations.py), 1 of 4,351 tokens of the real
        voice moved by a frame. Off by default, so the engine equals the model. ``fold_dilation``: the
        generator's dilated convolutions run undilated over a folded view of time (models/conv_layout.py),
        same sums in another order: on an H100 at batch 16 and the student's width, 59.6 against 55.6 ms
        for the frame stage (docs/results/h100_32_kokoro_folded.json), so off. ``align_channels``: each
        convolution's input channels zero-padded to a multiple of it (NCW only; models/conv_layout.py).
        ``statistics_dtype``: the precision of every AdaIN's masked instance-norm statistics (models/kokoro/
        layers.py). float64, the model's own, is the default, so the engine equals the model. float32 on
        the real voice (8 eval_ja sentences, FP32 frame stage on this CPU): waveform SNR min 33.7, median
        37.5 dB against float64 (F0 integrates small differences into phase), STFT-magnitude SNR min 41.1,
        median 43.8 dB, MCD 0.03 dB, speaker similarity 1.000, DNSMOS P.808 unchanged (docs/results/
        cpu_32_kokoro_statistics_dtype.json); with the FP16 frame stage, MCD 0.226 against 0.224 dB and
        DNSMOS 3.829 against 3.826 (cpu_32_kokoro_statistics_dtype_fp16.json). The CPU graphs take
        float32 too. On the H200 at batch 16 with the text stage in TF32: RTF 0.000335 against 0.000372
        for float64 without TF32 at the student's width (144, 72), 0.000241 against 0.000293 at (128, 64)
        (docs/results/h200_33_kokoro_*.json). ``stacked_projections``: every AdaIN's style projection
        computed as one product per half of the style vector at the top of the frame stage
        (StyleProjections), not 70 small ones: the same sums, and on an H100 at batch 16 and width
        (128, 64) RTF 0.000231 against 0.000264 in one call (frame stage 31.6 against 36.3 ms;
        docs/results/h100_33_kokoro_stacked_128_64.json). ``fused_text_lstms``: the text stage's five
        token-rate BiLSTMs each run their two directions as one LSTM (``UnpaddedBiLstm``), halving
        their sequential steps, which on the H200 are most of that stage's time (2 x 290 cell steps a
        batch pair at batch 16, about 4 of its 4.7 ms; docs/results/h200_33_kokoro_kernels_*). The
        same sums plus zeros. Measured slower, so off: with ``fused_bilstm`` too, the text stage took
        5.57 against 4.73 ms (the doubled step product becomes a TF32 GEMM, and the reversal here is a
        gather; docs/results/h200_34_kokoro_128_64.json)."""
        self.device = next(model.parameters()).device
        if graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {self.device}; pass graphs=False")
        self.graphs, self.frame_bucket = graphs, frame_bucket
        self.samples_per_frame = model.config.samples_per_frame
        self.compile_stages, self.compile_mode = compile_stages, compile_mode
        self.pinned_output = pinned_output and self.device.type == "cuda"
        if compile_mode is not None and not compile_stages:
            raise ValueError(f"compile_mode={compile_mode!r} needs compile_stages=True")
        if compile_stages:
            # Every shape of a stage shares its forward's code object, whose compiled graphs
            # torch.compile caps at 8 before it silently runs eager: a server meets more shapes.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILED_SHAPES)
        self.text_stage = self._compiled(TextStage(text_side_copy(model) if fused_text_lstms else model).eval())
        self.frame_model = set_statistics_dtype(frame_side_copy(model, frame_dtype), statistics_dtype)
        if conv_layout != "ncw" or fold_dilation or align_channels > 1:  # the text side of this copy is never
            # run: converting it is harmless
            convert_convs(self.frame_model, conv_layout, fold_dilation, align_channels)
        self.projections = None
        if stacked_projections:
            # On the frame model's device already: the stacks are built from its AdaINs' weights.
            self.projections = nn.ModuleDict({"prosody": StyleProjections(self.frame_model.predictor),
                                              "decoder": StyleProjections(self.frame_model.decoder)})
        self.text_tf32 = text_tf32
        self.shared_lstm = MaskedBiLstm(model.predictor.shared, fused_bilstm).to(self.device, frame_dtype).eval()
        self.frame_stages: dict[int, nn.Module] = {}  # frame bucket -> stage (they share frame_model)
        self.cache = GraphCache() if graphs else None
        self.device_lock = threading.Lock()  # graphs' static buffers serve one batch at a time

    def _compiled(self, stage: nn.Module) -> nn.Module:
        return torch.compile(stage, dynamic=False, mode=self.compile_mode) if self.compile_stages else stage

    def _frame_stage(self, frames: int) -> tuple[int, nn.Module]:
        """(the frame bucket ``frames`` rounds up to, its stage, built on first use)."""
        bucket = math.ceil(frames / self.frame_bucket) * self.frame_bucket
        if bucket not in self.frame_stages:
            self.frame_stages[bucket] = self._compiled(FrameStage(self.frame_model, self.shared_lstm, bucket,
                                                                    self.projections))
        return bucket, self.frame_stages[bucket]

    def _run(self, key: tuple, stage: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        with tf32_products(self.text_tf32 and key[0] == "text"):
            return self.cache.run(key, stage, inputs) if self.graphs else as_tuple(stage(*inputs))

    @torch.inference_mode()
    def synthesize(self, input_ids: torch.Tensor, ref_s: torch.Tensor, speed: float = 1.0,
                   frames_per_token: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """input_ids (B, T) with the 0 pads at both ends, ref_s (B, 2S) ->  ``audio`` (B, max frames *
        samples per frame) float32 on the host, ``audio_lengths`` (B,), ``frames_per_token`` (B, T).
        ``frames_per_token`` forces the durations (timing with random weights, parity)."""
        batch, length = input_ids.shape
        ids = input_ids.to(self.device)
        style = ref_s.to(self.device, torch.float32)
        speed_t = torch.full((1,), float(speed), device=self.device)
        with self.device_lock:
            d, t_en, predicted = self._run(("text", batch, length), self.text_stage, (ids, style, speed_t))
            frames_per_token = predicted if frames_per_token is None else frames_per_token.to(self.device)
            frame_counts = frames_per_token.sum(dim=-1)  # (B,)
            frames = int(frame_counts.max())  # the one host sync
            bucket, stage = self._frame_stage(frames)
            audio, = self._run(("frames", batch, length, bucket), stage, (d, t_en, frames_per_token, style))
            return {"audio": to_host(audio[:, : frames * self.samples_per_frame].float(), self.pinned_output),
                    "audio_lengths": (frame_counts * self.samples_per_frame).cpu(),
                    "frames_per_token": frames_per_token.cpu()}

    @torch.inference_mode()
    def synthesize_rows(self, rows: list[torch.Tensor], ref_s: torch.Tensor, speed: float = 1.0,
                        noise: SourceNoise | None = None,
                        batch_buckets: tuple[int, ...] | None = None) -> dict[str, torch.Tensor]:
        """Sentences of different lengths in one batch: ``rows`` the ids of each (L_i,) with their 0
        pads, ``ref_s`` (B, 2S), ``noise`` the voice's SourceNoise draws for the B rows (None: none)
        -> ``audio`` (B, max frames * spf) float32 on the host, ``audio_lengths`` (B,),
        ``frames_per_token`` (B, T_bucket) with zeros past each row's ids.

        The text side has no padding mask, so each row's text stage runs at its own length
        (batch 1, a graph per length). The frame stage takes the token axis only through the
        alignment, where a token of zero frames adds nothing: rows are padded to a multiple of
        TOKEN_BUCKET tokens with zero durations and run as one batch, each as it would run alone.
        ``batch_buckets``: the batch padded with copies of its first row up to the next size, so a
        server's frame-stage graphs stay few."""
        batch = len(rows)
        if batch == 0 or ref_s.shape[0] != batch:
            raise ValueError(f"synthesize_rows: {batch} rows and {ref_s.shape[0]} styles; give one style per row")
        padded_batch = batch if not batch_buckets else next((size for size in sorted(batch_buckets) if size >= batch), None)
        if padded_batch is None:
            raise ValueError(f"batch of {batch} rows: larger than the largest batch bucket {max(batch_buckets)}")
        filler = [0] * (padded_batch - batch)  # rows copied into the padding
        order = [*range(batch), *filler]
        style = ref_s.to(self.device, torch.float32)[order]  # (B_bucket, 2S)
        speed_t = torch.full((1,), float(speed), device=self.device)
        tokens = math.ceil(max(len(row) for row in rows) / TOKEN_BUCKET) * TOKEN_BUCKET
        with self.device_lock:
            d_rows, t_en_rows, durations = [], [], []
            for index in range(batch):
                ids = rows[index].to(self.device).unsqueeze(0)  # (1, L_i)
                d, t_en, predicted = self._run(("text", 1, ids.shape[1]), self.text_stage,
                                               (ids, style[index:index + 1], speed_t))
                pad = tokens - ids.shape[1]
                # Copied out of the graph's buffers before the next replay of the same length.
                d_rows.append(torch.nn.functional.pad(d, (0, 0, 0, pad)))  # (1, T_bucket, H + S)
                t_en_rows.append(torch.nn.functional.pad(t_en, (0, pad)))  # (1, H, T_bucket)
                durations.append(torch.nn.functional.pad(predicted, (0, pad)))  # (1, T_bucket), zeros past L_i
            d = torch.cat(d_rows)[order]
            t_en = torch.cat(t_en_rows)[order]
            frames_per_token = torch.cat(durations)[order]  # (B_bucket, T_bucket)
            frame_counts = frames_per_token.sum(dim=-1)  # (B_bucket,)
            frames = int(frame_counts.max())  # the one host sync
            bucket, stage = self._frame_stage(frames)
            inputs = (d, t_en, frames_per_token, style)
            if noise is not None:
                samples = bucket * self.samples_per_frame  # the stage's source length: cut or zero-extended to it
                inputs += (noise.initial_phase.to(self.device, torch.float32)[order],
                           samples_of(noise.additive, samples).to(self.device, torch.float32)[order])
            audio, = self._run(("frames", padded_batch, tokens, bucket, noise is not None), stage, inputs)
            return {"audio": to_host(audio[:batch, : frames * self.samples_per_frame].float(), self.pinned_output),
                    "audio_lengths": (frame_counts[:batch] * self.samples_per_frame).cpu(),
                    "frames_per_token": frames_per_token[:batch].cpu()}
