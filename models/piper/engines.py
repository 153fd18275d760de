r"""PyTorch engines for a Piper/VITS variant on CUDA: eager, CUDA graphs over static shape buckets,
torch.compile and AOTInductor. Torch only, so the GPU machine and the server can import it.

    from models.piper.engines import BucketedEngine, EagerEngine, StageBackend
    engine = BucketedEngine(model, 22050, backend=StageBackend("aoti", package_dir="pt2/"))
    result = engine.synthesize(SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(seed=0)))

Why buckets: Piper's frame count depends on the predicted durations, so one utterance's shapes
are known only halfway through. The bucketed engine splits synthesis at that point into two
static-shape stages, each run once per bucket (and captured as a CUDA graph: one launch replays
hundreds of kernels):

    text stage     (B, T_text_bucket):                encoder + duration predictor -> durations, prior
    acoustic stage (B, T_text_bucket, T_frame_bucket): alignment, prior sample, flow, decoder -> audio

with one device-to-host read of the frame count between them. Padding frames are masked zeros
in the flow; the decoder sees its own bias past the end, which moves the last few samples
slightly (the benchmark reports the SNR of each engine against eager).

A ``StageBackend`` says what runs each stage:

* ``eager``: the stage modules as they are;
* ``compile``: ``torch.compile`` with dynamic shapes (one compile per stage, not per bucket;
  batch 1 is specialised by the compiler and compiles once more);
* ``aoti``: ``torch.export`` with dynamic batch, text and frame axes, compiled ahead of time by
  AOTInductor into one ``.pt2`` package per stage and loaded back with ``aoti_load_package``
  (what a server would ship instead of Python model code).

Noise is drawn on the engine's device (models.interface.VitsSampling.draw): host-side draws of
the prior noise cost more than a graph replay.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from models.interface import SynthesisRequest, SynthesisResult
from models.piper.capabilities import CAPABILITIES, FAMILY_NAME
from models.piper.vits import PiperVits, durations_to_alignment, sequence_mask
from models.sampling import VitsSampling
from models.voice_on_engine import VoiceOnEngine

TEXT_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512)  # phonemes; a batch pads to the next one
FRAME_BUCKET = 64  # frames round up to a multiple of this (0.74 s of audio at hop 256)
BACKENDS = ("eager", "compile", "aoti")


def text_bucket(length: int) -> int:
    for size in TEXT_BUCKETS:
        if length <= size:
            return size
    raise ValueError(f"{length} phonemes: longer than the largest text bucket {TEXT_BUCKETS[-1]}; "
                     "split the text into sentences first")


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``, without waiting for the device's queued work.

    A copy from pageable host memory waits for everything queued on the stream first: the other
    batch's graph replays, when a server prepares one batch while the GPU runs another. A pinned
    copy is queued like a kernel instead."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def scales_tensor(noise: VitsSampling, device: torch.device) -> torch.Tensor:
    """(3,) float32 [noise_scale, length_scale, noise_scale_w]: an input of both stages, so one
    captured graph or compiled package serves every speed and noise setting."""
    return host_to_device(torch.tensor([noise.noise_scale, noise.length_scale, noise.noise_scale_w]), device)


class TextStage(nn.Module):
    """Encoder + duration predictor: (ids, lengths, noise, scales) -> durations, prior."""

    def __init__(self, model: PiperVits):
        super().__init__()
        self.model = model
        self.encoder = model.parts()["encoder"]

    def forward(self, phoneme_ids: torch.Tensor, phoneme_lengths: torch.Tensor, duration_noise: torch.Tensor,
                scales: torch.Tensor):
        hidden, prior_mean, prior_log_std, text_mask = self.encoder(phoneme_ids, phoneme_lengths)
        durations = self.model.predict_durations(hidden, text_mask, duration_noise * scales[2],
                                                 scales[1])  # (B, T_text)
        return durations, prior_mean, prior_log_std  # (B, T_text), (B, C_lat, T_text) x 2


class AcousticStage(nn.Module):
    """Alignment, prior sample, flow and decoder for a known frame bucket -> audio (B, F * hop)."""

    def __init__(self, model: PiperVits):
        super().__init__()
        parts = model.parts()
        self.flow, self.decoder = parts["flow"], parts["decoder"]

    def forward(self, durations, prior_mean, prior_log_std, frame_lengths, prior_noise, scales):
        frame_mask = sequence_mask(frame_lengths, prior_noise.shape[-1]).to(prior_mean.dtype)  # (B, F)
        alignment = durations_to_alignment(durations, frame_mask)  # (B, T_text, F)
        z = prior_mean @ alignment + prior_noise * torch.exp(prior_log_std @ alignment) * scales[0]
        mask = frame_mask.unsqueeze(1)  # (B, 1, F)
        z = self.flow.reverse(z, mask) * mask  # (B, C_lat, F)
        return self.decoder(z)[:, 0]  # (B, F * hop)


@dataclass(frozen=True)
class StageBackend:
    """What runs the two stages: ``kind`` in BACKENDS; ``compile_mode`` for torch.compile;
    ``package_dir`` where AOTInductor writes its packages."""

    kind: str = "eager"
    compile_mode: str = "default"
    package_dir: str | None = None

    def __post_init__(self):
        if self.kind not in BACKENDS:
            raise ValueError(f"unknown stage backend {self.kind!r}; choose from {BACKENDS}")
        if self.kind == "aoti" and not self.package_dir:
            raise ValueError("the aoti backend needs package_dir, the folder its .pt2 packages go to")


def _example_inputs(model: PiperVits, device: torch.device, batch: int = 2, text: int = 64, frames: int = 128):
    """Inputs of the two stages at one shape, for torch.export (batch 2: 1 would be specialised)."""
    hp = model.hp
    phoneme_ids = torch.randint(1, hp.num_symbols, (batch, text), device=device)
    phoneme_lengths = torch.full((batch,), text, dtype=torch.long, device=device)
    duration_noise = torch.randn(batch, 2, text, device=device)
    durations = torch.full((batch, text), frames // text, dtype=torch.float32, device=device)
    prior = torch.randn(batch, hp.latent_channels, text, device=device)
    frame_lengths = torch.full((batch,), frames, dtype=torch.long, device=device)
    prior_noise = torch.randn(batch, hp.latent_channels, frames, device=device)
    scales = scales_tensor(VitsSampling(), device)
    return ((phoneme_ids, phoneme_lengths, duration_noise, scales),
            (durations, prior, prior.clone(), frame_lengths, prior_noise, scales))


def aoti_package_stages(text_stage: TextStage, acoustic_stage: AcousticStage, package_dir: str | Path):
    """Export both stages with dynamic axes and compile each into an AOTInductor package.

    Returns (text runner, acoustic runner, seconds spent exporting and compiling).
    """
    from torch.export import Dim, export

    device = next(text_stage.parameters()).device
    started = time.perf_counter()
    package_dir = Path(package_dir)
    package_dir.mkdir(parents=True, exist_ok=True)
    # Dim.AUTO, not named ranges: torch 2.11 cannot prove the contiguity guard
    # Min(T, 96 T) == T over a named range and refuses the export; AUTO keeps the axes dynamic
    # (the exported program's range constraints say so) and leaves such checks to run time.
    batch = text = frames = Dim.AUTO
    text_inputs, acoustic_inputs = _example_inputs(text_stage.model, device)
    text_shapes = ({0: batch, 1: text}, {0: batch}, {0: batch, 2: text}, None)
    acoustic_shapes = ({0: batch, 1: text}, {0: batch, 2: text}, {0: batch, 2: text}, {0: batch},
                       {0: batch, 2: frames}, None)
    runners = []
    for name, stage, inputs, shapes in (("text_stage", text_stage, text_inputs, text_shapes),
                                        ("acoustic_stage", acoustic_stage, acoustic_inputs, acoustic_shapes)):
        with torch.inference_mode(False), torch.no_grad():
            program = export(stage, inputs, dynamic_shapes=shapes)
            path = torch._inductor.aoti_compile_and_package(program, package_path=str(package_dir / f"{name}.pt2"))
        runners.append(torch._inductor.aoti_load_package(path))
    return runners[0], runners[1], time.perf_counter() - started


def _single_output(outputs):
    """An AOTInductor runner returns a one-output program's result as a list or as the tensor."""
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


class EagerEngine:
    """The model's own forward; outputs copied to the host (as a server would send them)."""

    def __init__(self, model: PiperVits, sample_rate_hz: int):
        self.model, self.sample_rate_hz = model, sample_rate_hz
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        noise = VitsSampling.of(request.sampling)
        batch, length = request.phoneme_ids.shape
        duration_noise, prior_noise = noise.draw(batch, length, self.model.hp.latent_channels, self.device)
        audio, audio_lengths, durations = self.model(
            request.phoneme_ids.to(self.device), request.phoneme_lengths.to(self.device),
            duration_noise, prior_noise, noise.noise_scale, noise.length_scale, noise.noise_scale_w)
        return SynthesisResult(audio.float().cpu(), audio_lengths.cpu(), self.sample_rate_hz, durations=durations.cpu())


class BucketedEngine:
    """Two static-shape stages per bucket (see the module docstring); CUDA graphs when ``graphs``.

    Each request brings its own noise scales, seed or noise tensors. ``compile_s`` is the time the backend
    spent before the first synthesis (AOTInductor export + compile); torch.compile compiles on
    first use, inside the first synthesis of each new batch size.
    """

    def __init__(self, model: PiperVits, sample_rate_hz: int, graphs: bool = True,
                 backend: StageBackend = StageBackend(), batch_buckets: tuple[int, ...] | None = None):
        self.model, self.sample_rate_hz, self.graphs, self.backend = model, sample_rate_hz, graphs, backend
        # A server sees every batch size up to its maximum: padding the batch to a few sizes keeps
        # the captured graphs to (batch bucket x text bucket x frame bucket). None: exact sizes.
        self.batch_buckets = batch_buckets
        self.device = next(model.parameters()).device
        self.hop = model.hp.hop_length
        text_stage, acoustic_stage = TextStage(model).eval(), AcousticStage(model).eval()
        self.compile_s = 0.0
        if backend.kind == "compile":
            self.text_stage_fn = torch.compile(text_stage, mode=backend.compile_mode, dynamic=True)
            self.acoustic_stage_fn = torch.compile(acoustic_stage, mode=backend.compile_mode, dynamic=True)
        elif backend.kind == "aoti":
            text_runner, acoustic_runner, self.compile_s = aoti_package_stages(
                text_stage, acoustic_stage, backend.package_dir)
            self.text_stage_fn = lambda *inputs: tuple(text_runner(*inputs))
            self.acoustic_stage_fn = lambda *inputs: _single_output(acoustic_runner(*inputs))
        else:
            self.text_stage_fn, self.acoustic_stage_fn = text_stage, acoustic_stage
        self.captured: dict[tuple, tuple] = {}  # shape key -> (graph, static inputs, static outputs)
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        # The stages' static buffers are shared by every caller: one batch at a time runs from the
        # text stage to the read-back. Host-side preparation (noise, padding) stays outside, so a
        # second thread prepares its batch while the device runs this one (serve.batches_in_flight).
        self.device_lock = threading.Lock()

    def use_graphs(self, graphs: bool) -> None:
        """Switch CUDA-graph replay on or off (the same compiled stages either way)."""
        self.graphs = graphs
        if graphs and self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()

    def _run(self, key: tuple, fn, inputs: tuple[torch.Tensor, ...]):
        if not self.graphs:
            return fn(*inputs)
        if key not in self.captured:
            self.captured[key] = self._capture(fn, inputs)
        graph, static_inputs, static_outputs = self.captured[key]
        for static, value in zip(static_inputs, inputs):
            static.copy_(value)
        graph.replay()
        return static_outputs

    def _capture(self, fn, inputs: tuple[torch.Tensor, ...]) -> tuple:
        """One stage at one shape as a CUDA graph: (graph, static inputs, static outputs).

        Every graph allocates from one shared pool, and only its temporaries stay there: the stage's
        outputs are copied into buffers allocated outside the pool. So the pool is as large as the
        largest capture's activations (23.6 GiB for 32 sentences of 512 ids at pace 1.25 on the H200,
        2026-11-30; serve.max_batch_phonemes bounds it), every later capture reuses those blocks,
        and no capture can reuse memory an earlier graph's outputs are still read from. Replays
        never overlap: callers hold ``device_lock``."""
        static_inputs = tuple(t.clone() for t in inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (cuDNN picks its kernels, compilers compile)
                sample = fn(*static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        single = isinstance(sample, torch.Tensor)
        static_outputs = tuple(torch.empty_like(t) for t in ((sample,) if single else sample))
        del sample
        graph = torch.cuda.CUDAGraph()
        # thread_local: a thread preparing the next batch may allocate while this one captures.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            outputs = fn(*static_inputs)
            for static, value in zip(static_outputs, (outputs,) if single else outputs):
                static.copy_(value)
            del outputs
        # The uncaptured runs above left their activations in the allocator's cache (gigabytes for
        # a full batch of long sentences); captures are rare, so hand them back now.
        torch.cuda.empty_cache()
        return graph, static_inputs, static_outputs[0] if single else static_outputs

    def _batch_bucket(self, batch: int) -> int:
        if self.batch_buckets is None:
            return batch
        for size in self.batch_buckets:
            if batch <= size:
                return size
        raise ValueError(f"batch of {batch}: larger than the largest batch bucket {self.batch_buckets[-1]}")

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        if request.voice is not None and request.voice.given():
            raise ValueError(f"the bucketed engine runs single-speaker voices: no {list(request.voice.given())}")
        batch, length = request.phoneme_ids.shape
        bucket, rows = text_bucket(length), self._batch_bucket(batch)
        duration_noise, prior_noise = VitsSampling.of(request.sampling).draw(batch, length, self.model.hp.latent_channels, self.device)
        # Rows past ``batch`` are one-phoneme fillers: cheap, and never read back.
        phoneme_ids = torch.zeros(rows, bucket, dtype=torch.long)  # (B_bucket, T_bucket)
        phoneme_ids[:batch, :length] = request.phoneme_ids
        phoneme_lengths = torch.ones(rows, dtype=torch.long)
        phoneme_lengths[:batch] = request.phoneme_lengths
        phoneme_ids = host_to_device(phoneme_ids, self.device)  # queued: the other batch may be on the GPU
        phoneme_lengths = host_to_device(phoneme_lengths, self.device)
        padded_duration_noise = torch.zeros(rows, 2, bucket, device=self.device)
        padded_duration_noise[:batch, :, :length] = duration_noise
        scales = scales_tensor(VitsSampling.of(request.sampling), self.device)
        with self.device_lock:
            return self._synthesize_prepared(batch, length, rows, bucket, phoneme_ids, phoneme_lengths,
                                             padded_duration_noise, prior_noise, scales)

    def _synthesize_prepared(self, batch: int, length: int, rows: int, bucket: int, phoneme_ids, phoneme_lengths,
                             padded_duration_noise, prior_noise, scales) -> SynthesisResult:
        """Both stages and the read-back of one prepared batch (under ``device_lock``)."""
        durations, prior_mean, prior_log_std = self._run(
            ("text", rows, bucket), self.text_stage_fn, (phoneme_ids, phoneme_lengths, padded_duration_noise, scales))
        frame_lengths = durations.sum(dim=1).clamp_min(1).long()  # (B_bucket,)
        frames = int(frame_lengths[:batch].max())  # the one host sync
        if frames > prior_noise.shape[-1]:
            raise ValueError(f"the utterance needs {frames} frames but the prior noise covers "
                             f"{prior_noise.shape[-1]}: raise VitsSampling.max_frames_per_phoneme_id")
        frame_bucket = math.ceil(frames / FRAME_BUCKET) * FRAME_BUCKET
        noise = torch.zeros(rows, prior_noise.shape[1], frame_bucket, device=self.device)  # (B_bucket, C_lat, F_bucket)
        noise[:batch, :, :frames] = prior_noise[:, :, :frames]
        frame_lengths = frame_lengths.clamp_max(frame_bucket)  # fillers may not outgrow the bucket
        audio = self._run(("acoustic", rows, bucket, frame_bucket), self.acoustic_stage_fn,
                          (durations, prior_mean, prior_log_std, frame_lengths, noise, scales))
        audio_lengths = frame_lengths[:batch] * self.hop
        return SynthesisResult(audio[:batch, : frames * self.hop].float().cpu(), audio_lengths.cpu(),
                               self.sample_rate_hz, durations=durations[:batch, :length].long().cpu())


class EngineVoice(VoiceOnEngine):
    """A Piper voice (frontend, sample rate) whose synthesis runs on a BucketedEngine: what
    ``python -m serve serve.torch_engine=cuda_graphs|compile|aoti`` serves. Same TTSModel calls as the voice."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = VitsSampling

    def __init__(self, voice, engine: BucketedEngine):
        super().__init__(voice, engine)
        self.latent_channels = voice.latent_channels

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        return self.engine.synthesize(request)


def bucketed_engine(voice, backend: str, graphs: bool, package_dir: str | None,
                    batch_buckets: tuple[int, ...]) -> tuple[EngineVoice, bool, tuple[int, ...]]:
    """(``voice`` on a BucketedEngine, whether it replays CUDA graphs, its text buckets): the
    family's ``torch_engine`` hook (models/family.py) that the server calls."""
    engine = BucketedEngine(voice.model, voice.sample_rate_hz, graphs=graphs,
                            backend=StageBackend(backend, package_dir=package_dir), batch_buckets=batch_buckets)
    return EngineVoice(voice, engine), engine.graphs, tuple(TEXT_BUCKETS)
