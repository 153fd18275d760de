"""Stage: FP16 / BF16 variants for GPU execution, with numerically fragile parts kept in FP32.

Inputs -> artifact + metrics, like every stage:

    from compress.half_precision import HalfPrecisionSettings, build

    settings = HalfPrecisionSettings(dtype="float16", keep_fp32=["encoder", "duration"], measure_sentences=16)
    settings.check_family(ctx.family)           # keep_fp32 names part roles of the run's family
    fp16 = build(teacher, settings, ctx)        # teacher: the fp32 Variant; ctx: compress.variants.StageContext
    fp16.stage_tags["fp32_parts"]               # which parts stayed FP32, with the numbers that say why
    fp16.artifacts["part_sensitivity"]          # ctx.work_dir / "fp16_part_sensitivity.json"

Each part of the teacher is first run alone in half precision (the others in FP32) on the
calibration sentences with the same noise as the FP32 teacher (models.precision.part_sensitivity):
how many utterances and phonemes changed duration, the waveform SNR where durations agree, and
MCD. ``keep_fp32`` is chosen from that table; the stage records the table, the numbers of every
kept part, and how the finished variant compares with the teacher on the same sentences.
The parts run in half precision behind float32 edges (models.precision.PrecisionIsland), so the
duration rounding between parts stays FP32.

Why parts stay FP32: a part whose output is rounded (durations rounded up to whole frames) turns
half precision's small errors into shifted frames, which move every later sample; a part after
that rounding only adds noise to the waveform. Which parts those are is the family's stage default
(conf/stages/family/<family>.yaml); the measured tables are in docs/benchmarks.md.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

from compress.variants import StageContext, Variant, check_part_roles, require_parts
from core.atomic_io import write_text_atomic
from core.config import ConfigError
from evaluate.mcd import mel_cepstral_distortion
from evaluate.memory import parameter_count, state_dict_size_mb
from models.family import Family
from models.precision import (
    HALF_DTYPES,
    VARIANT_NAMES,
    compare_outputs,
    part_sensitivity,
    synthesize_each,
    to_half_precision,
)


@dataclass(frozen=True)
class HalfPrecisionSettings:
    dtype: str  # "float16" or "bfloat16"
    keep_fp32: tuple[str, ...] = field(default=())  # part roles left in float32
    # Calibration sequences for the sensitivity table. On one CPU thread a sequence costs about
    # 3 s in bfloat16 and 30 s in float16 (slow fp16 CPU kernels); on a GPU, milliseconds.
    measure_sentences: int = 16

    def __post_init__(self):
        if self.dtype not in HALF_DTYPES:
            raise ConfigError(f"half_precision.dtype={self.dtype!r}: use one of {sorted(HALF_DTYPES)}")
        if isinstance(self.keep_fp32, str):
            raise ConfigError(f"half_precision.keep_fp32={self.keep_fp32!r}: give a list of parts, e.g. ['duration']")
        if len(set(self.keep_fp32)) != len(self.keep_fp32):
            raise ConfigError(f"half_precision.keep_fp32={list(self.keep_fp32)}: repeated parts")
        if self.measure_sentences < 1:
            raise ConfigError(f"half_precision.measure_sentences={self.measure_sentences}: must be >= 1")
        object.__setattr__(self, "keep_fp32", tuple(self.keep_fp32))

    def check_family(self, family: Family) -> None:
        """``keep_fp32`` against the family's part roles (compress/stages.py calls it at start)."""
        check_part_roles("half_precision.keep_fp32", self.keep_fp32, family)
        if set(self.keep_fp32) == set(family.part_roles):
            raise ConfigError("half_precision.keep_fp32 lists every part: that is the FP32 teacher, not a variant")


def _why(row: dict) -> str:
    """One part's measured row as a sentence: what running it alone in half precision did."""
    snr = "n/a" if row["snr_db_mean"] is None else f"{row['snr_db_mean']:.1f} dB"
    return (f"{row['part']}: alone in {row['dtype']}, durations changed in {row['durations_changed_fraction']:.0%} "
            f"of utterances ({row['phonemes_changed_fraction']:.1%} of phonemes, up to {row['frames_moved_max']} "
            f"frames), SNR {snr} where durations agree, MCD {row['mcd_db']:.2f} dB")


def build(teacher: Variant, settings: HalfPrecisionSettings, ctx: StageContext) -> Variant:
    """A new variant whose parts run in ``settings.dtype`` except ``settings.keep_fp32``; teacher untouched."""
    settings.check_family(ctx.family)
    require_parts("half precision", teacher, ctx.family, ctx.family.part_roles)
    sequences = ctx.calibration_sequences[: settings.measure_sentences]
    if len(sequences) < settings.measure_sentences:
        raise ValueError(f"measure_sentences={settings.measure_sentences} but the calibration set gives "
                         f"only {len(sequences)} sequences")
    name = VARIANT_NAMES[settings.dtype]
    # The run's sampling (else the family's defaults), seed i for sentence i: the same every run, and
    # bounded as the run bounds it (an autoregressive family's max_tokens).
    noises = [ctx.family.sampling(seed=i) if ctx.sampling is None else dataclasses.replace(ctx.sampling, seed=i)
              for i in range(len(sequences))]
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    table_path = ctx.work_dir / f"{name}_part_sensitivity.json"
    measured_for = {"dtype": settings.dtype, "device": teacher.device, "keep_fp32": list(settings.keep_fp32),
                    "sampling": repr(noises[0]),
                    "texts": [sequence.text for sequence in sequences]}

    voice = to_half_precision(teacher.model, settings.dtype, settings.keep_fp32)
    previous = json.loads(table_path.read_text(encoding="utf-8")) if table_path.is_file() else None
    if previous is not None and previous["measured_for"] == measured_for:
        table = previous  # resume: the same measurement on the same sentences is already here
    else:
        start = time.perf_counter()
        rows = part_sensitivity(teacher.model, sequences, settings.dtype, teacher.device, noises,
                                mel_cepstral_distortion)
        reference = synthesize_each(teacher.model, sequences, noises)
        variant_row = compare_outputs(synthesize_each(voice, sequences, noises), reference, mel_cepstral_distortion)
        table = {"measured_for": measured_for, "parts": rows, "variant": variant_row,
                 "measure_s": time.perf_counter() - start}
        write_text_atomic(table_path, json.dumps(table, indent=2))

    rows_by_part = {row["part"]: row for row in table["parts"]}
    kept = [_why(rows_by_part[role]) for role in settings.keep_fp32]
    half = [_why(rows_by_part[role]) for role in ctx.family.part_roles if role not in settings.keep_fp32]
    variant_row = table["variant"]
    stage_metrics = {
        "calib_durations_changed_fraction": variant_row["durations_changed_fraction"],
        "calib_phonemes_changed_fraction": variant_row["phonemes_changed_fraction"],
        "calib_mcd_db": variant_row["mcd_db"],
        "sensitivity_measure_s": table["measure_s"],
    }
    if variant_row["snr_db_mean"] is not None:
        stage_metrics["calib_snr_db_mean"] = variant_row["snr_db_mean"]
    return Variant(
        name=name,
        model=voice,
        engine="torch",
        device=teacher.device,
        params_m=parameter_count(voice) / 1e6,
        size_mb=state_dict_size_mb(voice),
        stage_metrics=stage_metrics,
        stage_tags={
            "dtype": settings.dtype,
            "fp32_parts": "; ".join(kept) if kept else "none",
            "half_parts": "; ".join(half),
        },
        artifacts={"part_sensitivity": table_path},
    )
