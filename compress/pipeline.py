"""The compress pipeline: build each variant, score it with evaluate/, log it to MLflow, tabulate.

Entry function ``run(settings, resolved_config)``; the CLI (compress/__main__.py) only turns the
Hydra config into settings and calls it. Tests call it the same way on the debug preset.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import mlflow
import yaml
from rich.console import Console

from compress.evaluation_cache import EvaluationCache, EvaluationOrigin, audio_digest, with_file_digests
from compress.graph_step import variant_graph
from compress.registration import select_and_register
from compress.settings import RunSettings
from compress.stage_cache import graph_dir, stage_dir
from compress.stages import STAGES, built_with, stage_settings_chain
from compress.tracking import log_variant_run, start_parent_run
from compress.variants import StageContext, Variant, build_variant, set_cpu_threads
from core.atomic_io import write_text_atomic
from core.file_digest import file_sha256
from evaluate.asr import build_recognizer
from evaluate.gpu_results import PIPELINE_NAMES, VARIANT_STUDENTS_KEY
from evaluate.rtf import interleaved_rtf
from evaluate.runner import EvaluationSet, VariantEvaluation, evaluate_variant
from models.interface import SynthesisRequest
from models.registry import get_family
from texts import load_sentences

TABLE_COLUMNS = (
    "params_m", "size_mb", "rtf_cpu_b1", "rtf_cpu_b1_spread", "latency_first_audio_ms", "rss_peak_mib", "rtf_cuda_b1",
    "rtf_cuda_b1_spread",
    "rtf_cuda_b16", "vram_peak_mib", "dnsmos_p808", "dnsmos_ovrl", "wer", "cer", "mcd_db", "spk_sim",
)


QUALITY_COLUMNS = ("params_m", "size_mb", "dnsmos_p808", "dnsmos_ovrl", "wer", "cer", "mcd_db", "spk_sim")


def load_gpu_results(path: str | None) -> dict:
    """Figures from `python -m evaluate.gpu_benchmark`, keyed by variant name."""
    if path is None:
        return {}
    with open(path, encoding="utf-8") as handle:
        payload = json.load(handle)
    if "variants" not in payload or "machine" not in payload:
        raise ValueError(f"{path} is not a gpu_benchmark result (needs 'machine' and 'variants')")
    return payload


def _columns(rows: dict[str, dict[str, float]], family_columns: tuple[str, ...]) -> list[str]:
    """The table's columns any variant has: the stable ones, then the family's own (``Family.measure_variant``)."""
    return [c for c in (*TABLE_COLUMNS, *family_columns) if any(c in metrics for metrics in rows.values())]


def results_markdown(rows: dict[str, dict[str, float]], family_columns: tuple[str, ...] = (),
                     note: str | None = None) -> str:
    """``note``: a sentence above the table (``Family.weights_note``: why its quality means nothing)."""
    columns = _columns(rows, family_columns)
    lines = [f"> {note}", ""] if note else []
    lines += ["| variant | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, metrics in rows.items():
        cells = [f"{metrics[c]:.4g}" if c in metrics else "-" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def results_text(rows: dict[str, dict[str, float]], width: int = 80, family_columns: tuple[str, ...] = ()) -> str:
    """The results as plain text no wider than ``width``: one line per metric, one column per variant,
    variants split into as many blocks as the width needs (a log file or an 80-column terminal)."""
    columns = _columns(rows, family_columns)
    label = max(len("variant"), *(len(c) for c in columns))
    cell = max(9, *(len(name) for name in rows)) + 1
    per_block = max(1, (width - label) // cell)
    names = list(rows)
    blocks = []
    for start in range(0, len(names), per_block):
        chunk = names[start : start + per_block]
        lines = ["variant".ljust(label) + "".join(name.rjust(cell) for name in chunk)]
        for column in columns:
            values = [f"{rows[name][column]:.4g}" if column in rows[name] else "-" for name in chunk]
            lines.append(column.ljust(label) + "".join(value.rjust(cell) for value in values))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _print_table(rows: dict[str, dict[str, float]], family_columns: tuple[str, ...], note: str | None) -> None:
    Console().print("variants, side by side (same run)", style="bold")
    if note:
        Console().print(note, style="bold red")
    print(results_text(rows, family_columns=family_columns))


def run(settings: RunSettings, resolved_config: dict) -> dict[str, dict[str, float]]:
    """Score every configured variant; returns {variant: metrics}. Artifacts go to run_dir and MLflow."""
    run_dir = Path(settings.paths.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    Path(settings.paths.output_dir).mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "resolved_config.yaml"
    write_text_atomic(config_path, yaml.safe_dump(resolved_config, sort_keys=False))
    gpu = load_gpu_results(settings.evaluate.gpu_results)

    sentences = load_sentences(settings.data.eval_set)[: settings.data.max_eval_sentences]
    set_cpu_threads(settings.evaluate.cpu_threads)
    reference_name = settings.evaluate.reference_variant
    # The reference first (others are measured against it), then base variants, then the stages
    # that start from them.
    ordered = [reference_name] + [v for v in settings.variants if v != reference_name and v not in STAGES]
    ordered += [v for v in settings.variants if v in STAGES]

    family = get_family(settings.model.family)
    # One sampling for every variant (utterance i: seed + i), so their audio compares sample for sample.
    shared = settings.evaluate.sampling
    sampling = family.sampling(seed=shared.seed, length_scale=shared.length_scale, **settings.model.sampling)
    weights_note = family.weights_note(settings.model.voice) if family.weights_note else None
    family_columns: dict[str, None] = {}  # the family's own metric names, in the order it gave them
    reference_measures = None  # the reference variant's VariantMeasures, which later variants compare with
    rows: dict[str, dict[str, float]] = {}
    built: dict[str, Variant] = {}
    reference: VariantEvaluation | None = None
    evaluation_set = recognizer = None
    calibration: list | None = None
    cpu_timed: list[str] = []  # variants whose CPU speed is measured (GPU-only precisions are not)
    pending_logs: dict[str, tuple] = {}  # logged once the interleaved speed rounds have run
    cache: EvaluationCache | None = None  # finished evaluations of earlier runs (made with the evaluation set)
    origins: dict[str, EvaluationOrigin] = {}  # variant -> scored in this run, or reused from when and where
    reference_audio: str | None = None  # digest of the reference's audio, which the cache keys dependents on
    file_digests: dict[Path, str] = {}  # checkpoints, voices and trained weights, hashed once per run
    withheld_gpu: set[str] = set()  # variants whose GPU figures are not shown to have run their weights

    def calibration_sequences() -> list:  # the calibration set through the voice's frontend, once
        nonlocal calibration
        if calibration is None:
            calibration = [seq for sentence in load_sentences(settings.data.calibration_set)
                           for seq in built[reference_name].model.text_to_utterances(sentence)]
        return calibration

    with start_parent_run(settings.tracking.tracking_uri, settings.tracking.experiment_name,
                          f"compress:{'+'.join(settings.variants)}", resolved_config, config_path,
                          settings.paths.root):
        # Variants are logged once the interleaved speed rounds have run; a run that fails part way
        # still logs every variant it finished, with the speed it measured alone.
        try:
            for name in ordered:
                if name in STAGES:
                    spec = STAGES[name]
                    context = StageContext(calibration_sequences(), stage_dir(settings.paths.output_dir, family.name, name),
                                           settings.evaluate.cpu_threads, Path(settings.paths.cache_dir),
                                           family, settings.model.voice, sampling)
                    context.work_dir.mkdir(parents=True, exist_ok=True)
                    stage_settings = settings.stages[spec.settings_key] if spec.settings_key else None
                    variant = spec.build(built[spec.source], stage_settings, context)
                else:
                    variant = build_variant(name, settings)
                built[name] = variant
                if evaluation_set is None:  # every variant of a run shares the voice's frontend
                    evaluation_set = EvaluationSet.build(sentences, variant.model, sampling)
                    recognizer = _recognizer(settings, [s.text for s in evaluation_set.sequences])
                    if family.measure_variant is None:
                        cache, cache_note = EvaluationCache.for_run(Path(settings.paths.output_dir), family.name,
                                                                    resolved_config, evaluation_set)
                    else:
                        cache_note = "evaluations are not kept: the family's own measures are not cached"
                    print(cache_note, flush=True)
                timed = STAGES[name].timed_on_cpu if name in STAGES else True
                result, origins[name] = _evaluate_or_reuse(
                    variant, evaluation_set, settings, resolved_config,
                    None if name == reference_name else reference, reference_audio, recognizer, timed, cache,
                    file_digests)
                if name == reference_name:
                    reference = result
                    reference_audio = None if cache is None else audio_digest(result.waveforms)
                family_metrics = {}
                if family.measure_variant is not None:
                    measured = family.measure_variant(variant.model, evaluation_set.sequences, sampling,
                                                      None if name == reference_name else reference_measures.reference,
                                                      timed)
                    if name == reference_name:
                        reference_measures = measured
                    family_metrics = measured.metrics
                    family_columns.update(dict.fromkeys(family_metrics))
                # Every variant's deployable graph, its checks and (torch variants) its parity; later
                # stages (lite_ort) start from it.
                graph_metrics, graph_tags, graph_artifacts = variant_graph(
                    variant, settings, calibration_sequences(), graph_dir(settings.paths.output_dir, family.name, name))
                variant.artifacts.update(graph_artifacts)
                gpu_figures = _gpu_figures_of(gpu, variant, file_digests)
                if gpu_figures is None:
                    withheld_gpu.add(name)
                metrics = {**variant.stage_metrics, **result.metrics, **family_metrics, **graph_metrics,
                           **(gpu_figures or {})}
                tags = {"engine": variant.engine, "device": variant.device,
                        "cpu_threads": str(settings.evaluate.cpu_threads), "eval_set": settings.data.eval_set,
                        "eval_sentences": str(len(evaluation_set.sequences)), "evaluation": origins[name].describe(),
                        **variant.stage_tags, **graph_tags}
                if weights_note:
                    tags["weights_note"] = weights_note
                if gpu_figures:
                    tags["gpu_machine"] = gpu["machine"].get("gpu", "unknown")
                elif gpu_figures is None:
                    tags["gpu_figures"] = "withheld: not shown to have run this variant's trained weights"
                samples = settings.evaluate.audio_samples
                sample_texts = [s.text for s in evaluation_set.sequences][:samples]
                pending_logs[name] = (tags, result.waveforms[:samples], sample_texts, result.sample_rate_hz,
                                      variant.model.hop_length, variant.artifacts)
                rows[name] = metrics
                # As each variant finishes: a run stopped part way still says where its rows came from.
                _write_origins(run_dir, {finished: origins[finished] for finished in rows})
                if timed and variant.device == "cpu":
                    cpu_timed.append(name)
            if settings.evaluate.speed_rounds and cpu_timed:
                _time_interleaved({name: built[name] for name in cpu_timed}, evaluation_set, settings.evaluate, rows)
        finally:
            for name, (tags, waveforms, texts, sample_rate_hz, hop_length, artifacts) in pending_logs.items():
                log_variant_run(name, rows[name], tags, waveforms, texts, sample_rate_hz, hop_length, len(waveforms),
                                artifacts)
        _log_engine_runs(gpu, {name: row for name, row in rows.items() if name not in withheld_gpu})
        if weights_note:
            mlflow.set_tag("weights_note", weights_note)
        table = results_markdown(rows, tuple(family_columns), weights_note)
        write_text_atomic(run_dir / "results.md", table)
        write_text_atomic(run_dir / "results.json", json.dumps(rows, indent=2))
        mlflow.log_artifact(str(run_dir / "results.md"))
        mlflow.log_artifact(str(run_dir / "results.json"))
        # The champion by conf/selection, logged and deployed (a run with no eligible
        # variant, or none that serve can run, still finishes and says why).
        selection_summary = select_and_register(rows, built, settings, mlflow.active_run().info.run_id,
                                                {name: built_with(name, settings.stages) for name in built})
    _print_table(rows, tuple(family_columns), weights_note)
    print(selection_summary)
    return rows


def _gpu_figures_of(gpu: dict, variant: Variant, file_digests: dict[Path, str]) -> dict[str, float] | None:
    """The variant's figures from the GPU results file; None (withheld, with a line saying why)
    when the variant stands on trained weights that the GPU call's rows for it did not run
    (evaluate/gpu_results.py records them by content)."""
    figures = gpu.get("variants", {}).get(variant.name, {})
    if not figures or not variant.trained_weights:
        return figures
    timed = set(gpu.get(VARIANT_STUDENTS_KEY, {}).get(variant.name, []))
    for path in variant.trained_weights:
        if path not in file_digests:
            file_digests[path] = file_sha256(path)
    untimed = [path.name for path in variant.trained_weights if file_digests[path] not in timed]
    if untimed:
        given = (f"its calls were given {sorted(timed)}" if timed else
                 "its calls recorded no students, or were given different ones (evaluate/gpu_results.py)")
        print(f"{variant.name}: GPU figures withheld: not measured on {', '.join(untimed)} (by sha256; {given})",
              flush=True)
        return None
    return figures


def _log_engine_runs(gpu: dict, rows: dict[str, dict[str, float]]) -> None:
    """One nested run per (variant x engine) the GPU call measured (evaluate/gpu_engines.py).

    Metric names are the variants' own, so the MLflow UI compares pairs and variants alike: the
    engine's speed, and the quality the same weights at the same precision scored in this run (its
    output SNR against eager is logged beside, ``snr_db_vs_eager``). An engine of the variant in
    another precision (``lite_fp16`` for ``lite``) gets no quality figures: its audio was not
    scored here (evaluate/score_gpu_audio.py scores what the GPU call saved).
    """
    for pair, figures in gpu.get("engines", {}).items():
        engine_variant, engine = pair.split("/")
        variant = PIPELINE_NAMES.get(engine_variant)
        if variant not in rows or "error" in figures:
            continue
        same_precision = engine_variant == variant
        quality = {k: rows[variant][k] for k in QUALITY_COLUMNS if k in rows[variant]} if same_precision else {}
        speed = {k: float(v) for k, v in figures.items() if isinstance(v, (int, float))}
        with mlflow.start_run(run_name=f"{engine_variant}@{engine}", nested=True):
            mlflow.set_tags({"variant": variant, "engine": engine, "weights": engine_variant,
                             "gpu_machine": gpu["machine"].get("gpu", "unknown"),
                             "quality": "of the variant's CPU audio" if same_precision else "not measured in this run"})
            mlflow.log_metrics({**quality, **speed})


def _write_origins(run_dir: Path, origins: dict[str, EvaluationOrigin]) -> None:
    write_text_atomic(run_dir / "evaluation_origins.json",
                      json.dumps({name: dataclasses.asdict(origin) for name, origin in origins.items()}, indent=2))


def _evaluate_or_reuse(variant: Variant, evaluation_set: EvaluationSet, settings: RunSettings, resolved_config: dict,
                       reference: VariantEvaluation | None, reference_audio: str | None, recognizer, timed: bool,
                       cache: EvaluationCache | None,
                       file_digests: dict[Path, str]) -> tuple[VariantEvaluation, EvaluationOrigin]:
    """The variant's evaluation: a finished one from ``cache`` when it matches (compress/evaluation_cache.py),
    else measured here and kept. ``reference``: None when the variant is the reference itself;
    ``reference_audio``: the digest of its audio (evaluation_cache.audio_digest)."""
    if cache is None:
        return evaluate_variant(variant, evaluation_set, settings.evaluate, reference, recognizer, timed), \
            EvaluationOrigin(reused=False)
    stages_behind = (stage_settings_chain(variant.name, resolved_config)
                     | stage_settings_chain(settings.evaluate.reference_variant, resolved_config))
    dependencies: dict = {"stages": with_file_digests(stages_behind, known=file_digests)}
    if reference is not None:  # scored against the reference's audio: reused only against the same audio
        dependencies["reference_audio"] = reference_audio
    # The reference's waveforms are read whole (later variants are scored against them); the others'
    # only as logged samples.
    kept_waveforms = None if reference is None else settings.evaluate.audio_samples
    first = SynthesisRequest.from_utterances([evaluation_set.sequences[0]], sampling=evaluation_set.samplings[0])
    reused = cache.load(variant.name, dependencies, utterances=len(evaluation_set.sequences),
                        needed_waveforms=kept_waveforms, probe=lambda: variant.model.synthesize(first).waveforms()[0],
                        same_processor_only=timed and settings.evaluate.speed_rounds == 0)
    if reused is not None:
        print(f"{variant.name}: {reused.origin.describe()}", flush=True)
        return reused.evaluation, reused.origin
    result = evaluate_variant(variant, evaluation_set, settings.evaluate, reference, recognizer, timed)
    cache.save(variant.name, dependencies, result, kept_waveforms)
    return result, EvaluationOrigin(reused=False)


def _time_interleaved(variants: dict[str, Variant], evaluation_set: EvaluationSet, settings, rows: dict) -> None:
    """Every CPU-timed variant re-timed in ``settings.speed_rounds`` interleaved rounds: rtf_cpu_b1
    becomes the median of the rounds and rtf_cpu_b1_spread their range (the single measurement made
    while the variant was evaluated stays as rtf_cpu_b1_alone)."""
    print(f"timing {', '.join(variants)}: {settings.speed_rounds} interleaved rounds", flush=True)
    per_round = interleaved_rtf({name: variant.model.synthesize for name, variant in variants.items()},
                                evaluation_set.sequences, evaluation_set.samplings, settings.speed_rounds,
                                settings.warmup_runs)
    for name, values in per_round.items():
        if "rtf_cpu_b1" in rows[name]:  # absent when reused from another processor's run
            rows[name]["rtf_cpu_b1_alone"] = rows[name]["rtf_cpu_b1"]
        rows[name]["rtf_cpu_b1"] = statistics.median(values)
        rows[name]["rtf_cpu_b1_spread"] = max(values) - min(values)
        rows[name]["speed_rounds"] = float(len(values))


def _recognizer(settings: RunSettings, texts: list[str]):
    """The recognizer for the error rate, built once per run (evaluate.recognizer)."""
    if "wer" not in settings.evaluate.metrics:
        return None
    recognizer, language = settings.evaluate.recognizer, settings.scored_language
    model = recognizer.whisper_model(language) if recognizer.kind == "whisper" else None
    print(f"recognizer: {recognizer.kind}{f' {model}' if model else ''}, transcribing {language!r}", flush=True)
    return build_recognizer(recognizer.kind, model, language, settings.evaluate.cpu_threads, texts,
                            Path(settings.paths.cache_dir))
