"""Export any PyTorch Piper variant to ONNX with Piper's input contract and dynamic batch and lengths.

    from export.onnx_export import export_piper
    export_piper(PiperVoice.load("bundled:joe"), "outputs/export/teacher.onnx")

    python -m export.onnx_export --voice bundled:joe --out outputs/export/teacher.onnx

The graph takes Piper's inputs, ``input`` (B, T_text) int64, ``input_lengths`` (B,) int64,
``scales`` (3,) float32 = [noise_scale, length_scale, noise_scale_w] and ``sid`` (B,) int64 for
multi-speaker voices, plus the explicit standard-normal noise ``duration_noise`` (B, 2, T_text)
and ``prior_noise`` (B, C_lat, T_frames_max). Outputs: ``output`` (B, 1, 1, T_audio) like Piper's
graphs, and ``durations`` (B, 1, T_text) float32 frames per phoneme, the output of the graph's one
``Ceil``, as ``models.piper.onnx_runtime.prepare_graph`` exposes it for the original voice. So
``PiperOnnxRuntimeVoice(voice, graph_path=...)`` runs an exported graph unchanged.

Exporter: torch's dynamo exporter (opset 18). The frame count is data dependent; PiperVits states
it as an unbacked symbol (models/piper/vits.py), which keeps T_frames dynamic. The TorchScript
exporter (``dynamo=False``) would freeze it to the example's value, so the full synthesizer is
never exported that way; ``export_decoder`` (no data-dependent shapes) offers both, because
modelopt's quantized modules export only with ``dynamo=False``.

After export, nodes are renamed from the exporter's module scopes to TorchScript-style paths
("/dec/conv_pre/Conv"; a PrecisionIsland's inner ``module`` level is dropped), so node names
match across variants and the original Piper graph.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import io
import logging
import math
import warnings
from collections import Counter
from pathlib import Path

import onnx
import torch
from torch import nn

from core.atomic_io import atomic_write
from models.piper.vits import PiperVits

OPSET = 18  # what torch 2.13's dynamo exporter emits (asking for 17 gives 18)
INPUT_NAMES = ("input", "input_lengths", "scales", "duration_noise", "prior_noise")
OUTPUT_NAMES = ("output", "durations")
# Example shapes for tracing; the graph is dynamic in all of them. Batch 2 with unequal lengths:
# torch.export specializes a dimension whose example size is 1.
EXAMPLE_TEXT_LENGTHS = (24, 17)
EXAMPLE_FRAMES_PER_ID = 16  # VitsSampling.max_frames_per_phoneme_id


def piper_vits_of(voice_or_vits) -> PiperVits:
    """The PiperVits inside a PiperVoice (``.model``), or the PiperVits itself."""
    vits = getattr(voice_or_vits, "model", voice_or_vits)
    if not isinstance(vits, PiperVits):
        raise TypeError(f"export_piper needs a PiperVoice or PiperVits, got {type(voice_or_vits).__name__}")
    return vits


class PiperExportWrapper(nn.Module):
    """Tensor-only forward with Piper's graph contract (module docstring)."""

    def __init__(self, vits: PiperVits):
        super().__init__()
        self.vits = vits

    def forward(self, input, input_lengths, scales, duration_noise, prior_noise, sid=None):  # noqa: A002 (Piper's name)
        audio, _, durations = self.vits(input, input_lengths, duration_noise, prior_noise,
                                        scales[0], scales[1], scales[2], sid)
        return audio.unsqueeze(1).unsqueeze(1), durations  # (B, 1, 1, T_audio), (B, T_text)


def example_inputs(vits: PiperVits, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Deterministic tracing inputs by graph input name: batch 2, unequal text lengths."""
    hp = vits.hp
    generator = torch.Generator().manual_seed(0)
    batch, text_length = len(EXAMPLE_TEXT_LENGTHS), max(EXAMPLE_TEXT_LENGTHS)
    ids = torch.randint(1, hp.num_symbols, (batch, text_length), generator=generator)  # (B, T_text)
    lengths = torch.tensor(EXAMPLE_TEXT_LENGTHS, dtype=torch.long)
    ids = ids * (torch.arange(text_length) < lengths.unsqueeze(1))
    inputs = {
        "input": ids,
        "input_lengths": lengths,
        "scales": torch.tensor([0.667, 1.0, 0.8]),
        "duration_noise": torch.randn(batch, 2, text_length, generator=generator),
        "prior_noise": torch.randn(batch, hp.latent_channels, text_length * EXAMPLE_FRAMES_PER_ID, generator=generator),
    }
    if hp.num_speakers > 1:
        inputs["sid"] = torch.arange(batch) % hp.num_speakers
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def _dynamic_shapes(input_names: list[str]) -> tuple:
    batch = torch.export.Dim("batch_size")
    phonemes = torch.export.Dim("phonemes")
    frames = torch.export.Dim("frames")
    axes = {
        "input": {0: batch, 1: phonemes},
        "input_lengths": {0: batch},
        "scales": None,
        "duration_noise": {0: batch, 2: phonemes},
        "prior_noise": {0: batch, 2: frames},
        "sid": {0: batch},
    }
    return tuple(axes[name] for name in input_names)


@contextlib.contextmanager
def _quiet_exporter():
    """The dynamo exporter prints progress lines and warns about torchvision; keep the caller's log readable."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _module_path(node: onnx.NodeProto) -> list[str] | None:
    """Attribute names from the wrapper down to the module that emitted ``node`` (dynamo exporter metadata)."""
    metadata = {prop.key: prop.value for prop in node.metadata_props}
    if "pkg.torch.onnx.name_scopes" not in metadata:
        return None
    scopes = ast.literal_eval(metadata["pkg.torch.onnx.name_scopes"])  # ['', 'vits', 'vits.dec', ..., op]
    classes = ast.literal_eval(metadata.get("pkg.torch.onnx.class_hierarchy", "[]"))
    path = []
    for depth in range(2, len(scopes) - 1):  # skip the root, the wrapper's own attribute and the op itself
        component = scopes[depth].split(".")
        parent = scopes[depth - 1].split(".") if scopes[depth - 1] else []
        name = ".".join(component[len(parent):])
        parent_class = classes[depth - 1] if depth - 1 < len(classes) else ""
        if name == "module" and parent_class.endswith("PrecisionIsland"):
            continue  # a precision island is transparent: its part keeps the fp32 part's node names
        # A part entered through a method other than forward ("reverse") skips a scope level:
        # "spline_flows.0.pre" is two modules, "spline_flows.0" and "pre".
        for token in name.split("."):
            if token.isdigit() and path:
                path[-1] += f".{token}"
            else:
                path.append(token)
    return path


def name_nodes_by_module(model: onnx.ModelProto) -> None:
    """Rename nodes "/dec/ups.0/ConvTranspose" from the exporter's module scopes; unique names kept unique."""
    seen: Counter = Counter()
    for node in model.graph.node:
        path = _module_path(node)
        if path is None:
            continue
        base = "/" + "/".join([*path, node.op_type]) if path else f"/{node.op_type}"
        node.name = base if seen[base] == 0 else f"{base}_{seen[base]}"
        seen[base] += 1


def remove_dead_nodes(model: onnx.ModelProto) -> int:
    """Drop nodes no graph output depends on; returns how many were dropped."""
    needed = {output.name for output in model.graph.output}
    kept = []
    for node in reversed(model.graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    removed = len(model.graph.node) - len(kept)
    del model.graph.node[:]
    model.graph.node.extend(reversed(kept))
    used = {name for node in model.graph.node for name in node.input}
    initializers = [t for t in model.graph.initializer if t.name in used or t.name in needed]
    del model.graph.initializer[:]
    model.graph.initializer.extend(initializers)
    return removed


def expose_ceil_as_durations(model: onnx.ModelProto) -> None:
    """Make the one ``Ceil`` (frames per phoneme, (B, 1, T_text) float) the ``durations`` output."""
    ceil_nodes = [node for node in model.graph.node if node.op_type == "Ceil"]
    if len(ceil_nodes) != 1:
        raise ValueError(f"expected exactly one Ceil node (the duration rounding), found {len(ceil_nodes)}")
    ceil_output = ceil_nodes[0].output[0]
    unused = "durations_int64"
    for node in model.graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                if name == "durations":
                    names[i] = unused
                elif name == ceil_output:
                    names[i] = "durations"
    outputs = [output for output in model.graph.output if output.name != "durations"]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("durations", onnx.TensorProto.FLOAT, ["batch_size", 1, "phonemes"])
    )
    remove_dead_nodes(model)


def convtranspose_hop(model: onnx.ModelProto) -> int:
    """Samples per frame as PiperOnnxRuntimeVoice reads it: the product of the ConvTranspose strides."""
    return int(math.prod(
        onnx.helper.get_attribute_value(attr)[0]
        for node in model.graph.node if node.op_type == "ConvTranspose"
        for attr in node.attribute if attr.name == "strides"
    ))


def _save(model: onnx.ModelProto, path: Path) -> None:
    atomic_write(path, lambda tmp: onnx.save(model, tmp))


def export_piper(voice_or_vits, path: str | Path, opset: int = OPSET) -> Path:
    """Export a Piper variant (PiperVoice or PiperVits, any parts) to ``path``, written atomically.

    The model runs on the CPU for export (a copy if it lives elsewhere); it is not modified.
    Raises ValueError when the graph would not run in PiperOnnxRuntimeVoice (no single Ceil, or a
    decoder whose ConvTranspose strides do not multiply to the hop length).
    """
    vits = piper_vits_of(voice_or_vits)
    if next(vits.parameters()).device.type != "cpu":
        vits = copy.deepcopy(vits).cpu()
    wrapper = PiperExportWrapper(vits).eval()
    inputs = example_inputs(vits)
    names = list(inputs)
    with torch.no_grad():
        example_audio, example_durations = wrapper(*inputs.values())
    frames = int(example_durations.sum(dim=1).clamp_min(1).max())
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            wrapper, tuple(inputs.values()), dynamo=True, opset_version=opset,
            input_names=names, output_names=list(OUTPUT_NAMES),
            dynamic_shapes=_dynamic_shapes(names), optimize=True, verbose=False,
        )
    model = program.model_proto
    name_nodes_by_module(model)
    expose_ceil_as_durations(model)
    hop_samples = example_audio.shape[-1] // frames
    if convtranspose_hop(model) != hop_samples:
        raise ValueError(
            f"the decoder makes {hop_samples} samples per frame but its ConvTranspose strides multiply to "
            f"{convtranspose_hop(model)}: PiperOnnxRuntimeVoice reads the hop from those strides"
        )
    path = Path(path)
    _save(model, path)
    return path


class _DecoderWrapper(nn.Module):
    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, z):
        return self.decoder(z)  # (B, C_lat, T_frames) -> (B, 1, T_audio)


def export_decoder(decoder: nn.Module, path: str | Path, latent_channels: int, dynamo: bool = True,
                   opset: int = OPSET, example_frames: int = 32) -> Path:
    """Export a decoder part alone: ``z`` (B, C_lat, T_frames) -> ``audio`` (B, 1, T_audio), dynamic B and T.

    ``dynamo=False`` uses the TorchScript exporter, the only one modelopt's quantized modules
    export with; the decoder has no data-dependent shapes, so its axes stay dynamic either way.
    """
    wrapper = _DecoderWrapper(decoder).eval()
    z = torch.randn(2, latent_channels, example_frames, generator=torch.Generator().manual_seed(0))
    z = z.to(next(decoder.parameters()).device)
    path = Path(path)
    with torch.no_grad(), _quiet_exporter():
        if dynamo:
            program = torch.onnx.export(
                wrapper, (z,), dynamo=True, opset_version=opset, input_names=["z"], output_names=["audio"],
                dynamic_shapes=({0: torch.export.Dim("batch_size"), 2: torch.export.Dim("frames")},),
            )
            model = program.model_proto
            name_nodes_by_module(model)
            _save(model, path)
        else:
            atomic_write(path, lambda tmp: torch.onnx.export(
                wrapper, (z,), tmp, dynamo=False, opset_version=17, input_names=["z"], output_names=["audio"],
                dynamic_axes={"z": {0: "batch_size", 2: "frames"}, "audio": {0: "batch_size", 2: "samples"}},
            ))
    return path


def main(argv: list[str] | None = None) -> None:
    """Export a voice's PyTorch port: ``python -m export.onnx_export --voice bundled:joe --out teacher.onnx``."""
    from models.piper.voice import PiperVoice

    parser = argparse.ArgumentParser(prog="python -m export.onnx_export", description=__doc__.split("\n")[0])
    parser.add_argument("--voice", default="bundled:joe")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    path = export_piper(PiperVoice.load(args.voice), args.out)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
