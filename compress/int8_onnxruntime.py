"""INT8 post-training static quantization of a voice graph with onnxruntime, so INT8 runs on CPU.

INT8 on the ONNX side. From the ``original_onnx`` variant:

1. prepare the graph with the family's reference runtime (``family.reference.prepare_graph``: the
   inputs and outputs its runtime feeds and reads, e.g. explicit noise and a durations output).
   ORT's ``quant_pre_process`` is not used: it runs only with its symbolic shape inference
   skipped (that stops at the data-dependent frame count), and then changed neither the int8
   MCD (0.552 vs 0.554 dB) nor the speed, because ORT makes the same fusions when it loads a graph;
2. calibrate once on the calibration set (never ``eval`` or ``harvard``): one sentence at a time,
   batch 1, fixed-seed noise, feeds built by the voice itself; the tensor ranges are cached;
3. per-block sensitivity (blocks as the family's ``QuantizationLayout`` names them from node
   names): quantize one block alone (from the cached ranges, no recalibration) and
   measure MCD against the fp32 graph and changed durations, same noise; a block above
   ``max_block_mcd_db`` or one that changes durations stays fp32;
4. quantize every other block (QDQ, int8 weights with zero point 0) and check speed against fp32.

ORT fuses each DequantizeLinear -> Conv -> QuantizeLinear into a QLinearConv (and MatMul into
QLinearMatMul) when it loads the graph; ConvTranspose has no int8 CPU kernel and runs in fp32
on dequantized weights, so quantizing it only adds error. ``build(..., polyphase_conv_transpose=True)``
(the ``lite_poly_int8`` variant) first rewrites each ConvTranspose as the same function in a Conv
(export/rewrites/polyphase_conv_transpose.py), whose block is then measured like any other.

Measured with the defaults (joe voice, 2 threads, AVX-512 VNNI, 20 eval sentences, batch 1):
49 of 155 Conv/MatMul nodes run int8 (the flow's coupling layers, the two top-level MatMuls,
dec.conv_pre, dec.resblocks.0-2), MCD 0.53 dB against fp32, every duration the same, 63 -> 40 MB,
1.1-1.25x faster than fp32. It is not faster than that because the rest cannot be int8 without
audible cost: the encoder and duration predictor move durations, and 8-bit activations in the
decoder's 64- and 32-channel stages put a noise floor under the waveform (0.9-3.7 dB per block);
those stages and the fp32-only ConvTranspose are most of the remaining time. All blocks int8:
1.66x, MCD 3.75 dB, durations changed.

Usage::

    from compress.int8_onnxruntime import Int8OrtSettings, build
    int8 = build(original_onnx_variant, Int8OrtSettings(), ctx)   # -> Variant "int8_ort"

    python -m compress.int8_onnxruntime --family <family> --work-dir outputs/int8_ort   # stage metrics, block table

Files in ``ctx.work_dir`` (each name carries the hash of the settings it depends on, so a rerun
with the same settings reuses it): ``calibration_ranges-<h>.json`` (ORT's range cache),
``sensitivity-<h>.json`` / ``.csv`` (the per-block table), ``int8_ort-<h>.onnx`` and its
manifest ``int8_ort-<h>.json`` (settings, stage metrics, fp32 blocks).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

from core.atomic_io import write_text_atomic
from core.file_digest import file_sha256
from compress.stage_cache import inputs_key, read_keyed_json, write_sensitivity_table
from compress.variants import StageContext, Variant
from evaluate.mcd import mel_cepstral_distortion
from evaluate.memory import file_size_mb
from evaluate.rtf import timed_median
from export.rewrites.polyphase_conv_transpose import polyphase_conv_transpose
from models.family import Family, QuantizationLayout, ReferenceRuntime
from models.interface import SynthesisRequest, SynthesisResult, TTSModel, Utterance
from models.registry import FAMILIES, family_of, get_family
from texts import load_sentences

VARIANT_NAME = "int8_ort"
CALIBRATORS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# Ops ORT's QDQ quantizer handles that carry this graph's compute. ConvTranspose is accepted so its
# cost can be measured, but ORT's CPU provider has no int8 kernel for it.
QUANTIZABLE_OP_TYPES = ("Conv", "MatMul", "ConvTranspose")


@dataclass
class Int8OrtSettings:
    """What ``build`` reads; every field is checked here or, for block names, against the graph."""

    # minmax | entropy | percentile. Same int8 blocks, 20 eval sentences, MCD vs fp32: entropy 0.53 dB,
    # percentile 0.54, minmax 0.57 (its ranges only widen as sentences are added). Calibration on
    # 32 sentences: minmax 18 s, entropy 30 s, percentile 59 s.
    calibrator: str = "entropy"
    per_channel: bool = True  # one weight scale per output channel: MCD 0.53 dB vs 0.59 per tensor, same speed
    # False: uint8 activations with a zero point (u8s8, ORT's fast x86 path with VNNI);
    # True: int8 activations with zero point 0 (s8s8, what ARM and TensorRT-style backends prefer).
    # Measured on AVX-512 VNNI, same blocks: u8s8 1.23x fp32, s8s8 1.04x (MCD 0.53 vs 0.56 dB).
    activation_symmetric: bool = False
    # ConvTranspose is left out: ORT has no int8 CPU kernel for it, so it runs fp32 on dequantized
    # weights. Measured with the three dec.ups added: no speed change, MCD 0.53 -> 1.43 dB.
    op_types: list[str] = field(default_factory=lambda: ["Conv", "MatMul"])
    calibration_sentences: int = 32  # of the 143 in the calibration set; each costs about a second
    sensitivity_sentences: int = 4  # per block; the pass costs blocks x sentences syntheses
    # A block whose int8 version alone moves the audio more than this stays fp32. Measured per
    # block (4 sentences): flows, early decoder and the top-level MatMuls 0.12-0.29 dB; mid decoder
    # 0.85-0.91; late decoder 1.9-3.5 (8-bit activations put a noise floor under the waveform);
    # encoder and duration blocks 0.34-0.86, and every one of them changes durations. For scale
    # (evaluate/mcd.py): the same text with another noise seed is 1.2 dB away.
    max_block_mcd_db: float = 0.4
    # A changed duration shifts every later frame: the variant stops being a drop-in for fp32.
    keep_fp32_if_durations_change: bool = True
    exclude_blocks: list[str] = field(default_factory=list)  # forced fp32, not measured
    # Blocks to measure; None measures all. A block not measured is not trusted and stays fp32,
    # so a short list gives a small, fast quantization (tests use it).
    sensitivity_blocks: list[str] | None = None
    speed_check_sentences: int = 5  # the stage-side fp32-vs-int8 timing; the pipeline does the real one

    def __post_init__(self):
        if self.calibrator not in CALIBRATORS:
            raise ValueError(f"Int8OrtSettings.calibrator={self.calibrator!r}: use one of {sorted(CALIBRATORS)}")
        for name in ("per_channel", "activation_symmetric", "keep_fp32_if_durations_change"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Int8OrtSettings.{name}={getattr(self, name)!r}: must be true or false")
        self.op_types = list(self.op_types)
        unknown = sorted(set(self.op_types) - set(QUANTIZABLE_OP_TYPES))
        if not self.op_types or unknown:
            raise ValueError(
                f"Int8OrtSettings.op_types={self.op_types}: give a non-empty subset of {list(QUANTIZABLE_OP_TYPES)}"
            )
        for name in ("calibration_sentences", "sensitivity_sentences", "speed_check_sentences"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Int8OrtSettings.{name}={value!r}: must be a positive number of sentences")
        if not self.max_block_mcd_db >= 0:
            raise ValueError(f"Int8OrtSettings.max_block_mcd_db={self.max_block_mcd_db!r}: must be >= 0 dB")
        self.exclude_blocks = list(self.exclude_blocks)
        if self.sensitivity_blocks is not None:
            self.sensitivity_blocks = list(self.sensitivity_blocks)
            if not self.sensitivity_blocks:
                raise ValueError("Int8OrtSettings.sensitivity_blocks=[]: give block names, or null to measure all")


def quantizable_blocks(graph: onnx.ModelProto, op_types: list[str],
                       layout: QuantizationLayout) -> dict[str, list[onnx.NodeProto]]:
    """{block: its nodes of ``op_types``}, blocks in graph order, named by the family's ``layout``."""
    blocks: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.graph.node:
        if node.op_type in op_types:
            blocks.setdefault(layout.block_of(node.name), []).append(node)
    return blocks


class GraphCalibrationReader(CalibrationDataReader):
    """Graph feeds for each sentence, batch 1, built by the voice exactly as ``synthesize`` builds them
    (``session_feeds`` of the family's reference runtime)."""

    def __init__(self, voice: TTSModel, requests: list[SynthesisRequest]):
        self.voice = voice
        self.requests = requests
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.requests):
            return None
        request = self.requests[self.position]
        self.position += 1
        return self.voice.session_feeds(request)


def sentence_requests(sequences: list[Utterance], family: Family) -> list[SynthesisRequest]:
    """One batch-1 request per sentence; sentence i samples from seed i with the family's default options."""
    return [SynthesisRequest.from_utterances([sequence], sampling=family.sampling(seed=i))
            for i, sequence in enumerate(sequences)]






@contextlib.contextmanager
def _quiet_ort_quantizer():
    """Silence the quantizer's per-call log lines and progress prints; a sensitivity pass calls it ~35 times."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _prepared_graph(reference: ReferenceRuntime, original_graph: Path, work_dir: Path, graph_sha: str) -> Path:
    """The original graph as the reference runtime prepares it (the inputs and outputs its runtime
    feeds and reads): what calibration and quantization read."""
    path = work_dir / f"fp32_prepared-{graph_sha[:16]}.onnx"
    if not path.is_file():
        tmp_path = path.with_name(path.name + ".tmp")
        onnx.save(reference.prepare_graph(original_graph), tmp_path)
        os.replace(tmp_path, path)
    return path


def _polyphase_graph(graph_path: Path, work_dir: Path, graph_sha: str) -> tuple[Path, dict[str, str]]:
    """``graph_path`` with its ConvTranspose nodes as polyphase Convs (same function, fp32): what
    calibration, sensitivity and quantization then read; and the rewrite's report per node."""
    rewritten, report = polyphase_conv_transpose(onnx.load(str(graph_path)))
    path = work_dir / f"fp32_polyphase-{graph_sha[:16]}.onnx"
    if not path.is_file():
        tmp_path = path.with_name(path.name + ".tmp")
        onnx.save(rewritten, tmp_path)
        os.replace(tmp_path, path)
    return path, report


def _calibrate(graph_path: Path, voice: TTSModel, requests: list[SynthesisRequest],
               settings: Int8OrtSettings, cache_path: Path) -> float:
    """Write ORT's range cache for ``settings.op_types``' tensors; returns the seconds it took."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=cache_path.parent) as tmp, _quiet_ort_quantizer():
        calibrator = create_calibrator(
            graph_path, settings.op_types, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method=CALIBRATORS[settings.calibrator],
        )
        # One sentence per call: the calibrator holds every augmented output of a call in memory
        # (hundreds of MB per sentence at the waveform rate) before folding it into ranges or histograms.
        for request in requests:
            calibrator.collect_data(GraphCalibrationReader(voice, [request]))
        ranges = calibrator.compute_data()
        tmp_cache = Path(tmp) / "ranges.json"
        save_tensors_data(ranges, tmp_cache)
        os.replace(tmp_cache, cache_path)
    return time.perf_counter() - start


def _quantize(graph_path: Path, output_path: Path, settings: Int8OrtSettings, calibration_cache: Path,
              nodes_to_quantize: list[str]) -> None:
    """QDQ-quantize exactly ``nodes_to_quantize`` from the cached ranges; writes ``output_path`` atomically."""
    activation_type = QuantType.QInt8 if settings.activation_symmetric else QuantType.QUInt8
    tmp_path = output_path.with_name(output_path.name + ".tmp")
    with _quiet_ort_quantizer():
        quantize_static(
            str(graph_path), str(tmp_path), calibration_data_reader=None,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=settings.op_types,
            per_channel=settings.per_channel,
            # Full 8-bit weights. 7-bit (reduce_range) only guards x86 without VNNI, whose u8*s8 pair sums
            # saturate at 16 bits; the machines this project measures on have AVX-512 VNNI.
            reduce_range=False,
            activation_type=activation_type,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes_to_quantize,
            calibrate_method=CALIBRATORS[settings.calibrator],
            calibration_cache_path=str(calibration_cache),
            extra_options={"ActivationSymmetric": settings.activation_symmetric, "WeightSymmetric": True},
        )
    os.replace(tmp_path, output_path)


def _degradation(candidate: TTSModel, requests: list[SynthesisRequest],
                 references: list[SynthesisResult]) -> dict[str, float]:
    """MCD (dB, mean and max over sentences) and changed durations of ``candidate`` against fp32, same noise."""
    mcds_db, duration_changes = [], 0
    for request, reference in zip(requests, references):
        result = candidate.synthesize(request)
        duration_changes += int((result.durations != reference.durations).sum())
        mcds_db.append(mel_cepstral_distortion(
            result.waveforms()[0], reference.waveforms()[0], sample_rate_hz=reference.sample_rate_hz
        ))
    return {"mcd_db": float(np.mean(mcds_db)), "mcd_max_db": float(np.max(mcds_db)),
            "duration_changes": duration_changes}


def _sensitivity(graph_path: Path, blocks: dict[str, list[onnx.NodeProto]], settings: Int8OrtSettings,
                 calibration_cache: Path, fp32_voice: TTSModel, reference: ReferenceRuntime, voice_name: str,
                 requests: list[SynthesisRequest], threads: int, work_dir: Path) -> list[dict]:
    """One row per block: its degradation when it alone is int8 (blocks not measured get None)."""
    references = [fp32_voice.synthesize(request) for request in requests]
    measured = settings.sensitivity_blocks if settings.sensitivity_blocks is not None else list(blocks)
    rows = []
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        for block, nodes in blocks.items():
            op_counts = sorted(Counter(node.op_type for node in nodes).items())
            row = {"block": block, "nodes": len(nodes), "op_types": " ".join(f"{op}:{n}" for op, n in op_counts),
                   "mcd_db": None, "mcd_max_db": None, "duration_changes": None, "seconds": None}
            if block in measured and block not in settings.exclude_blocks:
                start = time.perf_counter()
                block_path = Path(tmp) / "block.onnx"
                _quantize(graph_path, block_path, settings, calibration_cache, [node.name for node in nodes])
                candidate = reference.load_graph(voice_name, threads, block_path)
                row.update(_degradation(candidate, requests, references))
                row["seconds"] = time.perf_counter() - start
            rows.append(row)
    return rows


def _fp32_reason(row: dict, settings: Int8OrtSettings) -> str:
    """Why a block stays fp32 ("" when it is quantized)."""
    if row["block"] in settings.exclude_blocks:
        return "exclude_blocks"
    if row["mcd_db"] is None:
        return "not measured"
    if row["mcd_db"] > settings.max_block_mcd_db:
        return f"mcd {row['mcd_db']:.3f} dB > {settings.max_block_mcd_db} dB"
    if settings.keep_fp32_if_durations_change and row["duration_changes"] > 0:
        return f"{row['duration_changes']} durations changed"
    return ""




def graph_quantization_counts(graph_path: Path, op_types: list[str]) -> tuple[int, int]:
    """(nodes of ``op_types`` whose weight arrives through DequantizeLinear, those still fp32)."""
    graph = onnx.load(str(graph_path), load_external_data=False)
    dequantized = {node.output[0] for node in graph.graph.node if node.op_type == "DequantizeLinear"}
    candidates = [node for node in graph.graph.node if node.op_type in op_types]
    quantized = sum(1 for node in candidates if node.input[1] in dequantized)
    return quantized, len(candidates) - quantized


def speed_check(fp32_voice: TTSModel, int8_voice: TTSModel,
                requests: list[SynthesisRequest]) -> dict[str, float]:
    """Stage-side check: RTF of both graphs, batch 1, median of 3 warm runs, interleaved per sentence.

    Interleaving keeps the two comparable on a machine other work shares; the pipeline's
    evaluation is the real comparison.
    """
    compute_s = {"fp32": 0.0, "int8": 0.0}
    audio_s = 0.0  # of the fp32 audio: RTF per second of the reference's speech
    for request in requests:
        for name, voice in (("fp32", fp32_voice), ("int8", int8_voice)):
            seconds, result = timed_median(lambda: voice.synthesize(request), warm_runs=3, warmup_runs=1, device="cpu")
            compute_s[name] += seconds
            if name == "fp32":
                audio_s += float(result.audio_lengths.sum()) / result.sample_rate_hz
    return {"stage_check_rtf_fp32_b1": compute_s["fp32"] / audio_s,
            "stage_check_rtf_int8_b1": compute_s["int8"] / audio_s,
            "stage_check_speedup_vs_fp32": compute_s["fp32"] / compute_s["int8"]}


def build(source: Variant, settings: Int8OrtSettings, ctx: StageContext, variant_name: str = VARIANT_NAME,
          polyphase_conv_transpose: bool = False) -> Variant:
    """An INT8 variant of the onnxruntime variant ``source``; reuses finished files in ctx.work_dir.

    ``source``: the voice's original graph (``original_onnx`` -> ``int8_ort``), or a graph exported
    in the same contract (``lite_ort`` -> ``lite_int8``).
    ``polyphase_conv_transpose``: first rewrite every ConvTranspose as a polyphase Conv
    (export/rewrites/polyphase_conv_transpose.py; same function), so the upsampling blocks are
    measured and, where they pass, run INT8 (``lite_ort`` -> ``lite_poly_int8``).
    """
    family = family_of(source.model)
    if source.engine != "onnxruntime" or family.reference is None:
        raise ValueError(
            f"int8_onnxruntime.build: source {source.name!r} runs on {source.engine!r} (family {family.name!r}, "
            f"reference runtime: {'yes' if family.reference else 'none'}); give an onnxruntime variant of a "
            "family with a reference runtime (original_onnx, or lite_ort)"
        )
    if family.quantization is None:
        raise ValueError(f"int8_onnxruntime.build: family {family.name!r} registers no quantization layout "
                         "(Family.quantization: how its graph splits into blocks); drop this variant")
    if len(ctx.calibration_sequences) < max(settings.calibration_sentences, settings.sensitivity_sentences,
                                            settings.speed_check_sentences):
        raise ValueError(
            f"StageContext.calibration_sequences holds {len(ctx.calibration_sequences)} sentences; "
            f"Int8OrtSettings asks for calibration_sentences={settings.calibration_sentences}, "
            f"sensitivity_sentences={settings.sensitivity_sentences}, "
            f"speed_check_sentences={settings.speed_check_sentences}"
        )
    work_dir = Path(ctx.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    voice_name = source.model.voice
    graph_sha = file_sha256(source.model.graph_path)
    calibration_texts = [s.text for s in ctx.calibration_sequences[: settings.calibration_sentences]]
    sensitivity_texts = [s.text for s in ctx.calibration_sequences[: settings.sensitivity_sentences]]
    calibration_key = inputs_key(graph_sha, onnxruntime.__version__, settings.calibrator, settings.op_types,
                            calibration_texts, *(["polyphase_conv_transpose"] if polyphase_conv_transpose else []))
    sensitivity_key = inputs_key(calibration_key, settings.per_channel, settings.activation_symmetric,
                            sensitivity_texts, settings.exclude_blocks, settings.sensitivity_blocks)
    model_key = inputs_key(sensitivity_key, dataclasses.asdict(settings))
    model_path = work_dir / f"{variant_name}-{model_key}.onnx"
    manifest_path = work_dir / f"{variant_name}-{model_key}.json"
    sensitivity_json = work_dir / f"sensitivity-{sensitivity_key}.json"
    sensitivity_csv = work_dir / f"sensitivity-{sensitivity_key}.csv"
    artifacts = {"int8_onnx": model_path, "manifest": manifest_path,
                 "sensitivity_json": sensitivity_json, "sensitivity_csv": sensitivity_csv}

    manifest = read_keyed_json(manifest_path, model_key) if model_path.is_file() else None
    if manifest is None:
        manifest = _quantize_voice(source, settings, ctx, work_dir, graph_sha, polyphase_conv_transpose,
                                   calibration_key, sensitivity_key,
                                   model_key, model_path, sensitivity_json, sensitivity_csv)
        write_text_atomic(manifest_path, json.dumps(manifest, indent=1))
    int8_voice = family.reference.load_graph(voice_name, ctx.cpu_threads, model_path)
    return Variant(
        name=variant_name, model=int8_voice, engine="onnxruntime", device="cpu",
        params_m=source.params_m,  # quantization stores the same weights in fewer bits
        size_mb=file_size_mb(model_path),
        stage_metrics=manifest["stage_metrics"], stage_tags=manifest["stage_tags"], artifacts=artifacts,
    )


def _quantize_voice(source: Variant, settings: Int8OrtSettings, ctx: StageContext, work_dir: Path,
                    graph_sha: str, polyphase: bool, calibration_key: str, sensitivity_key: str, model_key: str,
                    model_path: Path, sensitivity_json: Path, sensitivity_csv: Path) -> dict:
    """Calibrate (or reuse the ranges), measure blocks (or reuse the table), quantize; returns the manifest."""
    voice_name = source.model.voice
    family = family_of(source.model)
    reference = family.reference
    original_graph = reference.graph_path(voice_name)
    original = source.model.graph_path == original_graph
    graph_path = (_prepared_graph(reference, original_graph, work_dir, graph_sha) if original
                  else source.model.graph_path)
    conv_transpose = {}
    if polyphase:
        graph_path, conv_transpose = _polyphase_graph(graph_path, work_dir, graph_sha)
    graph = onnx.load(str(graph_path), load_external_data=False)
    blocks = quantizable_blocks(graph, settings.op_types, family.quantization)
    for name in ("exclude_blocks", "sensitivity_blocks"):
        unknown = sorted(set(getattr(settings, name) or []) - set(blocks))
        if unknown:
            raise ValueError(f"Int8OrtSettings.{name}: unknown blocks {unknown}; this graph has {list(blocks)}")
    fp32_voice = reference.load_graph(voice_name, ctx.cpu_threads, graph_path)

    reused = []  # earlier stages whose files were found for these settings (their seconds read 0)
    calibration_cache = work_dir / f"calibration_ranges-{calibration_key}.json"
    calibration_s = 0.0
    if calibration_cache.is_file():
        reused.append("calibration")
    else:
        calibration_requests = sentence_requests(ctx.calibration_sequences[: settings.calibration_sentences], family)
        calibration_s = _calibrate(graph_path, fp32_voice, calibration_requests, settings, calibration_cache)

    sensitivity_requests = sentence_requests(ctx.calibration_sequences[: settings.sensitivity_sentences], family)
    table = read_keyed_json(sensitivity_json, sensitivity_key)
    start = time.perf_counter()
    if table is None:
        rows = _sensitivity(graph_path, blocks, settings, calibration_cache, fp32_voice, reference, voice_name,
                            sensitivity_requests, ctx.cpu_threads, work_dir)
    else:
        rows = table["blocks"]
        reused.append("sensitivity")
    sensitivity_s = time.perf_counter() - start
    for row in rows:
        row["fp32_reason"] = _fp32_reason(row, settings)
    write_sensitivity_table(rows, sensitivity_key, sensitivity_json, sensitivity_csv)

    fp32_blocks = [row["block"] for row in rows if row["fp32_reason"]]
    nodes_to_quantize = [node.name for row in rows if not row["fp32_reason"] for node in blocks[row["block"]]]
    if not nodes_to_quantize:
        raise ValueError(
            f"Int8OrtSettings: every block stays fp32 (max_block_mcd_db={settings.max_block_mcd_db}, "
            f"exclude_blocks={settings.exclude_blocks}); see {sensitivity_csv}"
        )
    start = time.perf_counter()
    _quantize(graph_path, model_path, settings, calibration_cache, nodes_to_quantize)
    quantize_s = time.perf_counter() - start
    quantized_nodes, fp32_nodes = graph_quantization_counts(model_path, settings.op_types)

    int8_voice = reference.load_graph(voice_name, ctx.cpu_threads, model_path)
    final = _degradation(int8_voice, sensitivity_requests,
                         [fp32_voice.synthesize(request) for request in sensitivity_requests])
    speed = speed_check(fp32_voice, int8_voice,
                        sentence_requests(ctx.calibration_sequences[: settings.speed_check_sentences], family))
    stage_metrics = {
        "calibration_s": calibration_s,
        "sensitivity_s": sensitivity_s,
        "quantize_s": quantize_s,
        "quantized_nodes": quantized_nodes,
        "fp32_nodes": fp32_nodes,
        "int8_block_count": len(rows) - len(fp32_blocks),
        "fp32_block_count": len(fp32_blocks),
        # On the sensitivity sentences (calibration set): a sanity check, not the evaluation.
        "stage_check_mcd_vs_fp32_db": final["mcd_db"],
        "stage_check_duration_changes": final["duration_changes"],
        **speed,
    }
    stage_tags = {
        "calibrator": settings.calibrator,
        "per_channel": str(settings.per_channel),
        "activation_type": "int8 symmetric" if settings.activation_symmetric else "uint8 asymmetric",
        "op_types": ",".join(settings.op_types),
        "fp32_blocks": ",".join(fp32_blocks),
        "cpu_threads": str(ctx.cpu_threads),
        "onnxruntime": onnxruntime.__version__,
        "reused": ",".join(reused),
        # node -> "rewritten" (a polyphase Conv, block measured like any Conv) or why it was left
        "conv_transpose_polyphase": json.dumps(conv_transpose) if polyphase else "off",
    }
    return {"key": model_key, "settings": dataclasses.asdict(settings),
            "stage_metrics": stage_metrics, "stage_tags": stage_tags}


def main(argv: list[str] | None = None) -> None:
    """Quantize a voice from the command line and print the stage metrics and the block table."""
    parser = argparse.ArgumentParser(prog="python -m compress.int8_onnxruntime", description=__doc__.split("\n")[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--voice", default=None, help="default: the family's default voice")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)  # the project's CPU figures use 2 threads
    parser.add_argument("--calibrator", default="entropy", choices=sorted(CALIBRATORS))
    parser.add_argument("--op-types", default="Conv,MatMul")
    parser.add_argument("--calibration-sentences", type=int, default=32)
    parser.add_argument("--sensitivity-sentences", type=int, default=4)
    parser.add_argument("--max-block-mcd-db", type=float, default=0.4)
    parser.add_argument("--activation-symmetric", action="store_true")
    parser.add_argument("--per-tensor", action="store_true")
    args = parser.parse_args(argv)
    settings = Int8OrtSettings(
        calibrator=args.calibrator, per_channel=not args.per_tensor, activation_symmetric=args.activation_symmetric,
        op_types=args.op_types.split(","), calibration_sentences=args.calibration_sentences,
        sensitivity_sentences=args.sensitivity_sentences, max_block_mcd_db=args.max_block_mcd_db,
    )
    family = get_family(args.family)
    voice = args.voice or family.default_voice
    if family.reference is None:
        parser.error(f"--family {family.name}: the family ships no graph to quantize (no reference runtime)")
    original = family.reference.load(voice, args.threads)
    source = Variant("original_onnx", original, "onnxruntime", "cpu", original.num_parameters / 1e6,
                     file_size_mb(family.reference.graph_path(voice)))
    sequences = [original.text_to_utterances(text)[0] for text in load_sentences("calibration")]
    ctx = StageContext(calibration_sequences=sequences, work_dir=args.work_dir, cpu_threads=args.threads,
                       cache_dir=args.work_dir, family=family, voice=voice)
    variant = build(source, settings, ctx)
    print(json.dumps({"size_mb": variant.size_mb, **variant.stage_metrics, **variant.stage_tags}, indent=1))
    rows = json.loads(variant.artifacts["sensitivity_json"].read_text())["blocks"]
    for row in rows:
        mcd = "-" if row["mcd_db"] is None else f"{row['mcd_db']:.3f}"
        print(f"{row['block']:28s} {row['nodes']:3d} nodes  mcd {mcd:>6s} dB  "
              f"durations changed {row['duration_changes']}  {row['fp32_reason'] or 'int8'}")


if __name__ == "__main__":
    main()
