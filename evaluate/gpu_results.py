"""One GPU-results file for the pipeline from the H200 calls: clean per-variant VRAM from
`evaluate.gpu_benchmark` and every (variant x engine) speed from `evaluate.gpu_engines`.

    python -m evaluate.gpu_results --benchmark docs/results/h200_half_precision.json \
        --engines docs/results/h200_engines.json --out docs/results/h200_merged.json
    python -m compress +experiment=full evaluate.gpu_results=$PWD/docs/results/h200_merged.json

Speeds come from the engines call (every engine side by side in one call): a variant's
``rtf_cuda_b1``/``rtf_cuda_b16`` are its eager figures, ``rtf_cuda_b1_<engine>`` the others'; a
variant that call did not run (bf16) keeps the benchmark call's speeds.
VRAM comes from the benchmark call, which measures each variant alone on the device (the
engines call keeps earlier models and graph pools resident, so its peaks are not per variant).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from compress.atomic_io import write_text_atomic

SPEED_KEYS = ("rtf_cuda_b1", "rtf_cuda_b16", "latency_first_audio_ms_cuda")
VRAM_KEYS = ("vram_peak_mib", "vram_peak_mib_b16", "vram_weights_mib")
# Engine-run variants that are the pipeline's variants under another name.
PIPELINE_NAMES = {"teacher": "teacher", "fp16": "fp16", "lite": "lite", "lite_fp16": "lite"}


def merge(benchmark: dict, engines: dict) -> dict:
    variants: dict[str, dict[str, float]] = {}
    for name, row in benchmark["variants"].items():
        variants[name] = {k: v for k, v in row.items() if k in VRAM_KEYS + SPEED_KEYS}
    for pair, row in engines["engines"].items():
        engine_variant, engine = pair.split("/")
        if "error" in row or engine_variant not in PIPELINE_NAMES:
            continue
        target = variants.setdefault(PIPELINE_NAMES[engine_variant], {})
        precision = "_fp16" if engine_variant == "lite_fp16" else ""
        for key in SPEED_KEYS:
            if engine == "eager" and not precision:
                target[key] = row[key]
            target[f"{key}_{engine}{precision}"] = row[key]
    return {"machine": engines["machine"] | {"vram_from": benchmark.get("date", "benchmark call")},
            "variants": variants, "engines": engines["engines"], "utterances": engines["utterances"],
            "eval_set": engines["eval_set"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", required=True)
    parser.add_argument("--engines", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    merged = merge(json.loads(Path(args.benchmark).read_text()), json.loads(Path(args.engines).read_text()))
    write_text_atomic(Path(args.out), json.dumps(merged, indent=2))
    print(f"wrote {args.out}: {sorted(merged['variants'])}")


if __name__ == "__main__":
    main()
