"""INT8 post-training quantization of PyTorch parts with NVIDIA ModelOpt, exported as a Q/DQ graph for TensorRT.

INT8 on the PyTorch side. From the ``teacher`` variant:

1. copy the voice; insert modelopt quantizers into each part in ``parts`` (int8 weights, per output
   channel by default; int8 activations, per tensor; both symmetric: zero point 0, as TensorRT
   requires) and calibrate them on the calibration set (never ``eval`` or ``harvard``), batch 1,
   fixed-seed noise. Each part sees the inputs it sees in synthesis, as the family's
   ``QuantizationLayout.feed_part`` runs the model (a decoder: the latents the voice computes);
2. per-block sensitivity (blocks named by the family's ``QuantizationLayout``, as int8_ort names
   the graph's): with every quantizer calibrated once, enable one block's quantizers
   alone and measure MCD, waveform SNR and changed durations against the fp32 teacher, same noise;
   a block above ``max_block_mcd_db``, one that changes durations, or one matched by
   ``keep_higher_precision`` stays in float32;
3. export the quantized decoder alone as a Q/DQ ONNX graph (``export_decoder(..., dynamo=False)``:
   modelopt's quantizers export only with the TorchScript exporter) and check it against
   TensorRT 10's parser rules (``export.tensorrt_support.readiness_report``).

The variant runs in PyTorch with fake quantization (quantize-dequantize in float32): it shows what
INT8 costs in quality. It is not faster here; speed comes from a TensorRT engine built from the
Q/DQ graph, which needs a GPU. On onnxruntime CPU the same Q/DQ graph is no faster than fp32
(shared/ENV_NOTES.md): the CPU INT8 path is compress/int8_onnxruntime.py.

Measured on the eval set (8 sentences, joe, defaults): 5 of the decoder's 14 blocks run int8
(conv_pre, ups.0, resblocks.0-2: 0.08-0.21 dB each alone; the later, narrower stages put an
8-bit noise floor under the waveform, 0.43-2.5 dB each alone), MCD 0.25 dB against fp32, durations
unchanged, a Q/DQ graph of 16 QuantizeLinear/DequantizeLinear pairs, zero points 0, no TensorRT
blockers. int8_ort keeps the same early decoder blocks in int8, for the same reason.

Calibrators: ``max`` (running absolute max), or a histogram of each activation reduced by
``entropy`` (KL divergence) or ``percentile`` (modelopt's HistogramCalibrator). Weights are always
calibrated by max: a weight is fully known, nothing to clip.

Usage::

    from compress.int8_modelopt import Int8ModeloptSettings, build
    int8 = build(teacher_variant, Int8ModeloptSettings(), ctx)   # -> Variant "int8_modelopt"

    python -m compress.int8_modelopt --family <family> --work-dir outputs/int8_modelopt   # stage metrics, block table

Files in ``ctx.work_dir``, each name carrying the hash of what it depends on, so a rerun with the
same settings reuses it: ``calibrated-<h>-<part>.pth`` (modelopt's saved quantized part),
``sensitivity-<h>.json`` / ``.csv`` (the per-block table, the same format as int8_ort's, which
notebooks/compare_variants.ipynb charts) and ``qdq_decoder-<h>.onnx``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import fnmatch
import hashlib
import io
import json
import logging
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from compress.stage_cache import inputs_key, read_keyed_json, write_sensitivity_table
from compress.variants import StageContext, Variant, check_part_roles, require_parts
from core.atomic_io import atomic_write
from core.config import ConfigError
from evaluate.mcd import mel_cepstral_distortion
from evaluate.memory import parameter_count, state_dict_size_mb
from export.onnx_export import export_decoder
from export.tensorrt_support import readiness_report
from models.family import Family, QuantizationLayout
from models.interface import SynthesisRequest, SynthesisResult, TTSModel, Utterance
from models.precision import synthesize_each, waveform_snr_db
from models.registry import FAMILIES, get_family
from models.sampling import Sampling

VARIANT_NAME = "int8_modelopt"
CALIBRATORS = ("max", "entropy", "percentile")


@dataclass(frozen=True)
class Int8ModeloptSettings:
    """What ``build`` reads; every field is checked here, block names against the model."""

    # max | entropy | percentile. Eval set, 8 sentences, against fp32 (32 calibration sentences,
    # threshold 0.4 dB): percentile 99.99 keeps 5 of 14 decoder blocks int8 at MCD 0.25 dB (SNR 15.8
    # dB); max the same 5 at 0.33 dB (SNR 18.9); entropy 7 blocks at 0.57 dB (SNR 13.6: it clips
    # peaks). Every block int8: 3.1 / 3.5 / 3.0 dB. Calibration: 30 / 40 / 120 s on one thread.
    calibrator: str = "percentile"
    percentile: float = 99.99  # of |activation|, for calibrator=percentile: the range's upper end (modelopt's default)
    per_channel_weights: bool = True  # one scale per output channel (axis 0) of each conv weight
    parts: tuple[str, ...] = ("decoder",)  # of the family's QuantizationLayout.quantizable_parts
    # fnmatch patterns on module names under the family's ``QuantizationLayout.module_root``, kept
    # float32 and not measured: "dec.conv_post", "dec.resblocks.1*".
    keep_higher_precision: tuple[str, ...] = ()
    calibration_sentences: int = 32  # of the calibration set
    sensitivity_sentences: int = 4  # per block; the pass costs blocks x sentences syntheses
    # A block whose int8 version alone moves the audio more than this stays float32 (MCD against
    # the fp32 teacher, same noise; another noise seed is 1.2 dB away, evaluate/mcd.py).
    max_block_mcd_db: float = 0.4
    # Blocks to measure; None measures all. A block not measured is not trusted and stays float32.
    sensitivity_blocks: tuple[str, ...] | None = None
    export_qdq: bool = True  # write the quantized decoder as a Q/DQ ONNX graph and check it for TensorRT

    def __post_init__(self):
        where = "stages.int8_modelopt"
        if self.calibrator not in CALIBRATORS:
            raise ConfigError(f"{where}.calibrator={self.calibrator!r}: use one of {list(CALIBRATORS)}")
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)) \
                or not 0 < self.percentile <= 100:
            raise ConfigError(f"{where}.percentile={self.percentile!r}: must be in (0, 100]")
        for name in ("per_channel_weights", "export_qdq"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{where}.{name}={getattr(self, name)!r}: must be true or false")
        for name in ("parts", "keep_higher_precision", "sensitivity_blocks"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"{where}.{name}={value!r}: give a list, e.g. [{value}]")
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        if not self.parts or len(set(self.parts)) != len(self.parts):
            raise ConfigError(f"{where}.parts={list(self.parts)}: give a non-empty list of part roles without repeats")
        if self.sensitivity_blocks is not None and not self.sensitivity_blocks:
            raise ConfigError(f"{where}.sensitivity_blocks=[]: give block names, or null to measure all")
        for name in ("calibration_sentences", "sensitivity_sentences"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}.{name}={value!r}: must be a positive number of sentences")
        if isinstance(self.max_block_mcd_db, bool) or not isinstance(self.max_block_mcd_db, (int, float)) \
                or not self.max_block_mcd_db >= 0:
            raise ConfigError(f"{where}.max_block_mcd_db={self.max_block_mcd_db!r}: must be >= 0 dB")

    def check_family(self, family: Family) -> None:
        """``parts`` against the family's part roles and the ones it lets INT8 quantize
        (compress/stages.py calls it at start)."""
        where = "stages.int8_modelopt.parts"
        check_part_roles(where, self.parts, family)
        quantizable = quantization_layout(family).quantizable_parts
        unknown = sorted(set(self.parts) - set(quantizable))
        if unknown:
            raise ConfigError(f"{where}={list(self.parts)}: family {family.name!r} quantizes only "
                              f"{list(quantizable)} (unknown: {unknown})")


def quantization_layout(family: Family) -> QuantizationLayout:
    """``family.quantization``; a ConfigError when the family registers none."""
    if family.quantization is None:
        raise ConfigError(f"int8_modelopt: family {family.name!r} registers no quantization layout "
                          "(Family.quantization: its quantizable parts and block names); drop int8_modelopt")
    return family.quantization


def _mtq():
    """modelopt's quantization package, imported on first use: it takes seconds and logs a lot."""
    logging.getLogger("modelopt").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cannot find transformers package": not needed here
        import modelopt.torch.quantization as mtq
    return mtq


def quantize_config(settings: Int8ModeloptSettings) -> dict:
    """modelopt's config: int8 weights and activations of every Conv/ConvTranspose/Linear, symmetric."""
    histogram = settings.calibrator != "max"
    activation = {"num_bits": 8, "axis": None, **({"calibrator": "histogram"} if histogram else {})}
    # ConvTranspose weights are (C_in, C_out, k) and modelopt also scales them along axis 0: that
    # is what TensorRT's deconvolution kernels take (NVIDIA/TensorRT#2380: no per-output-channel
    # scales for ConvTranspose).
    weight = {"num_bits": 8, "axis": 0 if settings.per_channel_weights else None}
    return {
        "quant_cfg": [
            {"quantizer_name": "*", "enable": False},
            {"quantizer_name": "*weight_quantizer", "cfg": weight},
            {"quantizer_name": "*input_quantizer", "cfg": activation},
            {"quantizer_name": "*", "parent_class": "nn.Embedding", "enable": False},  # a lookup, no matmul
        ],
        # "max" calibrates inside mtq.quantize; a histogram's reduction is applied by _calibrate.
        "algorithm": None if histogram else "max",
    }


def _noises(family: Family, count: int) -> list[Sampling]:
    """Sentence i samples from seed i with the family's default options, in every run of this stage."""
    return [family.sampling(seed=i) for i in range(count)]


def _forward_loop(voice: TTSModel, family: Family, role: str, sequences: list[Utterance]):
    """Runs ``voice`` (with the part being calibrated installed) so the part sees real inputs, batch 1."""
    feed_part = quantization_layout(family).feed_part

    def loop(part: nn.Module) -> None:
        for sequence, noise in zip(sequences, _noises(family, len(sequences))):
            feed_part(voice, role, SynthesisRequest.from_utterances([sequence], sampling=noise), part)
    return loop


def _calibrate(voice: nn.Module, family: Family, role: str, settings: Int8ModeloptSettings,
               sequences: list[Utterance]) -> nn.Module:
    """Quantize and calibrate ``voice``'s part ``role`` in place; returns the quantized part."""
    mtq = _mtq()
    from modelopt.torch.quantization import model_calib
    from modelopt.torch.quantization.calib import HistogramCalibrator
    from modelopt.torch.quantization.nn import TensorQuantizer

    part = voice.parts()[role]
    loop = _forward_loop(voice, family, role, sequences)
    with torch.no_grad(), _quiet():
        if settings.calibrator == "max":
            return mtq.quantize(part, quantize_config(settings), loop)
        # mtq's calibration algorithms finish every quantizer with compute_amax() and no method,
        # which a histogram calibrator cannot answer; so: insert, collect, then reduce each
        # histogram with the chosen method (weights keep their max calibrator).
        part = mtq.quantize(part, quantize_config(settings), None)
        model_calib.enable_stats_collection(part)
        model_calib.weight_only_quantize(part)
        loop(part)
        for quantizer in part.modules():
            if not isinstance(quantizer, TensorQuantizer) or quantizer._disabled:
                continue
            if isinstance(quantizer._calibrator, HistogramCalibrator):
                options = {"percentile": settings.percentile} if settings.calibrator == "percentile" else {}
                quantizer.load_calib_amax(settings.calibrator, **options)
            else:
                quantizer.load_calib_amax()
            quantizer.enable_quant()
            quantizer.disable_calib()
    return part


@contextlib.contextmanager
def _quiet():
    """Silence modelopt's prints ("Inserted 69 quantizers") and warnings while it works."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def quantized_blocks(module_root: nn.Module, layout: QuantizationLayout) -> dict[str, dict[str, nn.Module]]:
    """{block: {module name: quantized module}} for every module under ``module_root`` with an
    enabled quantizer, in model order; blocks named by ``layout.module_block``."""
    from modelopt.torch.quantization.nn import QuantModule

    blocks: dict[str, dict[str, nn.Module]] = {}
    for name, module in module_root.named_modules():
        if isinstance(module, QuantModule) and _active_quantizers(module):
            blocks.setdefault(layout.module_block(name), {})[name] = module
    return blocks


def _active_quantizers(module: nn.Module) -> list:
    """The calibrated quantizers of one quantized module (input and weight; disabled ones excluded)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    return [child for child in module.children()
            if isinstance(child, TensorQuantizer) and getattr(child, "_amax", None) is not None]


def _set_int8(blocks: dict[str, dict[str, nn.Module]], int8_blocks: set[str]) -> None:
    """Enable the quantizers of ``int8_blocks``, disable every other block's (float32 passthrough)."""
    for block, modules in blocks.items():
        for module in modules.values():
            for quantizer in _active_quantizers(module):
                quantizer.enable() if block in int8_blocks else quantizer.disable()


def _degradation(voice: nn.Module, sequences: list[Utterance], noises: list[Sampling],
                 references: list[SynthesisResult]) -> dict[str, float | int | None]:
    """MCD (dB, mean and max), waveform SNR (dB, mean where durations agree) and changed durations vs fp32."""
    mcds_db, snrs_db, duration_changes = [], [], 0
    for result, reference in zip(synthesize_each(voice, sequences, noises), references, strict=True):
        changed = int((result.durations != reference.durations).sum())
        duration_changes += changed
        if changed == 0:
            snrs_db.append(waveform_snr_db(result.waveforms()[0], reference.waveforms()[0]))
        mcds_db.append(mel_cepstral_distortion(result.waveforms()[0], reference.waveforms()[0],
                                               sample_rate_hz=reference.sample_rate_hz))
    return {"mcd_db": float(np.mean(mcds_db)), "mcd_max_db": float(np.max(mcds_db)),
            "snr_db": float(np.mean(snrs_db)) if snrs_db else None, "duration_changes": duration_changes}




def _weights_digest(module: nn.Module) -> str:
    """Content hash of a model's float32 weights: which teacher a cached file was made from."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _sensitivity(voice: nn.Module, family: Family, blocks: dict[str, dict[str, nn.Module]], settings: Int8ModeloptSettings,
                 sequences: list[Utterance], references: list[SynthesisResult]) -> list[dict]:
    """One row per block: its degradation when it alone runs int8 (blocks not measured get None)."""
    noises = _noises(family, len(sequences))
    rows = []
    for block, modules in blocks.items():
        op_counts = sorted(Counter(type(module).__name__.removeprefix("Quant") for module in modules.values()).items())
        row = {"block": block, "nodes": len(modules), "op_types": " ".join(f"{op}:{n}" for op, n in op_counts),
               "mcd_db": None, "mcd_max_db": None, "snr_db": None, "duration_changes": None, "seconds": None}
        if _measured(block, modules, settings):
            start = time.perf_counter()
            _set_int8(blocks, {block})
            row.update(_degradation(voice, sequences, noises, references))
            row["seconds"] = time.perf_counter() - start
        rows.append(row)
    return rows


def _kept_by_pattern(modules: dict[str, nn.Module], settings: Int8ModeloptSettings) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for name in modules for pattern in settings.keep_higher_precision)


def _measured(block: str, modules: dict[str, nn.Module], settings: Int8ModeloptSettings) -> bool:
    listed = settings.sensitivity_blocks is None or block in settings.sensitivity_blocks
    return listed and not _kept_by_pattern(modules, settings)


def _fp32_reason(row: dict, modules: dict[str, nn.Module], settings: Int8ModeloptSettings) -> str:
    """Why a block stays float32 ("" when it runs int8). The key name is the one int8_ort's table uses."""
    if _kept_by_pattern(modules, settings):
        return "keep_higher_precision"
    if row["mcd_db"] is None:
        return "not measured"
    if row["mcd_db"] > settings.max_block_mcd_db:
        return f"mcd {row['mcd_db']:.3f} dB > {settings.max_block_mcd_db} dB"
    if row["duration_changes"] > 0:
        return f"{row['duration_changes']} durations changed"
    return ""




def qdq_summary(graph_path: Path) -> dict:
    """Q/DQ node counts of a graph and whether every zero point is 0 (symmetric: what TensorRT accepts)."""
    graph = onnx.load(str(graph_path))
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.graph.initializer}
    for node in graph.graph.node:
        if node.op_type == "Constant":
            constants.update({node.output[0]: numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"})
    qdq = [node for node in graph.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear")]
    zero_points = [constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
                   for node in qdq]
    return {
        "quantize_linear_nodes": sum(node.op_type == "QuantizeLinear" for node in qdq),
        "dequantize_linear_nodes": sum(node.op_type == "DequantizeLinear" for node in qdq),
        # A zero point computed at run time (None here) is not known to be 0.
        "all_zero_points_zero": all(zp is not None and not np.any(zp) for zp in zero_points),
    }


def _int8_size_mb(voice: nn.Module) -> float:
    """State-dict size with every int8 weight at one byte: what an INT8 engine stores, roughly."""
    from modelopt.torch.quantization.nn import QuantModule

    int8_elements = sum(
        module.weight.numel() for module in voice.modules()
        if isinstance(module, QuantModule) and getattr(module, "weight_quantizer", None) is not None
        and module.weight_quantizer.is_enabled and getattr(module.weight_quantizer, "_amax", None) is not None
    )
    return state_dict_size_mb(voice) - int8_elements * 3 / 1e6  # 4 bytes -> 1


def build(teacher: Variant, settings: Int8ModeloptSettings, ctx: StageContext) -> Variant:
    """The ``int8_modelopt`` variant of the PyTorch ``teacher``; reuses finished files in ctx.work_dir."""
    settings.check_family(ctx.family)
    require_parts("int8_modelopt", teacher, ctx.family, settings.parts)
    layout = quantization_layout(ctx.family)
    needed = max(settings.calibration_sentences, settings.sensitivity_sentences)
    if len(ctx.calibration_sequences) < needed:
        raise ValueError(
            f"StageContext.calibration_sequences holds {len(ctx.calibration_sequences)} sentences; "
            f"Int8ModeloptSettings asks for calibration_sentences={settings.calibration_sentences}, "
            f"sensitivity_sentences={settings.sensitivity_sentences}"
        )
    _mtq()
    import modelopt
    import modelopt.torch.opt as mto

    work_dir = Path(ctx.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    # Fake quantization is measured on the CPU, where the calibration ranges are reproducible.
    voice = copy.deepcopy(teacher.model).cpu().eval()
    fp32 = teacher.model if teacher.device == "cpu" else copy.deepcopy(voice)  # the reference, same device
    calibration = ctx.calibration_sequences[: settings.calibration_sentences]
    sensitivity = ctx.calibration_sequences[: settings.sensitivity_sentences]
    calibration_key = inputs_key(_weights_digest(voice), modelopt.__version__, torch.__version__, settings.calibrator,
                            settings.percentile, settings.per_channel_weights, [s.text for s in calibration])
    sensitivity_key = inputs_key(calibration_key, settings.parts, settings.keep_higher_precision,
                            settings.sensitivity_blocks, [s.text for s in sensitivity])
    model_key = inputs_key(sensitivity_key, dataclasses.asdict(settings))
    sensitivity_json = work_dir / f"sensitivity-{sensitivity_key}.json"
    sensitivity_csv = work_dir / f"sensitivity-{sensitivity_key}.csv"

    reused = []  # steps whose files were found for these settings (their seconds read 0)
    calibration_s = 0.0
    for role in (r for r in layout.quantizable_parts if r in settings.parts):
        saved = work_dir / f"calibrated-{calibration_key}-{role}.pth"
        if saved.is_file():
            with _quiet():
                part = mto.restore(voice.parts()[role], str(saved))
            reused.append(f"calibration:{role}")
        else:
            start = time.perf_counter()
            part = _calibrate(voice, ctx.family, role, settings, calibration)
            calibration_s += time.perf_counter() - start
            atomic_write(saved, lambda tmp, part=part: mto.save(part, tmp))
        voice.replace_part(role, part)

    blocks = quantized_blocks(layout.module_root(voice), layout)
    unknown = sorted(set(settings.sensitivity_blocks or ()) - set(blocks))
    if unknown:
        raise ValueError(f"Int8ModeloptSettings.sensitivity_blocks: unknown blocks {unknown}; "
                         f"parts {list(settings.parts)} have {list(blocks)}")
    noises = _noises(ctx.family, len(sensitivity))
    references = synthesize_each(fp32, sensitivity, noises)
    table = read_keyed_json(sensitivity_json, sensitivity_key)
    start = time.perf_counter()
    if table is None:
        rows = _sensitivity(voice, ctx.family, blocks, settings, sensitivity, references)
    else:
        rows = table["blocks"]
        reused.append("sensitivity")
    sensitivity_s = time.perf_counter() - start
    for row in rows:
        row["fp32_reason"] = _fp32_reason(row, blocks[row["block"]], settings)
    write_sensitivity_table(rows, sensitivity_key, sensitivity_json, sensitivity_csv)
    int8_blocks = [row["block"] for row in rows if not row["fp32_reason"]]
    fp32_blocks = [row["block"] for row in rows if row["fp32_reason"]]
    if not int8_blocks:
        raise ValueError(
            f"Int8ModeloptSettings: every block stays float32 (max_block_mcd_db={settings.max_block_mcd_db}, "
            f"keep_higher_precision={list(settings.keep_higher_precision)}); see {sensitivity_csv}"
        )
    _set_int8(blocks, set(int8_blocks))
    final = _degradation(voice, sensitivity, noises, references)

    stage_metrics = {
        "calibration_s": calibration_s,
        "sensitivity_s": sensitivity_s,
        "int8_block_count": len(int8_blocks),
        "fp32_block_count": len(fp32_blocks),
        "int8_module_count": sum(len(blocks[b]) for b in int8_blocks),
        "int8_size_mb_estimate": _int8_size_mb(voice),
        # On the sensitivity sentences (calibration set): a sanity check, not the evaluation.
        "stage_check_mcd_vs_fp32_db": final["mcd_db"],
        "stage_check_duration_changes": final["duration_changes"],
        **({"stage_check_snr_vs_fp32_db": final["snr_db"]} if final["snr_db"] is not None else {}),
    }
    for row in rows:
        if row["mcd_db"] is not None:
            stage_metrics[f"sensitivity_mcd_db.{row['block']}"] = row["mcd_db"]
    stage_tags = {
        "calibrator": settings.calibrator + (f" {settings.percentile}" if settings.calibrator == "percentile" else ""),
        "per_channel_weights": str(settings.per_channel_weights),
        "quantized_parts": ",".join(settings.parts),
        "fp32_blocks": ",".join(fp32_blocks),
        "execution": ("fake quantization in PyTorch on CPU: shows INT8's quality cost, not its speed; "
                      "the speed comes from a TensorRT engine built from the Q/DQ graph (GPU, not run here)"),
        "modelopt": modelopt.__version__,
        "reused": ",".join(reused),
    }
    artifacts = {"sensitivity": sensitivity_json, "sensitivity_csv": sensitivity_csv}
    if settings.export_qdq and layout.qdq_part in settings.parts:
        qdq_path = work_dir / f"qdq_decoder-{model_key}.onnx"
        if qdq_path.is_file():
            reused.append("qdq_export")
            stage_tags["reused"] = ",".join(reused)
        else:
            with _quiet():
                export_decoder(voice.parts()[layout.qdq_part], qdq_path, layout.decoder_latent_channels(voice),
                               dynamo=False)
        readiness = readiness_report(qdq_path)
        summary = qdq_summary(qdq_path)
        stage_metrics.update({
            "qdq_quantize_linear_nodes": summary["quantize_linear_nodes"],
            "qdq_dequantize_linear_nodes": summary["dequantize_linear_nodes"],
            "qdq_all_zero_points_zero": float(summary["all_zero_points_zero"]),
            "qdq_tensorrt_blockers": len(readiness["blockers"]),
        })
        stage_tags["qdq_tensorrt_ready"] = str(readiness["ready"])
        stage_tags["qdq_tensorrt_blocker_list"] = "; ".join(
            f"{b['node']} ({b['op']}): {b['reason']}" for b in readiness["blockers"]) or "none"
        artifacts["qdq_decoder_onnx"] = qdq_path
    else:
        stage_tags["qdq_decoder_onnx"] = "not exported (export_qdq is false or the decoder is not quantized)"
    return Variant(
        name=VARIANT_NAME, model=voice, engine="torch", device="cpu",
        params_m=parameter_count(teacher.model) / 1e6,  # the same weights, stored in fewer bits
        size_mb=state_dict_size_mb(voice),  # of what runs here: float32 weights plus the calibrated ranges
        stage_metrics=stage_metrics, stage_tags=stage_tags, artifacts=artifacts,
    )


def main(argv: list[str] | None = None) -> None:
    """Quantize a voice from the command line and print the stage metrics and the block table."""
    parser = argparse.ArgumentParser(prog="python -m compress.int8_modelopt", description=__doc__.split("\n")[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--voice", default=None, help="default: the family's default voice")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)  # the project's CPU figures use 2 threads
    parser.add_argument("--calibrator", default="percentile", choices=CALIBRATORS)
    parser.add_argument("--percentile", type=float, default=99.99)
    parser.add_argument("--parts", default="decoder")
    parser.add_argument("--calibration-sentences", type=int, default=32)
    parser.add_argument("--sensitivity-sentences", type=int, default=4)
    parser.add_argument("--max-block-mcd-db", type=float, default=0.4)
    args = parser.parse_args(argv)
    from texts import load_sentences

    torch.set_num_threads(args.threads)
    settings = Int8ModeloptSettings(
        calibrator=args.calibrator, percentile=args.percentile, parts=tuple(args.parts.split(",")),
        calibration_sentences=args.calibration_sentences, sensitivity_sentences=args.sensitivity_sentences,
        max_block_mcd_db=args.max_block_mcd_db,
    )
    family = get_family(args.family)
    voice = args.voice or family.default_voice
    teacher_voice = family.load_teacher(voice, args.work_dir / "cache")
    teacher = Variant("teacher", teacher_voice, "torch", "cpu", parameter_count(teacher_voice) / 1e6,
                      state_dict_size_mb(teacher_voice))
    sequences = [teacher_voice.text_to_utterances(text)[0] for text in load_sentences("calibration")]
    ctx = StageContext(calibration_sequences=sequences, work_dir=args.work_dir, cpu_threads=args.threads,
                       cache_dir=args.work_dir / "cache", family=family, voice=voice)
    variant = build(teacher, settings, ctx)
    print(json.dumps({"size_mb": variant.size_mb, **variant.stage_metrics, **variant.stage_tags}, indent=1))
    for row in json.loads(variant.artifacts["sensitivity"].read_text())["blocks"]:
        mcd = "-" if row["mcd_db"] is None else f"{row['mcd_db']:.3f}"
        snr = "-" if row["snr_db"] is None else f"{row['snr_db']:.1f}"
        print(f"{row['block']:28s} {row['nodes']:3d} modules  mcd {mcd:>6s} dB  snr {snr:>5s} dB  "
              f"{row['fp32_reason'] or 'int8'}")


if __name__ == "__main__":
    main()
