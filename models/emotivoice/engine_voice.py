"""An EmotiVoice voice whose acoustic model and vocoder run on the bucketed engine
(models/emotivoice/engines.py): what `python -m serve model=emotivoice serve.device=cuda
serve.torch_engine=cuda_graphs|compile` serves. The front end and the style encoder with its prompt
cache stay the voice's own; the same TTSModel calls as the voice, the same outputs row for row
(the engine's buckets change no sample; tests/models/emotivoice/test_emotivoice_engine_voice.py).

    served, replays_graphs, text_buckets = bucketed_engine(voice, "compile", graphs=True,
                                                           package_dir=None, batch_buckets=(1, 8, 32))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.emotivoice.capabilities import CAPABILITIES, FAMILY_NAME
from models.emotivoice.engines import FRAME_BUCKET, TEXT_BUCKETS, BucketedEngine
from models.emotivoice.voice import EmotiVoiceVoice
from models.interface import SynthesisRequest, SynthesisResult
from models.sampling import Sampling
from models.voice_on_engine import VoiceOnEngine

# serve.torch_engine's stage backends (serve/engines.py maps cuda_graphs to "eager", replayed).
BACKENDS = ("eager", "compile")
SERVED_VOCODER_KERNELS = ("torch", "cudnn")  # not "triton": it cannot be compiled with symbolic sizes


@dataclass(frozen=True)
class ServedEngineOptions:
    """How the served engine splits a batch's frame stage: up to ``frame_groups`` length groups of at least
    ``min_group_rows`` rows (``python -m serve model=emotivoice +serve.engine_options.frame_groups=32``).

    The defaults give 4 groups at batch 64, 8 of 32 rows at 256 and one below 32. Side by side on an H100
    (compiled FP16 graphs): batch 64 in four groups 1,481 sentences/s against 1,287 in one run
    (docs/results/h100_35_emotivoice_groups4.json); batch 256 in eight groups of 32 rows 1,680 against 1,627
    in sixteen of 16 (h100_36_emotivoice_groups8_rows32.json). On the H200, groups of 8 rows lost to groups
    of 16 at batch 64 (1,537 against 1,664, h200_33_emotivoice_groups48.json), and batch 1,024 in 32 groups of
    32 rows made 2,013 (h200_39_emotivoice_b1024_groups32.json): the setting for batches that large."""

    frame_groups: int = 8
    min_group_rows: int = 16
    # serve.torch_engine=compile: one frame stage for every batch, text and frame bucket, compiled with symbolic
    # sizes (a few compiles, not one a shape: BucketedEngine's compile_dynamic); what lets large batches warm up
    compile_dynamic: bool = False
    # Frames a length group pads up to a multiple of. Smaller: less padding (at batch 1,024 in 32 groups,
    # 91 % of the frames computed are the rows' own at 32, 97 % at 8;
    # docs/results/cpu_41_emotivoice_frame_bucket_padding.json), more shapes to capture (cheap with
    # compile_dynamic, each a compile without it). With compile_dynamic, 8 ran batch 1,024 at 1,814 sentences/s
    # against 1,736 at 32 on an H100, same call (docs/results/h100_42_emotivoice_frame_buckets.json)
    frame_bucket: int = FRAME_BUCKET
    # After the server's warm-up batches, capture every (group rows, frame bucket) shape between those they
    # met (BucketedEngine.fill_frame_shapes), so none is first met under load. Off: on an H100 it took the
    # loaded level's 4-5 captures to none, but its throughput gain (1.05x on average, within the runs'
    # spread) costs 33-51 s more warm-up and 3.6 GiB more reserved a worker (docs/results/h100_49_*)
    fill_frame_shapes: bool = False
    # "cudnn": the vocoder's block convolutions with their bias, LeakyReLU, mask and residual in cuDNN's epilogue
    # (models/epilogue_hifigan.py; needs nvidia-cudnn-frontend on the GPU machine); "torch": the HiFi-GAN module.
    # "cudnn" builds cuDNN graphs for every new shape and times their plans once per kind: at batch 1,024 on an
    # H100 it ran 1.05x "torch" (1,905 against 1,817 sentences/s), but that batch's first run took 279 s
    # against 28 s, and a server meets hundreds of shapes (docs/benchmarks.md, session 48)
    vocoder_kernels: str = "torch"

    def __post_init__(self):
        for name in ("frame_groups", "min_group_rows", "frame_bucket"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"serve.engine_options.{name}={value!r}: use a whole number >= 1")
        for name in ("compile_dynamic", "fill_frame_shapes"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"serve.engine_options.{name}={getattr(self, name)!r}: use true or false")
        if self.vocoder_kernels not in SERVED_VOCODER_KERNELS:
            raise ValueError(f"serve.engine_options.vocoder_kernels={self.vocoder_kernels!r}: use one of "
                             f"{list(SERVED_VOCODER_KERNELS)}")


class EngineVoice(VoiceOnEngine):
    """``voice`` with its generator on ``engine``; the front end and the style encoder stay the voice's."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = Sampling

    def __init__(self, voice: EmotiVoiceVoice, engine: BucketedEngine, fill_frame_shapes: bool = False):
        super().__init__(voice, engine)
        self.speakers = voice.speakers  # the server's voice names (Family.speaker_names)
        self.fill_frame_shapes = fill_frame_shapes

    def complete_warm_up(self, max_batch: int) -> int:
        """Called by the server after its warm-up batches: with ``fill_frame_shapes``, the engine captures
        the frame shapes between those the batches met (BucketedEngine.fill_frame_shapes). Returns how many
        graphs it captured."""
        return self.engine.fill_frame_shapes(max_batch) if self.fill_frame_shapes else 0

    @property
    def length_groups(self) -> int:
        """The most length groups a batch's frame stage runs in: the server warms their frame buckets."""
        return self.engine.frame_groups

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        sampling = Sampling.of(request.sampling)
        out = self.engine.synthesize(*self.voice.generator_inputs(request, self.engine.device),
                                     length_scale=sampling.length_scale)
        return SynthesisResult(out["audio"], out["audio_lengths"], self.sample_rate_hz,
                               durations=out["used_durations"])


def bucketed_engine(voice: EmotiVoiceVoice, backend: str, graphs: bool, package_dir: str | None,
                    batch_buckets: tuple[int, ...] | None, options: ServedEngineOptions = ServedEngineOptions(),
                    ) -> tuple[EngineVoice, bool, tuple[int, ...]]:
    """The family's ``torch_engine`` hook (models/family.py): (``voice`` on a BucketedEngine, whether it
    replays CUDA graphs, its text buckets). ``compile``: each frame bucket's stage through torch.compile;
    ``options``: how a batch's frame stage splits into length groups."""
    if backend not in BACKENDS:
        raise ValueError(f"EmotiVoice's bucketed engine runs backend {list(BACKENDS)}, not {backend!r} "
                         "(it has no AOTInductor packages)")
    if options.fill_frame_shapes and backend == "compile" and not options.compile_dynamic:
        raise ValueError("serve.engine_options.fill_frame_shapes=true with serve.torch_engine=compile needs "
                         "compile_dynamic=true: with static shapes every filled shape would be a compile of its own")
    if options.compile_dynamic and backend != "compile":
        raise ValueError(f"serve.engine_options.compile_dynamic=true compiles the frame stage: it needs "
                         f"serve.torch_engine=compile, not the {backend!r} backend")
    engine = BucketedEngine(voice.generator, graphs=graphs, batch_buckets=batch_buckets or None,
                            compile_frames=backend == "compile", frame_groups=options.frame_groups,
                            min_group_rows=options.min_group_rows, frame_bucket=options.frame_bucket,
                            compile_dynamic=options.compile_dynamic, vocoder_kernels=options.vocoder_kernels)
    return EngineVoice(voice, engine, options.fill_frame_shapes), engine.graphs, TEXT_BUCKETS
