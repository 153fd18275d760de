"""Export any family's graph to ONNX from its graph contract (models/graph_contract.py).

    from export.onnx_export import export_graph
    contract = family_of(voice).graph_contracts(voice)["synthesizer"]
    export_graph(contract, "outputs/export/teacher.onnx")

    python -m export.onnx_export --family <family> --voice <voice> --out outputs/export/teacher.onnx

The contract names the inputs and outputs, declares the dynamic axes and may fix the exported
graph up (``postprocess``); the exporter only traces, names nodes and writes atomically.

Exporter: torch's dynamo exporter (opset 18) by default. It keeps data-dependent lengths (a frame
count known only after duration prediction) dynamic where the TorchScript exporter
(``contract.dynamo=False``) would freeze them to the example's value; the TorchScript exporter is
kept for modules that export only with it (modelopt's quantized modules), whose shapes are not
data dependent. ``export_decoder`` exports a decoder part alone with either.

After a dynamo export, nodes are renamed from the exporter's module scopes to TorchScript-style
paths ("/dec/conv_pre/Conv"; a PrecisionIsland's inner ``module`` level is dropped), so node names
match across variants and the family's original graph.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import io
import logging
import warnings
from collections import Counter
from pathlib import Path

import onnx
import torch
from torch import nn

from core.atomic_io import atomic_write
from models.graph_contract import SYNTHESIZER, GraphContract
from models.registry import FAMILIES, get_family
from core.paths import DEFAULT_CACHE_DIR

OPSET = 18  # what torch 2.13's dynamo exporter emits (asking for 17 gives 18)
TORCHSCRIPT_OPSET = 17  # what export_decoder's TorchScript graphs (modelopt Q/DQ) have been exported and checked at


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


def _save(model: onnx.ModelProto, path: Path) -> None:
    atomic_write(path, lambda tmp: onnx.save(model, tmp))


def _dynamic_shapes(contract: GraphContract) -> tuple:
    """torch.export dims by input, one Dim per dimension name so inputs that share a name share a size."""
    dims = {name: torch.export.Dim(name)
            for axes in contract.input_axes.values() for name in axes.values()}
    return tuple(
        {axis: dims[name] for axis, name in contract.input_axes[input_name].items()}
        if input_name in contract.input_axes else None
        for input_name in contract.input_names
    )


def export_graph(contract: GraphContract, path: str | Path, opset: int = OPSET) -> Path:
    """Export ``contract.module`` on its example inputs to ``path``, written atomically.

    Raises what ``contract.postprocess`` raises when the exported graph breaks the family's
    contract (a family's runtime could not run it).
    """
    path = Path(path)
    inputs = tuple(contract.example_inputs.values())
    if not contract.dynamo:
        with torch.no_grad(), _quiet_exporter():
            atomic_write(path, lambda tmp: torch.onnx.export(
                contract.module, inputs, tmp, dynamo=False, opset_version=opset,
                input_names=list(contract.input_names), output_names=list(contract.output_names),
                dynamic_axes={**contract.input_axes, **contract.output_axes},
            ))
        if contract.postprocess is not None:
            model = onnx.load(str(path))
            contract.postprocess(model)
            remove_dead_nodes(model)
            _save(model, path)
        return path
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            contract.module, inputs, dynamo=True, opset_version=opset,
            input_names=list(contract.input_names), output_names=list(contract.output_names),
            dynamic_shapes=_dynamic_shapes(contract), optimize=True, verbose=False,
        )
    model = program.model_proto
    name_nodes_by_module(model)
    if contract.postprocess is not None:
        contract.postprocess(model)
        remove_dead_nodes(model)  # a fix-up that renames outputs leaves nodes no output needs
    _save(model, path)
    return path


class _DecoderWrapper(nn.Module):
    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, z):
        return self.decoder(z)  # (B, C_lat, T_frames) -> (B, 1, T_audio)


def decoder_contract(decoder: nn.Module, latent_channels: int, dynamo: bool = True,
                     example_frames: int = 32) -> GraphContract:
    """A decoder part alone: ``z`` (B, C_lat, T_frames) -> ``audio`` (B, 1, T_audio), dynamic B and T."""
    z = torch.randn(2, latent_channels, example_frames, generator=torch.Generator().manual_seed(0))
    return GraphContract(
        module=_DecoderWrapper(decoder).eval(),
        example_inputs={"z": z.to(next(decoder.parameters()).device)},
        output_names=("audio",),
        input_axes={"z": {0: "batch_size", 2: "frames"}},
        output_axes={"audio": {0: "batch_size", 2: "samples"}},
        audio_output="audio",
        dynamo=dynamo,
    )


def export_decoder(decoder: nn.Module, path: str | Path, latent_channels: int, dynamo: bool = True,
                   opset: int | None = None, example_frames: int = 32) -> Path:
    """Export a decoder part alone (``decoder_contract``); ``opset`` defaults to OPSET for dynamo and
    TORCHSCRIPT_OPSET for ``dynamo=False``, the TorchScript exporter modelopt's quantized modules
    export with. The decoder has no data-dependent shapes, so its axes stay dynamic either way.
    """
    opset = opset if opset is not None else (OPSET if dynamo else TORCHSCRIPT_OPSET)
    return export_graph(decoder_contract(decoder, latent_channels, dynamo, example_frames), path, opset)


def main(argv: list[str] | None = None) -> None:
    """Export a family's teacher: ``python -m export.onnx_export --family <family> --out teacher.onnx``."""
    parser = argparse.ArgumentParser(prog="python -m export.onnx_export", description=__doc__.split("\n")[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--voice", help="default: the family's default voice")
    parser.add_argument("--graph", default=SYNTHESIZER, help="which of the family's graphs to export")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="converted voice weights")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    family = get_family(args.family)
    if family.graph_contracts is None:
        parser.error(f"family {family.name} exports no ONNX graph")
    model = family.load_teacher(args.voice or family.default_voice, args.cache_dir)
    contracts = family.graph_contracts(model)
    if args.graph not in contracts:
        parser.error(f"--graph {args.graph!r}: family {family.name} has {sorted(contracts)}")
    path = export_graph(contracts[args.graph], args.out)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
