"""One GPU-results file for the pipeline from the H200 calls: clean per-variant VRAM from
`evaluate.gpu_benchmark` and every (variant x engine) speed from `evaluate.gpu_engines`.

    python -m evaluate.gpu_results --benchmark docs/results/h200_half_precision.json \
        --engines docs/results/h200_engines.json --out docs/results/h200_merged.json
    python -m compress +experiment=full evaluate.gpu_results=$PWD/docs/results/h200_merged.json

Several engines calls merge in order, a later call's row replacing an earlier one's; ``--drop``
removes rows known to be wrong, ``2:lite/compile`` from the second call only (say why in
docs/benchmarks.md). Each row keeps the speed-up its
own call measured against that call's eager teacher.

Speeds come from the engines call (every engine side by side in one call): a variant's
``rtf_cuda_b1``/``rtf_cuda_b16`` are its eager figures, ``rtf_cuda_b1_<engine>`` the others'; a
variant that call did not run (bf16) keeps the benchmark call's speeds. An engines call measured
in rounds (``gpu_engines --rounds``) gives each speed its ``_spread`` too, under the same name plus
``_spread`` (``rtf_cuda_b1_spread``, ``rtf_cuda_b1_compile_spread``), which the selection rule reads.
VRAM comes from the benchmark call, which measures each variant alone on the device (the
engines call keeps earlier models and graph pools resident, so its peaks are not per variant).

A variant built on trained weights (the Lite student) is only as timed as those weights: each
engines call records the sha256 of the students it was given (``students_sha256``), each merged
row carries its call's (``call_students_sha256``), and the merge keeps per pipeline variant the
students that every call feeding it was given (``variant_students_sha256``). The pipeline takes a
variant's GPU figures only when that set holds the weights it scored (compress/pipeline.py). One
row from a call that was given other students, or that recorded none (calls before the record),
empties the set and so withholds the whole variant: the merge prints such rows, which ``--drop``
can leave out.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, publication_or_exit

SPEED_KEYS = ("rtf_cuda_b1", "rtf_cuda_b16", "latency_first_audio_ms_cuda")
VRAM_KEYS = ("vram_peak_mib", "vram_peak_mib_b16", "vram_weights_mib")
CALL_STUDENTS_KEY = "students_sha256"  # an engines call: student file name -> sha256 of its bytes
ROW_STUDENTS_KEY = "call_students_sha256"  # a merged row: the sha256s its call was given, sorted
VARIANT_STUDENTS_KEY = "variant_students_sha256"  # merged: variant -> the sha256s every call feeding it was given
# Engine-run variants that are the pipeline's variants under another name.
PIPELINE_NAMES = {"teacher": "teacher", "fp16": "fp16", "lite": "lite", "lite_fp16": "lite"}


def combine_engine_calls(calls: list[dict], drop: tuple[str, ...] = ()) -> dict:
    """One engines report from several calls: rows in call order (later wins).

    ``drop``: ``<n>:<variant>/<engine>`` leaves that row of the n-th call (1-based) out before
    merging; a bare ``<variant>/<engine>`` leaves it out of every call.
    """
    if not calls:
        raise ValueError("give at least one engines report")
    utterances = {call["utterances"] for call in calls}
    if len(utterances) != 1:
        raise ValueError(f"engines calls timed different sentence counts {sorted(utterances)}: not comparable")
    rows: dict[str, dict] = {}
    unused = set(drop)
    for number, call in enumerate(calls, start=1):
        students = sorted(call.get(CALL_STUDENTS_KEY, {}).values())
        for pair, row in call["engines"].items():
            dropped = {f"{number}:{pair}", pair} & set(drop)
            unused -= dropped
            if not dropped:
                rows[pair] = {**row, ROW_STUDENTS_KEY: students}  # each row keeps its own call's students
    if unused:
        raise ValueError(f"--drop names rows no call has: {sorted(unused)}")
    combined = {key: value for key, value in calls[-1].items() if key != CALL_STUDENTS_KEY}  # per row now
    return {**combined, "engines": rows}


def merge(benchmark: dict, engines: dict) -> dict:
    """``engines``: from combine_engine_calls. ``variant_students_sha256`` (module docstring); a
    variant with students given to only some of the calls feeding it (or rows that recorded none) is
    listed under ``student_disagreements``: those students and each row's."""
    variants: dict[str, dict[str, float]] = {}
    students: dict[str, set[str]] = {}
    rows_students: dict[str, dict[str, list[str]]] = {}
    for name, row in benchmark["variants"].items():
        variants[name] = {k: v for k, v in row.items() if k in VRAM_KEYS + SPEED_KEYS}
    for pair, row in engines["engines"].items():
        engine_variant, engine = pair.split("/")
        if "error" in row or engine_variant not in PIPELINE_NAMES:
            continue
        name = PIPELINE_NAMES[engine_variant]
        row_students = row.get(ROW_STUDENTS_KEY, [])
        students[name] = students.get(name, set(row_students)) & set(row_students)
        rows_students.setdefault(name, {})[pair] = row_students
        target = variants.setdefault(name, {})
        precision = "_fp16" if engine_variant == "lite_fp16" else ""
        for key in SPEED_KEYS:
            for suffix in ("", "_spread"):
                if f"{key}{suffix}" not in row:  # calls measured once have no spread
                    continue
                if engine == "eager" and not precision:
                    target[f"{key}{suffix}"] = row[f"{key}{suffix}"]
                target[f"{key}_{engine}{precision}{suffix}"] = row[f"{key}{suffix}"]
    return {"machine": engines["machine"] | {"vram_from": benchmark.get("date", "benchmark call")},
            "variants": variants, VARIANT_STUDENTS_KEY: {name: sorted(digests) for name, digests in students.items()},
            "student_disagreements": _disagreements(rows_students, students),
            "engines": engines["engines"],
            "utterances": engines["utterances"],
            "eval_set": engines["eval_set"]}


def _disagreements(rows_students: dict[str, dict[str, list[str]]], kept: dict[str, set[str]]) -> dict[str, dict]:
    """variant -> the students some of its rows' calls were given and others not, with each row's."""
    partial = {name: set().union(*map(set, by_row.values())) - kept[name] for name, by_row in rows_students.items()}
    return {name: {"partial_students": sorted(partial[name]), "rows": rows_students[name]}
            for name in rows_students if partial[name]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", required=True)
    parser.add_argument("--engines", required=True, nargs="+", help="engines reports, oldest first")
    parser.add_argument("--drop", default="", help="comma-separated [n:]variant/engine rows to leave out")
    parser.add_argument("--out", required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    calls = [json.loads(Path(path).read_text()) for path in args.engines]
    drop = tuple(pair for pair in args.drop.split(",") if pair)
    merged = merge(json.loads(Path(args.benchmark).read_text()), combine_engine_calls(calls, drop))
    merged["provenance"] = origin  # of this merge; each call's own provenance stays in its file
    write_text_atomic(Path(args.out), json.dumps(merged, indent=2))
    print(f"wrote {args.out}: {sorted(merged['variants'])}")
    for name, disagreement in merged["student_disagreements"].items():
        print(f"variant {name!r}: students {disagreement['partial_students']} were given to only some of the calls "
              f"feeding it (rows: {disagreement['rows']}); the pipeline withholds its GPU figures if it stands on one "
              "of them: --drop n:pair leaves a call's row out")


if __name__ == "__main__":
    main()
