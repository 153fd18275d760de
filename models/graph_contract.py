"""What a family's ONNX graph looks like, stated once, so one exporter and one parity check serve
every family: the module to trace, its named example inputs, the names and dynamic axes of its
inputs and outputs, how a SynthesisRequest becomes the graph's feeds, and a fix-up of the
exported graph.

A family registers ``graph_contracts(model) -> {graph name: GraphContract}`` (models/family.py):
one end-to-end graph is named ``SYNTHESIZER``; an autoregressive family states several
(``prefill``, ``decode_step``, ``decoder``), each exported on its own.

    contract = family_of(voice).graph_contracts(voice)[SYNTHESIZER]
    export_graph(contract, "fp16.onnx")          # export/onnx_export.py
    session.run(None, contract.feeds(request))   # the same inputs the model saw
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
import torch
from torch import nn

from models.interface import SynthesisRequest, VoiceCondition

SYNTHESIZER = "synthesizer"  # the name of a family's one end-to-end graph (text ids in, audio out)
# Graph metadata (ModelProto.metadata_props) a rewrite that removes ConvTranspose nodes leaves behind:
# a JSON {node name: stride} of what it replaced (export/rewrites/polyphase_conv_transpose.py), so a
# runtime that reads a voice's hop from the upsampling strides still finds them.
REWRITTEN_CONV_TRANSPOSE_STRIDES = "rewritten_conv_transpose_strides"

AxisNames = dict[int, str]  # axis index -> dimension name, shared by every tensor that has it


@dataclass(frozen=True)
class GraphContract:
    """One graph of a family: everything the exporter, parity and serving need to agree on."""

    module: nn.Module  # tensor-only forward, in eval mode, on the CPU
    example_inputs: dict[str, torch.Tensor]  # by input name, in the order ``module.forward`` takes them
    output_names: tuple[str, ...]
    # Dynamic axes by tensor name; a name missing here is static. Dimension names are the ones the
    # TensorRT profile ranges use (engine.tensorrt.axis_ranges).
    input_axes: dict[str, AxisNames] = field(default_factory=dict)
    output_axes: dict[str, AxisNames] = field(default_factory=dict)  # read by the TorchScript exporter only
    # request -> graph inputs by name; None for a part exported alone (a decoder fed latents).
    feeds: Callable[[SynthesisRequest], dict[str, np.ndarray]] | None = None
    audio_output: str | None = None  # the output holding the waveform, (B, ..., T_audio)
    durations_output: str | None = None  # frames per phoneme id, (B, ..., T_text), where the graph has them
    # Conditioning that checks (simplify, parity) put on their batch-1 requests: a multi-speaker
    # voice needs a speaker id; None for a voice that takes none.
    example_voice: VoiceCondition | None = None
    # Edits the exported graph in place (expose an inner tensor as an output, check the hop).
    postprocess: Callable[[onnx.ModelProto], None] | None = None
    rewrites: tuple[str, ...] = ()  # export rewrites already applied to ``module``, for the report
    # The dynamo exporter keeps data-dependent lengths dynamic; the TorchScript one is the only one
    # some quantized modules (modelopt) export with, and freezes data-dependent shapes.
    dynamo: bool = True

    def __post_init__(self):
        unknown = sorted((set(self.input_axes) - set(self.example_inputs))
                         | (set(self.output_axes) - set(self.output_names)))
        if unknown:
            raise ValueError(f"dynamic axes name tensors the graph does not have: {unknown}; inputs "
                             f"{list(self.example_inputs)}, outputs {list(self.output_names)}")
        for role in (self.audio_output, self.durations_output):
            if role is not None and role not in self.output_names:
                raise ValueError(f"output {role!r} is not among the graph's outputs {list(self.output_names)}")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.example_inputs)
