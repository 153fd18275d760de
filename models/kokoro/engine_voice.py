"""A Kokoro voice whose model runs on the bucketed engine (models/kokoro/engines.py): what
`python -m serve model=kokoro_ja serve.device=cuda serve.torch_engine=cuda_graphs` serves. The
front end and the style pack stay the voice's; the same TTSModel calls as the voice, the same
audio row for row, SineGen noise included (tests/models/kokoro/test_kokoro_engine_voice.py).

    served, replays_graphs, text_buckets = bucketed_engine(voice, "eager", graphs=True,
                                                           package_dir=None, batch_buckets=(1, 8, 32))

A request's sentences may differ in length: the engine runs each one's text stage at its own
length and the frame stage over the whole batch (``BucketedEngine.synthesize_rows``).
"""
from __future__ import annotations

import torch

from models.interface import SynthesisRequest, SynthesisResult
from models.kokoro.capabilities import CAPABILITIES, FAMILY_NAME
from models.kokoro.engines import TOKEN_BUCKET, BucketedEngine
from models.kokoro.sampling import KokoroSampling
from models.kokoro.voice import KokoroVoice
from models.voice_on_engine import VoiceOnEngine

# serve.torch_engine's stage backends (serve/engines.py maps cuda_graphs to "eager", replayed).
# Not "compile": the text stage runs at each sentence's exact length, and a server meets hundreds of
# lengths, each a compile of tens of seconds taken under load.
BACKENDS = ("eager",)
MAX_TOKENS = 512  # the text buckets the server's batcher and warm-up see: ids per sentence, pads included


class EngineVoice(VoiceOnEngine):
    """``voice`` with its model on ``engine``; the front end and the style pack stay the voice's."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = KokoroSampling

    def __init__(self, voice: KokoroVoice, engine: BucketedEngine, batch_buckets: tuple[int, ...] | None = None):
        super().__init__(voice, engine)
        self.batch_buckets = batch_buckets

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        self.capabilities.check(request.voice, self.family)
        sampling = KokoroSampling.of(request.sampling)
        lengths = request.phoneme_lengths  # (B,) with the two 0 pads
        rows = [request.phoneme_ids[row, : int(length)] for row, length in enumerate(lengths)]
        noise = sampling.source_noise(lengths, self.hop_length) if sampling.noise_scale != 0 else None
        out = self.engine.synthesize_rows(rows, self.voice.style_rows(lengths), 1.0 / sampling.length_scale, noise,
                                          self.batch_buckets)
        durations = torch.zeros(request.phoneme_ids.shape, dtype=torch.long)  # (B, T_text)
        width = min(durations.shape[1], out["frames_per_token"].shape[1])
        durations[:, :width] = out["frames_per_token"][:, :width]
        return SynthesisResult(out["audio"], out["audio_lengths"], self.sample_rate_hz, durations=durations)


def bucketed_engine(voice: KokoroVoice, backend: str, graphs: bool, package_dir: str | None,
                    batch_buckets: tuple[int, ...] | None,
                    precision: torch.dtype = torch.float32) -> tuple[EngineVoice, bool, tuple[int, ...]]:
    """The family's ``torch_engine`` hook (models/family.py): (``voice`` on a BucketedEngine, whether it
    replays CUDA graphs, the token buckets its frame stage pads to). ``precision`` float16/bfloat16 (the
    server's fp16/bf16 sources): the frame stage in half precision with its float32 islands, the text
    stage in float32, as docs/benchmarks.md measured it on the real voice (FP16: DNSMOS 3.773 against
    3.776, MCD 0.22 dB), and in FP16 the AdaIN statistics in float32 rather than the model's float64 (the
    real voice with the FP16 frame stage: MCD 0.226 against 0.224 dB, DNSMOS 3.829 against 3.826;
    faster on the H200, docs/results/h200_33_kokoro_*.json); the voice's own model stays float32."""
    if backend not in BACKENDS:
        raise ValueError(f"Kokoro's bucketed engine runs backend {list(BACKENDS)} (serve.torch_engine=cuda_graphs "
                         f"on a GPU, eager buckets elsewhere), not {backend!r}: its text stage meets every sentence "
                         "length, each a compile under load")
    # FP16 only, the precision whose float32 statistics were scored; FP32 stays row for row the voice's.
    statistics = torch.float32 if precision == torch.float16 else torch.float64
    engine = BucketedEngine(voice.model, graphs=graphs, frame_dtype=precision, statistics_dtype=statistics)
    text_buckets = tuple(range(TOKEN_BUCKET, MAX_TOKENS + 1, TOKEN_BUCKET))
    return EngineVoice(voice, engine, batch_buckets or None), engine.graphs, text_buckets
