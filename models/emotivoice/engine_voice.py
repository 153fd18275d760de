"""An EmotiVoice voice whose acoustic model and vocoder run on the bucketed engine
(models/emotivoice/engines.py): what `python -m serve model=emotivoice serve.device=cuda
serve.torch_engine=cuda_graphs|compile` serves. The front end and the style encoder with its prompt
cache stay the voice's own; the same TTSModel calls as the voice, the same outputs row for row
(the engine's buckets change no sample; tests/models/emotivoice/test_emotivoice_engine_voice.py).

    served, replays_graphs, text_buckets = bucketed_engine(voice, "compile", graphs=True,
                                                           package_dir=None, batch_buckets=(1, 8, 32))
"""
from __future__ import annotations

import torch

from models.emotivoice.capabilities import CAPABILITIES, FAMILY_NAME
from models.emotivoice.engines import TEXT_BUCKETS, BucketedEngine
from models.emotivoice.voice import EmotiVoiceVoice
from models.interface import SynthesisRequest, SynthesisResult
from models.sampling import Sampling
from models.voice_on_engine import VoiceOnEngine

# serve.torch_engine's stage backends (serve/engines.py maps cuda_graphs to "eager", replayed).
BACKENDS = ("eager", "compile")
# The served engine runs a batch's frame stage in up to 8 length groups of at least 16 rows (4 at
# batch 64, 8 of 32 rows at 256, one below 32). Side by side on an H100 (compiled FP16 graphs):
# batch 64 in four groups 1,481 sentences/s against 1,287 in one run (docs/results/h100_35_emotivoice_
# groups4.json); batch 256 in eight groups of 32 rows 1,680 against 1,627 in sixteen of 16
# (h100_36_emotivoice_groups8_rows32.json). On the H200, groups of 8 rows lost to groups of 16 at
# batch 64 (1,537 against 1,664, h200_33_emotivoice_groups48.json). Two groups at batch 32 are untimed.
SERVED_FRAME_GROUPS, SERVED_MIN_GROUP_ROWS = 8, 16


class EngineVoice(VoiceOnEngine):
    """``voice`` with its generator on ``engine``; the front end and the style encoder stay the voice's."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = Sampling

    def __init__(self, voice: EmotiVoiceVoice, engine: BucketedEngine):
        super().__init__(voice, engine)
        self.speakers = voice.speakers  # the server's voice names (Family.speaker_names)

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        sampling = Sampling.of(request.sampling)
        out = self.engine.synthesize(*self.voice.generator_inputs(request, self.engine.device),
                                     length_scale=sampling.length_scale)
        return SynthesisResult(out["audio"], out["audio_lengths"], self.sample_rate_hz,
                               durations=out["used_durations"])


def bucketed_engine(voice: EmotiVoiceVoice, backend: str, graphs: bool, package_dir: str | None,
                    batch_buckets: tuple[int, ...] | None) -> tuple[EngineVoice, bool, tuple[int, ...]]:
    """The family's ``torch_engine`` hook (models/family.py): (``voice`` on a BucketedEngine, whether it
    replays CUDA graphs, its text buckets). ``compile``: each frame bucket's stage through torch.compile."""
    if backend not in BACKENDS:
        raise ValueError(f"EmotiVoice's bucketed engine runs backend {list(BACKENDS)}, not {backend!r} "
                         "(it has no AOTInductor packages)")
    engine = BucketedEngine(voice.generator, graphs=graphs, batch_buckets=batch_buckets or None,
                            compile_frames=backend == "compile", frame_groups=SERVED_FRAME_GROUPS,
                            min_group_rows=SERVED_MIN_GROUP_ROWS)
    return EngineVoice(voice, engine), engine.graphs, TEXT_BUCKETS
