r"""A family's variants on CUDA engines, side by side in one call: for each (variant, backend) of
the family's plan (``family.gpu_engines``: eager, CUDA graphs over static shape buckets,
torch.compile, AOTInductor, ...), the speed and the compile time, with the speed-up over the
eager FP32 teacher. The variants are rebuilt on the GPU machine from a bundle (hyperparameters and
teacher weights, plus a distilled student's weights where the family has one).

    # here: phoneme ids (python -m evaluate.gpu_benchmark prepare ...) and the bundle
    #       (python -m compress.distil prepare --family <family> ... --out .device/distil)
    # on the GPU machine:
    python -m evaluate.gpu_engines --bundle .device/distil --inputs .device/bench_inputs.json \
        --student models/checkpoints/lite_joe_medium.safetensors --utterances 100 --deadline-s 540 \
        --package-dir /tmp/aoti --out $OUT/engines.json

Each (variant, backend) builds one engine and is measured once per graph mode the family gives
that backend: the backend alone (``compile``) and replayed through CUDA graphs
(``compile_cuda_graphs``). Every engine draws the same noise on the GPU, so outputs compare with
the variant's eager run (durations equal, SNR). Past ``--deadline-s`` no new engine starts; the
JSON is rewritten after each engine, so a stopped call keeps what it measured.

Speed is measured in ``--rounds`` rounds: the first right after each engine's build, the others
once every engine is built, visiting the engines in an order that rotates each round, so a drift
of the machine falls on every engine alike. Each speed figure is the median over rounds and
``<figure>_spread`` the range (max - min) of its rounds; a difference between two engines smaller
than their spreads is not established. The engines stay resident for the later rounds, so a row's
VRAM peaks include the engines built before it: per-variant VRAM comes from
``python -m evaluate.gpu_benchmark`` (evaluate/gpu_results.py merges the two).

A pair in ``--only`` may name a convolution layout (models/conv_layout.py) after ``@``, e.g.
``lite_fp16/compile@channels_last``: that engine is built from the variant with every 1-D
convolution run as its channels-last 2-D twin, and its rows are keyed
``<variant>@<layout>/<backend>``, beside the variant's own layout in the same call (``@ncw`` is the
converted module in the NCW layout, the A side of an A/B: not the same as naming no layout). Its SNR
is taken against the variant's own eager run when the call has that run: the selected pairs run in the
plan's order, which puts eager first. ``--cudnn-benchmark`` lets cuDNN time its convolution
algorithms per shape for every engine of the call; each row records whether it was on.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import time
from pathlib import Path

import torch

from core.atomic_io import write_text_atomic
from core.file_digest import file_sha256
from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, publication_or_exit
from evaluate.gpu_benchmark import save_audio, sequences_from_inputs
from evaluate.gpu_results import CALL_STUDENTS_KEY
from evaluate.rtf import length_sorted_batches, measure_batch1, measure_batched
from models.conv_layout import CONV_LAYOUTS, converted_copy
from models.interface import SynthesisRequest, SynthesisResult
from models.registry import get_family

MIB = 1024 * 1024
NATIVE_LAYOUT = None  # a variant's convolutions as its model builds them, unconverted



def _snr_db(reference: list[SynthesisResult], candidate: list[SynthesisResult]) -> float:
    signal = error = 0.0
    for ref, cand in zip(reference, candidate):
        n = int(min(ref.audio_lengths[0], cand.audio_lengths[0]))
        a, b = ref.audio[0, :n].double(), cand.audio[0, :n].double()
        signal += float((a**2).sum())
        error += float(((a - b) ** 2).sum())
    return 10 * math.log10(signal / max(error, 1e-30))


def _measure(engine, sequences, noises, warm_runs: int, device: str) -> tuple[dict, list[SynthesisResult]]:
    """Batch-1 and batch-16 RTF of one engine (every shape already run by _first_pass), with VRAM peaks."""
    on_cuda = device.startswith("cuda")  # a CPU run is a smoke test of this script, nothing more
    vram_peak_mib = lambda: torch.cuda.max_memory_allocated() / MIB if on_cuda else 0.0
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    # No warm-up runs here: _first_pass has already run every shape once.
    speed, outputs = measure_batch1(engine.synthesize, sequences, noises, warm_runs, 0, device)
    vram_b1 = vram_peak_mib()
    rtf_b16 = measure_batched(engine.synthesize, sequences, 16, noises[0], warm_runs, 0, device)
    return {"rtf_cuda_b1": speed.rtf_b1, "rtf_cuda_b16": rtf_b16,
            "latency_first_audio_ms_cuda": speed.latency_first_audio_ms, "vram_peak_mib": vram_b1,
            "vram_peak_mib_b16": vram_peak_mib()}, outputs


SPEED_FIGURES = ("rtf_cuda_b1", "rtf_cuda_b16", "latency_first_audio_ms_cuda")


def _summarise_rounds(row: dict) -> None:
    """Each speed figure of ``row`` becomes the median of its rounds (``<figure>_rounds``), with
    ``<figure>_spread`` = max - min over the rounds."""
    for figure in SPEED_FIGURES:
        rounds = row[f"{figure}_rounds"]
        row[figure] = statistics.median(rounds)
        row[f"{figure}_spread"] = max(rounds) - min(rounds)


def _later_rounds(live: dict, sequences, noises, args: argparse.Namespace, results: dict, started: float,
                  report) -> None:
    """Rounds 2..``args.rounds`` over every built engine, the visiting order rotated each round.

    ``live`` maps a result key to (engine, graphs mode). Past the deadline no engine is measured
    again; each row keeps the rounds it has, and its ``rounds`` says how many."""
    keys = list(live)
    for round_index in range(1, args.rounds):
        shift = round_index % len(keys)
        for key in keys[shift:] + keys[:shift]:
            if time.perf_counter() - started > args.deadline_s:
                return
            engine, graphs = live[key]
            try:
                if hasattr(engine, "use_graphs"):
                    engine.use_graphs(graphs)
                figures, _ = _measure(engine, sequences, noises, args.warm_runs, args.device)
            except Exception as error:  # a failed later round leaves the earlier rounds' figures
                results[key].setdefault("round_errors", []).append(f"{type(error).__name__}: {error}"[:300])
                continue
            for figure in SPEED_FIGURES:
                results[key][f"{figure}_rounds"].append(figures[figure])
            results[key]["rounds"] = len(results[key]["rtf_cuda_b1_rounds"])
            _summarise_rounds(results[key])
        report()


def _first_pass(engine, sequences, noises) -> float:
    """Seconds for one pass at batch 1 and one at batch 16: captures and compiles every shape once."""
    started = time.perf_counter()
    for sequence, noise in zip(sequences, noises):
        engine.synthesize(SynthesisRequest.from_utterances([sequence], sampling=noise))
    for request in length_sorted_batches(sequences, 16, noises[0]):
        engine.synthesize(request)
    return time.perf_counter() - started


def _keep_busy(engine, sequences, noises, seconds: float) -> None:
    """Batch-1 passes of ``engine`` until ``seconds`` have passed. Why: on a machine that has just
    started, the first engine's first round read 0.0130 against 0.0071 and 0.0077 in its later rounds
    (docs/results/h200_13_engines.json, teacher/eager). A device still raising its clocks is the
    likely cause; with this warm-up a slow first round would point at the engine instead."""
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for sequence, noise in zip(sequences, noises):
            engine.synthesize(SynthesisRequest.from_utterances([sequence], sampling=noise))


def _read_bundle(bundle_dir: str) -> dict:
    path = Path(bundle_dir) / "bundle.json"
    bundle = json.loads(path.read_text(encoding="utf-8"))
    for key in ("family", "sample_rate_hz"):
        if key not in bundle:
            raise ValueError(f"{path} has no {key!r}: write the bundle with `python -m compress.distil prepare --family <family>`")
    return bundle


def _durations_equal(reference: list[SynthesisResult], candidate: list[SynthesisResult]) -> bool:
    """Every utterance's phoneme durations equal; outputs without durations compare their lengths."""
    return all(torch.equal(a.audio_lengths, b.audio_lengths) if a.durations is None or b.durations is None
               else torch.equal(a.durations, b.durations) for a, b in zip(reference, candidate))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, help="folder from `python -m compress.distil prepare --family <family>`")
    parser.add_argument("--inputs", required=True, help="JSON from `python -m evaluate.gpu_benchmark prepare`")
    parser.add_argument("--student", nargs="+", default=[], help="distilled students' weights (safetensors, one "
                        "file per student); the variants that need a student not given are left out of the plan")
    parser.add_argument("--utterances", type=int, default=100)
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--warmup-s", type=float, default=20.0, help="seconds of untimed batch-1 passes before "
                        "the call's first measurement (a device fresh from idle runs slower at first)")
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds per engine, interleaved across "
                        "engines (see above): the figure is their median and its spread their range")
    parser.add_argument("--deadline-s", type=float, default=540, help="start no engine past this many seconds")
    parser.add_argument("--only", default="", help="comma-separated variant/backend pairs of the family's plan to "
                        "run, e.g. teacher/eager,teacher/compile (all if empty); a pair may add @<conv layout>, "
                        "e.g. lite_fp16/compile@channels_last")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN times its convolution algorithms "
                        "per new shape, for every engine of the call")
    parser.add_argument("--package-dir", default="/tmp/aoti_packages", help="where AOTInductor packages go")
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-audio", type=int, default=0, help="keep each engine's batch-1 audio of the first N "
                        "utterances (audio_<variant>__<engine>.npz beside --out) for evaluate.score_gpu_audio: "
                        "quality measured on exactly what was timed")
    parser.add_argument("--device", default="cuda")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    if args.rounds < 1 or args.warm_runs < 1:
        parser.error(f"--rounds and --warm-runs must be >= 1, got {args.rounds} and {args.warm_runs}")
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)  # the tree the engines were built from
    started = time.perf_counter()

    bundle = _read_bundle(args.bundle)
    family = get_family(bundle["family"])
    suite = family.gpu_engines
    if suite is None:
        parser.error(f"family {family.name!r} registers no GPU engines (gpu_engines in its registry entry)")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here: TF32 would flatter the teacher
    torch.backends.cudnn.allow_tf32 = False
    models = suite.variants(Path(args.bundle), tuple(map(Path, args.student)))
    inputs = json.loads(open(args.inputs, encoding="utf-8").read())
    if inputs.get("family") != family.name:
        parser.error(f"--inputs were prepared for family {inputs.get('family')!r}, the bundle is {family.name!r}")
    utterances = inputs["utterances"][: args.utterances]
    sequences = sequences_from_inputs(utterances)
    noises = [family.sampling(seed=inputs["seed"] + i) for i in range(len(sequences))]
    sample_rate_hz = bundle["sample_rate_hz"]
    try:
        plan = _selected_plan(suite.plan, args.only, family.name)
    except ValueError as error:
        parser.error(str(error))
    plan = [(variant, backend, layout) for variant, backend, layout in plan if variant in models]
    torch.backends.cudnn.benchmark = args.cudnn_benchmark

    # Every engine stays built for the later rounds, so torch.compile's cache must hold every
    # variant's graphs at once (modules of one class share a code object): a generous limit, and an
    # error rather than a silent fall-back to eager if it is still hit.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    results: dict[str, dict] = {}
    eager_outputs: dict[str, list[SynthesisResult]] = {}
    live: dict[str, tuple] = {}  # result key -> (engine, graphs mode), for the later rounds
    # Which students' weights these engines ran, by content: a merge into the pipeline's table
    # (evaluate/gpu_results.py) checks a variant's figures against the weights that run scored.
    students_sha256 = {Path(path).name: file_sha256(path) for path in args.student}
    report = lambda: _write_report(args, results, len(sequences), inputs["eval_set"], origin, students_sha256)
    for variant, backend, layout in plan:
        if time.perf_counter() - started > args.deadline_s:
            results[f"{_variant_key(variant, layout)}/{backend}"] = {
                "error": f"not run: the {args.deadline_s:.0f} s deadline had passed"}
        else:
            _run_engines(suite, variant, backend, layout, models[variant], sample_rate_hz, sequences, noises, args,
                         results, eager_outputs, live, report)
        report()  # after each engine: a timeout keeps the rest
    _later_rounds(live, sequences, noises, args, results, started, report)
    report()


def _variant_key(variant: str, layout: str | None) -> str:
    return variant if layout is NATIVE_LAYOUT else f"{variant}@{layout}"


def _selected_plan(plan, only: str, family_name: str) -> list[tuple[str, str, str | None]]:
    """(variant, backend, conv layout or NATIVE_LAYOUT) triples: the whole plan in the variants' own
    layout when ``only`` is empty, else the entries it names (each pair with the layout after its
    ``@``, if any), once each, in the plan's order and the native layout before the converted ones."""
    if not only:
        return [(variant, backend, NATIVE_LAYOUT) for variant, backend in plan]
    plan = list(plan)
    selected = set()
    for entry in (entry for entry in only.split(",") if entry):
        pair, at, layout = entry.partition("@")
        variant, _, backend = pair.partition("/")
        if (variant, backend) not in plan:
            raise ValueError(f"--only names {pair!r}, not in the plan of family {family_name!r}: "
                             f"{', '.join(f'{v}/{b}' for v, b in plan)}")
        if at and layout not in CONV_LAYOUTS:
            raise ValueError(f"--only names conv layout {layout!r} in {entry!r}: use one of {list(CONV_LAYOUTS)}")
        selected.add((variant, backend, layout if at else NATIVE_LAYOUT))
    return sorted(selected, key=lambda triple: (plan.index(triple[:2]), triple[2] is not NATIVE_LAYOUT, triple[2] or ""))


def _run_engines(suite, variant: str, backend: str, layout: str | None, make_model, sample_rate_hz: int, sequences,
                 noises, args: argparse.Namespace, results: dict, eager_outputs: dict, live: dict, report) -> None:
    """Build one (variant, backend) engine with its convolutions in ``layout``; measure its first
    round in each of the family's graph modes for that backend.

    Rows go into ``results`` (an error row when a measurement fails), eager outputs into
    ``eager_outputs``, each measured (engine, graphs mode) into ``live`` for the later rounds.
    """
    variant_key = _variant_key(variant, layout)
    try:
        model = make_model()
        if layout is not NATIVE_LAYOUT:  # on a copy: the variant's own engines keep their convolutions
            model = converted_copy(model, layout)
        model = model.to(args.device)
        built = time.perf_counter()
        engine = suite.build_engine(model, backend, sample_rate_hz, Path(args.package_dir) / variant_key)
        build_s = time.perf_counter() - built
    except Exception as error:
        results[f"{variant_key}/{backend}"] = {"error": f"{type(error).__name__}: {error}"[:500]}
        print(f"{variant_key}/{backend}", "failed:", results[f"{variant_key}/{backend}"]["error"], flush=True)
        return
    for graphs in suite.graph_modes[backend]:
        key = f"{variant_key}/{backend}" + ("_cuda_graphs" if graphs and backend != "cuda_graphs" else "")
        try:
            if hasattr(engine, "use_graphs"):
                engine.use_graphs(graphs)
            first_pass_s = _first_pass(engine, sequences, noises)
            if not live:  # the call's first measurement: bring the device to its working clocks first
                _keep_busy(engine, sequences, noises, args.warmup_s)
            row, outputs = _measure(engine, sequences, noises, args.warm_runs, args.device)
            row.update({f"{figure}_rounds": [row[figure]] for figure in SPEED_FIGURES})
            row["rounds"] = 1
            _summarise_rounds(row)
            row.update({"build_s": build_s, "first_pass_s": first_pass_s,
                        "compile_s": getattr(engine, "compile_s", 0.0)})
            row["cudnn_benchmark"] = args.cudnn_benchmark  # calls merged later keep each row's own setting
            if backend == "eager" and layout is NATIVE_LAYOUT:
                eager_outputs[variant] = outputs
            elif variant in eager_outputs:
                row["snr_db_vs_eager"] = _snr_db(eager_outputs[variant], outputs)
                row["durations_equal_vs_eager"] = float(_durations_equal(eager_outputs[variant], outputs))
            if args.save_audio:
                texts = [sequence.text for sequence in sequences]
                audio_path = Path(args.out).parent / f"audio_{key.replace('/', '__')}.npz"
                row["audio_file"] = audio_path.name
                row["audio_utterances"] = save_audio(str(audio_path), key, outputs, texts, args.save_audio)
            results[key] = row
            live[key] = (engine, graphs)
        except Exception as error:  # one engine failing must not lose the others' figures
            results[key] = {"error": f"{type(error).__name__}: {error}"[:500]}
        print(key, json.dumps(results[key]), flush=True)
        report()


def _write_report(args: argparse.Namespace, results: dict[str, dict], utterances: int, eval_set: str,
                  origin: dict, students_sha256: dict[str, str]) -> None:
    baseline = results.get("teacher/eager", {}).get("rtf_cuda_b1")
    for row in results.values():
        if baseline and "rtf_cuda_b1" in row:
            row["speedup_b1_vs_teacher_eager"] = baseline / row["rtf_cuda_b1"]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU smoke test)"
    report = {"machine": {"gpu": gpu, "torch": torch.__version__,
                          "compile_mode": "default (torch.compile), dynamic shapes",
                          "cudnn_benchmark": args.cudnn_benchmark,
                          "date": datetime.date.today().isoformat()},
              "utterances": utterances, "eval_set": eval_set, "warm_runs": args.warm_runs, "rounds": args.rounds,
              CALL_STUDENTS_KEY: students_sha256, "engines": results,
              "provenance": origin}
    write_text_atomic(Path(args.out), json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
