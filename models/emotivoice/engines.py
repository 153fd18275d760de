r"""EmotiVoice on CUDA as two stages run at bucketed shapes, each shape replayed as a CUDA graph.

    from models.emotivoice.engines import BucketedEngine
    engine = BucketedEngine(generator, graphs=True, frame_dtype=torch.float16)
    out = engine.synthesize(phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding)
    out["audio"]  # (B, max frames * hop) float32 on the host; out["audio_lengths"] (B,)

Why: at batch 1 the eager model is launch bound (about 15 ms on the H200 for hundreds of small
kernels; docs/results/h200_7_emotivoice.json). The frame count is known only after the duration
predictor, so synthesis splits there (models/piper/engines.py is the same pattern for Piper):

    text stage  (B, T_text_bucket), FP32:              encoder, variance predictors -> hidden, durations
    frame stage (B, T_text_bucket, T_frame_bucket):    Gaussian upsampling, decoder, HiFi-GAN -> audio

with one device-to-host read of the frame count between them. Both stages run the acoustic model's
``masked=True`` path, which zeroes padding before every convolution and masks attention keys, so
a row padded to a bucket computes what its own exact-length run computes: the buckets change no
sample (tests/models/emotivoice/test_emotivoice_engines.py). The text stage stays in FP32 so that half
precision cannot move a rounded duration; the frame stage, the bulk of the time, runs in
``frame_dtype``: FP16 by default (on the H200, docs/results/h200_7_emotivoice_engines.json:
4.8 ms at batch 1 against 5.4 ms in FP32, 52.9 dB SNR against eager FP32; BF16 is as fast at 35 dB).

``frame_groups`` > 1 runs a batch's frame stage in that many runs instead of one: the rows sorted
by frame count and cut into groups of near-equal size (of a batch bucket's size where rows are padded
to batch buckets: BucketedEngine._group_sizes), each group padded only to its own longest row. Why: a
batch pads every row to its longest, and the bench's batch of 64 mixed-length sentences has 183 frames
a row on average in a bucket of 288, so 36 % of the vocoder's work is padding; two groups cut the
frames computed to 0.83x, four to 0.75x (from the text stage's durations on this CPU,
scripts/emotivoice_frame_padding.py). Each group is one more graph replay at a smaller batch: the GPU
decides whether that pays.

``compile_frames`` runs each frame bucket's stage through torch.compile before it is captured (with
``compile_dynamic``, one stage for every bucket, compiled with symbolic sizes; still captured per shape).
Why: at batch 64 the vocoder is 91 % of the engine's time, and most of that is not convolution but
the elementwise passes between them (LeakyReLU, the padding mask, residual sums: 78 calls each of
two strided kernels, 55 % of the vocoder's kernel time on the H200,
docs/results/h200_13_emotivoice_profile.json); the compiler fuses each chain into one pass.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import threading

import torch
from torch import nn
from torch.fx.experimental import _config as fx_config
from torch.nn.utils import parametrize

from models.conv_layout import convert_convs
from models.cuda_graphs import GraphCache, as_tuple, to_host
from models.cudnn_epilogue import cudnn_frontend_available
from models.emotivoice.generator import EmotiVoiceGenerator
from models.emotivoice.hifigan import FINAL_LRELU_SLOPE, LRELU_SLOPE
from models.epilogue_hifigan import EpilogueHifigan

TEXT_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # symbols; a batch pads to the next one
FRAME_BUCKET = 32  # frames round up to a multiple of this (0.51 s at hop 256, 16 kHz)
VOCODER_KERNELS = ("torch", "triton", "cudnn")
COMPILED_SHAPES = 256  # compiled frame-stage shapes kept before torch.compile would fall back to eager


def bucket_of(length: int, buckets: tuple[int, ...], what: str) -> int:
    for size in buckets:
        if length <= size:
            return size
    raise ValueError(f"{what} of {length}: larger than the largest bucket {buckets[-1]}")


class TextStage(nn.Module):
    """(ids, lengths, speakers, style, content, length scales (B, 1)) -> hidden (B, T, h), used
    durations (B, T) int64, durations (B, T) int64. The pace is an input, so one graph serves every speed."""

    def __init__(self, generator: EmotiVoiceGenerator):
        super().__init__()
        self.am = generator.am

    def forward(self, phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding, length_scales):
        out = self.am.predict_variance(phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding,
                                       masked=True, length_scale=length_scales)
        return out["hidden"], out["used_durations"], out["durations"]


class FrameStage(nn.Module):
    """(hidden, used durations, lengths) -> audio (B, frames * hop) for a fixed ``frames`` bucket."""

    def __init__(self, generator: EmotiVoiceGenerator, frames: int, vocoder: nn.Module | None = None):
        """``vocoder``: what turns the mel into audio, the generator's HiFi-GAN if None (the fused
        one of models/fused_hifigan.py takes the same arguments)."""
        super().__init__()
        self.am, self.frames = generator.am, frames
        self.vocoder = generator.generator if vocoder is None else vocoder
        self.dtype = next(generator.parameters()).dtype

    def with_compiled_mel(self) -> "FrameStage":
        """The mel half through torch.compile (static shapes), the vocoder as it is: for a vocoder of
        hand-written kernels, which the compiler has nothing to add to."""
        self.mel = torch.compile(self.mel, dynamic=False)
        return self

    def mel(self, hidden, used_durations, phoneme_lengths):  # -> (B, n_mels, F_bucket)
        return self.mel_of(hidden, used_durations, phoneme_lengths, self.frames)

    def mel_of(self, hidden, used_durations, phoneme_lengths, frames):  # -> (B, n_mels, frames)
        return self.am.frames_to_mel(hidden.to(self.dtype), used_durations, phoneme_lengths, frames,
                                     masked=True).transpose(1, 2)

    def vocode(self, mel, frame_lengths):  # (B, n_mels, F_bucket), (B,) -> (B, F_bucket * hop)
        return self.vocoder(mel, frame_lengths)[:, 0]

    def forward(self, hidden, used_durations, phoneme_lengths):
        return self.vocode(self.mel(hidden, used_durations, phoneme_lengths), used_durations.sum(dim=-1))


class AnyFrameStage(FrameStage):
    """(hidden, used durations, lengths, frame slots (F,)) -> audio (B, F * hop): the frame stage of every
    bucket at once. The bucket is the length of ``frame_slots`` (its values are never read), so one
    compile with symbolic sizes serves every frame bucket, row count and text bucket."""

    def __init__(self, generator: EmotiVoiceGenerator):
        super().__init__(generator, frames=0)

    def forward(self, hidden, used_durations, phoneme_lengths, frame_slots):
        mel = self.mel_of(hidden, used_durations, phoneme_lengths, frame_slots.shape[0])  # (B, n_mels, F)
        return self.vocode(mel, used_durations.sum(dim=-1))


class DistinctSizes(nn.Module):
    """``module`` traced with every size a symbol of its own. Why: by default torch gives sizes that happen
    to be equal one symbol when it traces (a text bucket equal to the model width), and the next shape
    where they differ compiles again (on the CPU, 3 compiles against 2 for the same five shapes)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *inputs):
        with fx_config.patch(use_duck_shape=False):
            return self.module(*inputs)


def even_sizes(rows: int, groups: int) -> list[int]:
    """``rows`` cut into ``groups`` near-equal sizes, differing by at most one."""
    return [(k + 1) * rows // groups - k * rows // groups for k in range(groups)]


def length_groups(frame_counts: list[int], groups: int) -> list[list[int]]:
    """Row indices of each frame-stage run: the rows sorted by frame count (shortest first), cut into
    ``groups`` runs of near-equal size (fewer when there are fewer rows)."""
    groups = max(1, min(groups, len(frame_counts)))
    return sorted_runs(frame_counts, even_sizes(len(frame_counts), groups))


def sorted_runs(frame_counts: list[int], sizes: list[int]) -> list[list[int]]:
    """Row indices of each frame-stage run: the rows sorted by frame count (shortest first), cut into
    consecutive runs of ``sizes`` rows (summing to the row count)."""
    if sum(sizes) != len(frame_counts):
        raise ValueError(f"run sizes {sizes} sum to {sum(sizes)}, not the {len(frame_counts)} rows")
    order = sorted(range(len(frame_counts)), key=frame_counts.__getitem__)
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return [order[start: start + size] for start, size in zip(starts, sizes)]


def fused_vocoder(hifigan: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The HiFi-GAN as fused Triton convolutions; Triton is optional (a GPU machine has it)."""
    if importlib.util.find_spec("triton") is None:
        raise ValueError("vocoder_kernels='triton' needs the triton package (it comes with CUDA builds of torch)")
    from models.fused_hifigan import FusedHifigan
    return FusedHifigan(hifigan, LRELU_SLOPE, FINAL_LRELU_SLOPE, dtype)


def folded_copy(generator: EmotiVoiceGenerator) -> EmotiVoiceGenerator:
    """A copy with weight norm folded (once, not in every call), whether or not ``generator``'s is."""
    if any(parametrize.is_parametrized(module) for module in generator.modules()):
        return generator.inference_copy()
    return copy.deepcopy(generator).eval()


class BucketedEngine:
    """EmotiVoice synthesis over text and frame buckets (see the module docstring).

    ``graphs`` replays each stage as a CUDA graph per bucket (CUDA only); without it the same
    padded stages run eagerly, which is what the CPU tests compare with the model.
    ``batch_buckets`` pads the batch to a few sizes so a server's graphs stay few; None: exact sizes.
    """

    def __init__(self, generator: EmotiVoiceGenerator, graphs: bool = True, frame_dtype: torch.dtype = torch.float16,
                 batch_buckets: tuple[int, ...] | None = None, text_buckets: tuple[int, ...] = TEXT_BUCKETS,
                 frame_bucket: int = FRAME_BUCKET, length_scale: float = 1.0, conv_layout: str | None = None,
                 compile_frames: bool = False, vocoder_kernels: str = "torch", compile_mode: str | None = None,
                 pinned_output: bool = True, fold_dilation: bool = False, frame_groups: int = 1,
                 min_group_rows: int = 1, compile_dynamic: bool = False):
        """``conv_layout`` (models/conv_layout.py) of the frame stage's convolutions; None: channels-last
        2-D convolutions on CUDA (tensor-core kernels: 1.44 against 2.23 ms for the FP16 vocoder at
        batch 1 on the H200, docs/results/h200_8_conv_layout.json), the model's own elsewhere.
        ``compile_frames``: each frame bucket's stage through torch.compile (module docstring); the
        first batch of a new (rows, text bucket, frame bucket) shape pays a compile. ``vocoder_kernels``:
        "torch" (the HiFi-GAN module, in ``conv_layout``), or "triton": one fused Triton kernel per
        convolution (models/fused_hifigan.py; needs Triton, so a GPU or ``TRITON_INTERPRET=1``); with
        ``compile_frames`` only the mel half is then compiled; or "cudnn": the block convolutions with
        their bias, LeakyReLU, mask and residual in cuDNN's epilogue (models/epilogue_hifigan.py; on CUDA
        it needs nvidia-cudnn-frontend, elsewhere the same formula runs in PyTorch), compiled like "torch".
        "torch" is the default: on the H200 the Triton vocoder is the slower one as its kernels stand,
        and compiling them takes minutes; the cuDNN one ran batch 1,024 at 1.048x on an H100 with its
        plans timed, but that batch's first run took 279 s against 28 s, since every new shape builds its
        own graphs (docs/benchmarks.md, EmotiVoice rows and session 48).
        ``compile_mode``: torch.compile's mode with ``compile_frames`` (None: its default; with
        "max-autotune-no-cudagraphs" the compiler times its own convolution kernels against cuDNN's,
        minutes a bucket). ``pinned_output``: the audio comes back through page-locked memory
        (models/cuda_graphs.to_host). ``fold_dilation``: the vocoder's dilated convolutions run undilated
        over a folded view of time (models/conv_layout.py), same sums in another order: on an H100,
        throughput within 3 % of the unfolded engine either way and batch 1 slower, 3.43 against 3.10 ms
        (docs/results/h100_32_emotivoice_folded.json), so off. ``frame_groups``: the frame stage of a
        batch in at most that many length groups (module docstring); 1, one run, is the default.
        ``min_group_rows``: fewer groups where they would hold fewer rows than this. On the H200 (compiled
        FP16 graphs, one call, docs/results/h200_33_emotivoice_groups48.json) four groups of 16 rows ran
        batch 64 at 1,664 sentences/s and eight groups of 8 at 1,537: small groups leave the GPU
        underused. Against one run, side by side on an H100: 1,481 against 1,287 at batch 64
        (docs/results/h100_35_emotivoice_groups4.json); the server's engine takes them from
        ``serve.engine_options`` (ServedEngineOptions, models/emotivoice/engine_voice.py).
        ``compile_dynamic`` (with ``compile_frames``): one frame stage for every bucket (AnyFrameStage),
        compiled with symbolic sizes: a few compiles in all (a batch of one row is specialised apart, and
        a kernel may guard a range of row counts), not one per (rows, text bucket, frame bucket) shape.
        Why: a server warms every batch bucket at every text bucket and meets new frame buckets under
        load; at about 20 s a compile (H100), a 2-worker server with batches up to 1,024 was still warming
        up after 8 minutes (docs/benchmarks.md). CUDA graphs are still captured per shape, in a fraction
        of a second each."""
        if compile_dynamic and not compile_frames:
            raise ValueError("compile_dynamic=True needs compile_frames=True")
        if compile_dynamic and vocoder_kernels == "triton":
            raise ValueError("compile_dynamic=True compiles a PyTorch vocoder, not vocoder_kernels='triton'")
        if frame_groups < 1 or min_group_rows < 1:
            raise ValueError(f"frame_groups={frame_groups}, min_group_rows={min_group_rows}: each at least 1")
        self.frame_groups, self.min_group_rows = frame_groups, min_group_rows
        self.device = next(generator.parameters()).device
        if graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the generator on a CUDA device, not {self.device}; pass graphs=False")
        self.graphs, self.batch_buckets, self.text_buckets = graphs, batch_buckets, text_buckets
        self.frame_bucket, self.hop = frame_bucket, generator.config.upsample_factor
        self.length_scale = length_scale  # the pace of a call that names none
        self.text_stage = TextStage(folded_copy(generator).float()).eval()
        self.frame_model = folded_copy(generator).to(frame_dtype).eval()
        if vocoder_kernels not in VOCODER_KERNELS:
            raise ValueError(f"vocoder_kernels {vocoder_kernels!r}: use one of {list(VOCODER_KERNELS)}")
        self.triton_vocoder = None
        if vocoder_kernels == "triton":  # built before the layout conversion: it packs plain Conv1d weights
            self.triton_vocoder = fused_vocoder(self.frame_model.generator, frame_dtype)
        elif vocoder_kernels == "cudnn":  # likewise; its upsampling and outer convolutions are converted below
            if self.device.type == "cuda" and not cudnn_frontend_available():
                raise ValueError("vocoder_kernels='cudnn' on CUDA needs nvidia-cudnn-frontend (pip install "
                                 "nvidia-cudnn-frontend==1.16.0)")
            self.frame_model.generator = EpilogueHifigan(self.frame_model.generator, LRELU_SLOPE, FINAL_LRELU_SLOPE)
        conv_layout = conv_layout or ("channels_last" if self.device.type == "cuda" else "ncw")
        if conv_layout != "ncw" or fold_dilation:  # the acoustic decoder's convolutions, and the vocoder's unless
            # fused kernels replace it
            convert_convs(self.frame_model if self.triton_vocoder is None else self.frame_model.am, conv_layout,
                          fold_dilation)
        self.compile_frames, self.compile_mode, self.compile_dynamic = compile_frames, compile_mode, compile_dynamic
        if compile_mode is not None and not compile_frames:
            raise ValueError(f"compile_mode={compile_mode!r} needs compile_frames=True")
        self.pinned_output = pinned_output and self.device.type == "cuda"
        if compile_frames:
            # Every bucket's stage shares FrameStage.forward's code object, whose compiled graphs
            # torch.compile caps at 8 before it silently runs eager: a server meets more (frame
            # bucket x batch) shapes than that, each compiled once and then replayed as a graph.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILED_SHAPES)
        self.frame_stages: dict[int, nn.Module] = {}  # frame bucket -> stage (they share frame_model)
        self.any_frame_stage = None  # compile_dynamic: the one stage of every bucket, compiled on first use
        self.frame_slots: dict[int, torch.Tensor] = {}  # compile_dynamic: frame bucket -> (bucket,) uint8
        self.cache = GraphCache() if graphs else None
        self.device_lock = threading.Lock()  # graphs' static buffers serve one batch at a time

    def _run(self, key: tuple, stage: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return self.cache.run(key, stage, inputs) if self.graphs else as_tuple(stage(*inputs))

    def _frame_run(self, rows: int, text: int, frames: int, hidden: torch.Tensor, used_durations: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
        """The frame stage of ``rows`` rows in the bucket of ``frames`` -> audio (rows, bucket * hop): a
        graph's static output, valid until that graph runs again."""
        bucket = math.ceil(frames / self.frame_bucket) * self.frame_bucket
        if self.compile_dynamic:
            if self.any_frame_stage is None:
                self.any_frame_stage = DistinctSizes(torch.compile(AnyFrameStage(self.frame_model).eval(),
                                                                   dynamic=True, mode=self.compile_mode))
            if bucket not in self.frame_slots:
                self.frame_slots[bucket] = torch.empty(bucket, dtype=torch.uint8, device=self.device)
            audio, = self._run(("frames", rows, text, bucket), self.any_frame_stage,
                               (hidden, used_durations, lengths, self.frame_slots[bucket]))
            return audio
        if bucket not in self.frame_stages:
            stage = FrameStage(self.frame_model, bucket, self.triton_vocoder).eval()
            # Static shapes: a compile per (rows, text bucket) shape of this frame bucket, each replayed as a
            # graph anyway.
            if self.compile_frames and self.triton_vocoder is not None:
                stage = stage.with_compiled_mel()
            elif self.compile_frames:
                stage = torch.compile(stage, dynamic=False, mode=self.compile_mode)
            self.frame_stages[bucket] = stage
        # A filler row longer than the bucket would only be cut short: its durations are not read back.
        audio, = self._run(("frames", rows, text, bucket), self.frame_stages[bucket], (hidden, used_durations, lengths))
        return audio

    def _grouped_frame_runs(self, batch: int, text: int, frame_lengths: torch.Tensor, hidden: torch.Tensor,
                            used_durations: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The frame stage of the first ``batch`` rows in ``_groups(batch)`` length groups -> (audio (batch,
        longest * hop), longest frame count). A group's rows past its own size repeat its first row. Past
        a row's end the samples are whatever its group computed there, or zeros past the group's
        longest row: callers read ``audio_lengths`` samples, as in the one-run path."""
        counts = frame_lengths[:batch].tolist()  # the one host sync
        frames = max(counts)
        groups = sorted_runs(counts, self._group_sizes(batch))
        padded = [group + group[:1] * (self._rows(len(group)) - len(group)) for group in groups]
        # Every group's row indices in one host-to-device copy that does not wait for the stream (a
        # blocking copy per group would stall the host on the previous group's replay).
        flat = torch.tensor([row for group in padded for row in group], dtype=torch.long,
                            pin_memory=self.device.type == "cuda")
        flat = flat.to(self.device, non_blocking=True)  # (sum of group rows,)
        audio, start = None, 0
        for group, padded_group in zip(groups, padded):
            rows = len(padded_group)
            index = flat[start: start + rows]  # (rows,)
            start += rows
            group_frames = max(counts[row] for row in group)
            out = self._frame_run(rows, text, group_frames, hidden.index_select(0, index),
                                  used_durations.index_select(0, index), lengths.index_select(0, index))
            if audio is None:
                audio = out.new_zeros(batch, frames * self.hop)  # (B, longest * hop)
            # Copied out at once: another group of the same shape replays the same graph.
            audio[index[: len(group)], : group_frames * self.hop] = out[: len(group), : group_frames * self.hop]
        return audio, frames

    def _groups(self, batch: int) -> int:
        """How many length groups a batch of ``batch`` rows runs its frame stage in."""
        return len(self._group_sizes(batch))

    def _group_sizes(self, batch: int) -> list[int]:
        """The rows of each length group, shortest rows' group first: up to ``frame_groups`` groups of at
        least ``min_group_rows`` rows, of near-equal size without batch buckets. With them, each group is
        padded to a bucket, so the groups take a bucket's size of at least ``min_group_rows`` and only the
        last is smaller. Why: 650 rows in 20 near-equal groups of 32 or 33 compute 960 rows once the 33s
        are padded to 64; 20 groups of 32 and one of 10 compute 656."""
        groups = max(1, min(self.frame_groups, batch // self.min_group_rows))
        if groups == 1:
            return [batch]
        if self.batch_buckets is None:
            return even_sizes(batch, groups)
        target = math.ceil(batch / groups)
        fitting = [size for size in self.batch_buckets if self.min_group_rows <= size <= target]
        if fitting and math.ceil(batch / fitting[-1]) <= self.frame_groups:
            size = fitting[-1]
        else:  # a bucket at or above the near-equal size, so the groups stay within frame_groups
            size = bucket_of(target, self.batch_buckets, "batch")
        return [size] * (batch // size) + ([batch % size] if batch % size else [])

    def group_rows(self, max_batch: int) -> list[int]:
        """Every row count a frame-stage run can have in batches of 1 to ``max_batch`` rows: each length
        group's size, padded to its batch bucket."""
        if self.batch_buckets is None:
            raise ValueError("group_rows needs batch buckets: without them a run has any row count")
        return sorted({self._rows(size) for batch in range(1, max_batch + 1) for size in self._group_sizes(batch)})

    def captured_frame_shapes(self) -> set[tuple[int, int, int]]:
        """(rows, text bucket, frame bucket) of every frame-stage graph captured so far; none without graphs."""
        return {key[1:] for key in self.cache.captured if key[0] == "frames"} if self.graphs else set()

    def longest_frame_buckets(self) -> dict[int, int]:
        """Text bucket -> the longest frame bucket captured at it."""
        longest: dict[int, int] = {}
        for _, text, bucket in self.captured_frame_shapes():
            longest[text] = max(bucket, longest.get(text, 0))
        return longest

    @torch.inference_mode()  # as synthesize: no autograd state kept in the graphs' pool
    def fill_frame_shapes(self, max_batch: int) -> int:
        """Captures the frame stage at every shape not yet captured between those that are: for each text
        bucket the frame stage has run at, every row count of ``group_rows(max_batch)`` at every frame
        bucket up to the longest captured at that text bucket. Returns how many it captured; 0 without
        graphs. Why: a server's warm-up batches meet only some (rows, frame bucket) pairs, and on an H100
        two workers still captured 8-12 graphs in each 23 s load level after it (0.1-0.7 s each, the
        worker's batch waiting; docs/benchmarks.md, session 45), each at a frame bucket the warm-up had met
        only with other row counts. Lengths past the longest warm-up sentence stay to be met under load.
        Rows are not checked against the server's phoneme budget: a shape it can never form costs only
        warm-up time."""
        if not self.graphs:
            return 0
        captured, longest = self.captured_frame_shapes(), self.longest_frame_buckets()
        row_counts = self.group_rows(max_batch)
        missing = [(rows, text, bucket) for text in sorted(longest)
                   for bucket in range(self.frame_bucket, longest[text] + 1, self.frame_bucket)
                   for rows in row_counts if (rows, text, bucket) not in captured]
        width = self.frame_model.config.encoder_n_hidden
        with self.device_lock:
            for rows, text, bucket in missing:
                # One symbol a row lasting the whole bucket: what the graph computes does not depend on it.
                hidden = torch.zeros(rows, text, width, device=self.device)  # (rows, T_text, h), as the text stage's
                durations = torch.zeros(rows, text, dtype=torch.long, device=self.device)  # (rows, T_text)
                durations[:, 0] = bucket
                lengths = torch.ones(rows, dtype=torch.long, device=self.device)
                self._frame_run(rows, text, bucket, hidden, durations, lengths)
        return len(missing)

    def _rows(self, batch: int) -> int:
        return batch if self.batch_buckets is None else bucket_of(batch, self.batch_buckets, "batch")

    @torch.inference_mode()
    def synthesize(self, phoneme_ids: torch.Tensor, phoneme_lengths: torch.Tensor, speaker_ids: torch.Tensor,
                   style_embedding: torch.Tensor, content_embedding: torch.Tensor,
                   length_scale: float | None = None) -> dict[str, torch.Tensor]:
        """phoneme_ids (B, T), phoneme_lengths (B,), speaker_ids (B,), style/content (B, 768) ->
        ``audio`` (B, max frames * hop) float32 on the host, ``audio_lengths``, ``durations`` (as
        predicted) and ``used_durations`` (paced by ``length_scale``, the engine's own if None)."""
        batch, length = phoneme_ids.shape
        rows, text = self._rows(batch), bucket_of(length, self.text_buckets, "text length")
        # Rows past ``batch`` are one-symbol fillers: cheap, and never read back.
        ids = torch.zeros(rows, text, dtype=torch.long, device=self.device)  # (B_bucket, T_bucket)
        ids[:batch, :length] = phoneme_ids
        lengths = torch.ones(rows, dtype=torch.long, device=self.device)
        lengths[:batch] = phoneme_lengths
        speakers = torch.zeros(rows, dtype=torch.long, device=self.device)
        speakers[:batch] = speaker_ids
        style = torch.zeros(rows, style_embedding.shape[-1], device=self.device)
        style[:batch] = style_embedding
        content = torch.zeros(rows, content_embedding.shape[-1], device=self.device)
        content[:batch] = content_embedding
        scale = self.length_scale if length_scale is None else length_scale
        length_scales = torch.full((rows, 1), float(scale), device=self.device)  # (B_bucket, 1)
        with self.device_lock:
            hidden, used_durations, durations = self._run(("text", rows, text), self.text_stage,
                                                          (ids, lengths, speakers, style, content, length_scales))
            frame_lengths = used_durations.sum(dim=-1)  # (B_bucket,)
            if self._groups(batch) == 1:
                frames = int(frame_lengths[:batch].max())  # the one host sync
                audio = self._frame_run(rows, text, frames, hidden, used_durations, lengths)
            else:
                audio, frames = self._grouped_frame_runs(batch, text, frame_lengths, hidden, used_durations, lengths)
            return {"audio": to_host(audio[:batch, : frames * self.hop].float(), self.pinned_output),
                    "audio_lengths": (frame_lengths[:batch] * self.hop).cpu(),
                    "durations": durations[:batch, :length].cpu(),
                    "used_durations": used_durations[:batch, :length].cpu()}
