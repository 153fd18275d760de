r"""Where a Piper bucketed engine's batch goes on the GPU: the text stage (encoder, duration predictor)
and the acoustic stage (flow, decoder) as timed on the device, and the rest of a synthesis call (noise,
padding, copies to and from the device, the one host sync) as wall time minus both.

Why: in the Lite student only the acoustic stage is the student's own; the text stage is the
teacher's. Which part a faster student engine must shrink is a measurement, not a guess.

    # GPU machine, after `bash scripts/device_deps.sh --install && export PYTHONPATH=/tmp/site:.`
    python3 scripts/profile_piper_engine_stages.py --bundle .device/engines_bundle \
        --inputs .device/bench_inputs.json --student models/checkpoints/lite_gan_joe_medium.safetensors \
        --variants lite_fp16 teacher --cudnn-benchmark --out $OUT/stages.json

Each variant is built as evaluate.gpu_engines builds it (``--backend``, ``--conv-layout``), run once
over every batch to compile and capture, then ``--repeats`` times; per batch the figures are medians
over the repeats, and the JSON sums them over the batches. Two changes to the variant, each to see
what a part is worth: ``--conv-layout-parts decoder flow`` converts only those parts' convolutions
(the whole model by default), and ``--duration-student PATH`` swaps the stochastic duration predictor
for a distilled NoiseAffineDurationPredictor (models/piper/duration_student.py; kept FP32 as the
predictor it replaces). The student's durations differ from the teacher's, so with it the batches'
frame counts, and hence the acoustic stage's work, differ a little too.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.revision import provenance
from evaluate.gpu_benchmark import sequences_from_inputs
from evaluate.rtf import length_sorted_batches
from models.conv_layout import CONV_LAYOUTS, convert_convs
from models.cuda_graphs import StageTimer
from models.interface import SynthesisRequest
from models.piper import gpu_bundle
from models.piper.duration_student import load_duration_student
from models.piper.vits import PiperVits
from models.registry import get_family


def profile_variant(engine, batches: list[SynthesisRequest], repeats: int) -> dict:
    timer = StageTimer(engine)
    for request in batches:  # compile and capture every shape
        engine.synthesize(request)
    timer.take_ms()
    per_batch = []
    for request in batches:
        walls, stages = [], []
        for _ in range(repeats):
            torch.cuda.synchronize()
            started = time.perf_counter()
            engine.synthesize(request)  # returns after the read-back to the host
            walls.append((time.perf_counter() - started) * 1e3)
            stages.append(timer.take_ms())
        text = statistics.median(s.get("text", 0.0) for s in stages)
        acoustic = statistics.median(s.get("acoustic", 0.0) for s in stages)
        wall = statistics.median(walls)
        per_batch.append({"utterances": int(request.phoneme_ids.shape[0]), "wall_ms": wall, "text_ms": text,
                          "acoustic_ms": acoustic, "host_and_copies_ms": max(wall - text - acoustic, 0.0)})
    totals = {key: sum(row[key] for row in per_batch) for key in ("wall_ms", "text_ms", "acoustic_ms",
                                                                  "host_and_copies_ms")}
    shares = {key.replace("_ms", "_share"): value / totals["wall_ms"] for key, value in totals.items()
              if key != "wall_ms"}
    return {"totals": totals, "shares": shares, "batches": per_batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--student", nargs="+", default=[], help="students' safetensors (gpu_bundle.engine_variants)")
    parser.add_argument("--variants", nargs="+", default=["lite_fp16"])
    # The stages are timed as CUDA-graph replays: the backends a bucketed engine captures.
    parser.add_argument("--backend", default="compile", choices=("compile", "cuda_graphs"))
    parser.add_argument("--conv-layout", default=None, choices=CONV_LAYOUTS,
                        help="convert the convolutions to this layout (models/conv_layout.py); default: as built")
    parser.add_argument("--conv-layout-parts", nargs="+", default=None, choices=sorted(PiperVits.PART_ATTRIBUTES),
                        help="parts whose convolutions --conv-layout converts (e.g. decoder flow); default: all")
    parser.add_argument("--duration-student", default=None,
                        help="a NoiseAffineDurationPredictor's safetensors in place of the duration predictor")
    parser.add_argument("--cudnn-benchmark", action="store_true")
    parser.add_argument("--utterances", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.conv_layout_parts and args.conv_layout is None:
        parser.error("--conv-layout-parts needs --conv-layout")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # as evaluate.gpu_engines
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch._dynamo.config.recompile_limit = 64  # as evaluate.gpu_engines: variants share the stages' code objects
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # an error, not a silent fall-back to eager

    bundle = json.loads((Path(args.bundle) / "bundle.json").read_text(encoding="utf-8"))
    family = get_family(bundle["family"])
    if family.name != "piper":
        parser.error(f"--bundle is of family {family.name!r}: this script times Piper's bucketed engine")
    inputs = json.loads(Path(args.inputs).read_text(encoding="utf-8"))
    sequences = sequences_from_inputs(inputs["utterances"][: args.utterances])
    batches = length_sorted_batches(sequences, args.batch, family.sampling(seed=inputs["seed"]))
    models = gpu_bundle.engine_variants(Path(args.bundle), tuple(map(Path, args.student)))
    unknown = [name for name in args.variants if name not in models]
    if unknown:
        parser.error(f"--variants {unknown}: available {sorted(models)} (the lite ones need their students in --student)")
    report = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__},
              "settings": {key: value for key, value in vars(args).items() if key != "out"}, "variants": {},
              "provenance": provenance(REPO_ROOT, sys.argv)}
    for name in args.variants:
        model = copy.deepcopy(models[name]())  # the teacher variant is the bundle's own object
        if args.duration_student is not None:
            model.replace_part("duration", load_duration_student(model.hp, Path(args.duration_student)))
        if args.conv_layout is not None:
            for role in args.conv_layout_parts or (None,):
                convert_convs(model if role is None else getattr(model, model.PART_ATTRIBUTES[role]), args.conv_layout)
        engine = gpu_bundle.build_engine(model.to("cuda"), args.backend, bundle["sample_rate_hz"], Path("/tmp/aoti") / name)
        if hasattr(engine, "use_graphs"):
            engine.use_graphs(True)
        report["variants"][name] = profile_variant(engine, batches, args.repeats)
        print(name, json.dumps({**report["variants"][name]["totals"], **report["variants"][name]["shares"]}), flush=True)
        write_text_atomic(Path(args.out), json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
