"""Which frame-stage shapes batches of mixed sentences meet first after a warm-up, with and without the
engine filling the shapes between those the warm-up met (BucketedEngine.fill_frame_shapes).

    python scripts/emotivoice_frame_shape_fill.py --out docs/results/cpu_45_emotivoice_frame_shape_fill.json

EmotiVoice's tiny model (random weights) on the CPU, its served engine with batch buckets and length
groups, and a graph cache that records each key and runs the stage eagerly (RecordingCache): the keys
are the engine's own, so a key first met after the warm-up is a CUDA graph a GPU server would capture
under load, its batch waiting. A few warm-up batches of long sentences, then the fill (or not), then
batches of random sizes and lengths, the same in both arms.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit  # noqa: E402
from models.cuda_graphs import as_tuple  # noqa: E402
from models.emotivoice.engine_voice import EngineVoice, ServedEngineOptions, bucketed_engine  # noqa: E402
from models.emotivoice.tiny import tiny_voice  # noqa: E402
from models.emotivoice.voice import EmotiVoiceVoice  # noqa: E402
from models.interface import SynthesisRequest  # noqa: E402

WORDS = "the train leaves at nine and we will all be there before the doors close again".split()
BATCH_BUCKETS = (1, 2, 4, 8, 16)
WARMUP_ROWS = (16, 4, 1)


class RecordingCache:
    """GraphCache's bookkeeping without a GPU: each stage runs eagerly, and every key met is kept with
    whether it ran in inference mode (a graph captured outside it would keep autograd state alive)."""

    def __init__(self):
        self.captured: dict[tuple, bool] = {}

    def run(self, key: tuple, stage: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        self.captured.setdefault(key, torch.is_inference_mode_enabled())
        return as_tuple(stage(*inputs))


def recorded_engine_voice(voice: EmotiVoiceVoice, fill: bool) -> EngineVoice:
    """The served engine with length groups and a frame bucket of 8, its graph cache a RecordingCache."""
    served, _, _ = bucketed_engine(voice, "eager", False, None, BATCH_BUCKETS,
                                   options=ServedEngineOptions(frame_groups=4, min_group_rows=2, frame_bucket=8,
                                                               fill_frame_shapes=fill))
    served.engine.graphs, served.engine.cache = True, RecordingCache()  # keys recorded, stages run eagerly
    return served


def batch_request(voice: EmotiVoiceVoice, rng: random.Random, rows: int, most_words: int) -> SynthesisRequest:
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(1, most_words))) + "." for _ in range(rows)]
    return SynthesisRequest.from_utterances([voice.text_to_utterances(sentence)[0] for sentence in sentences])


def shapes_met_first(voice: EmotiVoiceVoice, fill: bool, batches: int = 12, seed: int = 0) -> dict:
    """The warm-up, the fill if asked, then ``batches`` mixed batches: the frame keys they met first,
    those inside the warmed range (a text bucket the warm-up ran at, a frame bucket no longer than its
    longest there), how many shapes the fill captured, and the engine itself (its cache holds every key)."""
    served = recorded_engine_voice(voice, fill)
    for rows in WARMUP_ROWS:  # long sentences, so the warmed range covers what follows
        served.synthesize(batch_request(voice, random.Random(rows), rows, len(WORDS)))
    filled = served.complete_warm_up(max(BATCH_BUCKETS))
    warmed, longest = served.engine.captured_frame_shapes(), served.engine.longest_frame_buckets()
    rng = random.Random(seed)
    for _ in range(batches):
        served.synthesize(batch_request(voice, rng, rng.choice(range(1, max(BATCH_BUCKETS) + 1)), len(WORDS) // 2))
    met_first = served.engine.captured_frame_shapes() - warmed  # (rows, text bucket, frame bucket)
    inside = {shape for shape in met_first if shape[1] in longest and shape[2] <= longest[shape[1]]}
    return {"fill": fill, "filled": filled, "warmed_shapes": len(warmed), "longest_frame_bucket_by_text": longest,
            "met_first": sorted(met_first), "met_first_inside_warmed_range": sorted(inside), "engine": served}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=12, help="mixed batches after the warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, REPO, args.out, args.allow_dirty)
    voice = tiny_voice(0)
    arms = []
    for fill in (False, True):
        arm = shapes_met_first(voice, fill, args.batches, args.seed)
        arm.pop("engine")
        arm["met_first"], arm["met_first_inside_warmed_range"] = (
            [list(shape) for shape in arm[name]] for name in ("met_first", "met_first_inside_warmed_range"))
        arms.append(arm)
    report = {"tool": "scripts/emotivoice_frame_shape_fill.py", "argv": sys.argv[1:] if argv is None else argv,
              "provenance": origin, "torch": torch.__version__,
              "model": "EmotiVoice's tiny model (random weights), eager stages on the CPU, keys recorded",
              "batch_buckets": BATCH_BUCKETS, "warmup_rows": WARMUP_ROWS,
              "shape": "(rows, text bucket, frame bucket)", "arms": arms}
    print_and_save_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
