"""Turn a Piper voice's ``.onnx`` graph into a ``PiperVits`` state dict and hyperparameters.

Piper exports keep most parameter names as ONNX initializer names, but not all:

* weights that passed through weight norm were folded into anonymous ``onnx::Conv_*`` tensors;
  the Conv node that consumes each one is named after its module (``/flow/flows.0/enc/in_layers.0/Conv``);
* the phoneme embedding can sit under an unrelated name (``sid`` in the joe voice); its Gather
  node is ``/enc_p/emb/Gather``;
* the duration predictor's affine layer stores ``exp(-logs)`` as a folded constant.

So every tensor is named by the node that consumes it, never by its initializer name alone.
Layer counts, widths and kernel sizes come from tensor shapes; strides and dilations, which
shapes cannot tell, come from node attributes.
"""
from __future__ import annotations

import re
from collections import defaultdict

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from models.piper.vits import VitsHyperParams

# Which input of a node holds which parameter.
_PARAM_INPUTS = {"Conv": ("weight", "bias"), "ConvTranspose": ("weight", "bias"), "Gather": ("weight",)}


def _module_path(node_name: str) -> str:
    """'/flow/flows.0/enc/in_layers.0/Conv' -> 'flow.flows.0.enc.in_layers.0'."""
    return ".".join(node_name.strip("/").split("/")[:-1])


def _attribute(node: onnx.NodeProto, name: str):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    raise KeyError(f"node {node.name} has no attribute {name}")


def _rename_to_port(name: str) -> str:
    """Piper module paths -> this port's module paths (only where the structure differs)."""
    # Inference runs the duration flows 7, 5, 3 (flow 1 is dropped by VITS at inference).
    match = re.match(r"dp\.flows\.(\d+)\.(.*)", name)
    if match and match.group(1) != "0":
        return f"dp.spline_flows.{(7 - int(match.group(1))) // 2}.{match.group(2)}"
    if name.startswith("dp.flows.0."):
        return name.replace("dp.flows.0.", "dp.affine.")
    # Residual couplings sit at even indices, flips (no parameters) at odd ones.
    match = re.match(r"flow\.flows\.(\d+)\.(.*)", name)
    if match:
        return f"flow.couplings.{int(match.group(1)) // 2}.{match.group(2)}"
    # HiFi-GAN ResBlock2 names its single conv list "convs"; ResBlock1 "convs1"/"convs2".
    return re.sub(r"^(dec\.resblocks\.\d+)\.convs\.", r"\1.convs1.", name)


def onnx_to_state_dict(model: onnx.ModelProto) -> tuple[VitsHyperParams, dict[str, torch.Tensor]]:
    initializers = {t.name: t for t in model.graph.initializer}
    piper_params: dict[str, np.ndarray] = {}
    strides: dict[str, int] = {}
    dilations: dict[str, int] = {}

    for node in model.graph.node:
        module = _module_path(node.name)
        is_embedding = node.op_type == "Gather" and module in ("enc_p.emb", "emb_g")
        if node.op_type in ("Conv", "ConvTranspose") or is_embedding:
            for input_name, param in zip(node.input[1:] if node.op_type != "Gather" else node.input[:1],
                                         _PARAM_INPUTS[node.op_type]):
                if input_name in initializers and module:
                    piper_params[f"{module}.{param}"] = numpy_helper.to_array(initializers[input_name])
        if node.op_type == "ConvTranspose":
            strides[module] = int(_attribute(node, "strides")[0])
        if node.op_type == "Conv" and module.startswith("dec.resblocks."):
            dilations[module] = int(_attribute(node, "dilations")[0])
        # ElementwiseAffine reverse: (z - m) * exp(-logs); the graph keeps exp(-logs) folded.
        if node.name == "/dp/flows.0/Mul" and node.input[1] in initializers:
            scale = numpy_helper.to_array(initializers[node.input[1]])
            piper_params["dp.flows.0.logs"] = -np.log(scale)
    # Parameters used outside Conv/Gather keep their real names in Piper exports.
    for name, tensor in initializers.items():
        if re.match(r"^(enc_p|dp|flow|dec|emb_g)\.", name) and name not in piper_params:
            piper_params[name] = numpy_helper.to_array(tensor)
    if "enc_p.emb.weight" not in piper_params:
        raise ValueError("no phoneme embedding (/enc_p/emb/Gather) found: is this a Piper VITS voice?")

    state = {_rename_to_port(k): torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in piper_params.items()}
    hp = _hyperparams(state, strides, dilations)
    return hp, state


def _count(state: dict[str, torch.Tensor], pattern: str) -> int:
    indices = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
    return len(indices)


def _hyperparams(state: dict[str, torch.Tensor], strides: dict[str, int], dilations: dict[str, int]) -> VitsHyperParams:
    num_symbols, hidden = state["enc_p.emb.weight"].shape
    rel_k = state["enc_p.encoder.attn_layers.0.emb_rel_k"]  # (1, 2w+1, head_channels)
    n_upsamples = _count(state, r"dec\.ups\.(\d+)\.weight")
    n_resblocks = _count(state, r"dec\.resblocks\.(\d+)\.")
    kernels_per_stage = n_resblocks // n_upsamples
    resblock_kernels, resblock_dilations = [], []
    for j in range(kernels_per_stage):
        resblock_kernels.append(int(state[f"dec.resblocks.{j}.convs1.0.weight"].shape[-1]))
        n_convs = _count(state, rf"dec\.resblocks\.{j}\.convs1\.(\d+)\.weight")
        piper_conv_list = "convs1" if f"dec.resblocks.{j}.convs2.0.weight" in state else "convs"
        resblock_dilations.append(
            tuple(dilations[f"dec.resblocks.{j}.{piper_conv_list}.{i}"] for i in range(n_convs))
        )
    by_layer = defaultdict(int)
    for k in state:
        if m := re.match(r"flow\.couplings\.0\.enc\.in_layers\.(\d+)\.weight", k):
            by_layer[int(m.group(1))] += 1
    num_speakers, speaker_channels = state["emb_g.weight"].shape if "emb_g.weight" in state else (1, 0)
    return VitsHyperParams(
        num_symbols=int(num_symbols),
        hidden_channels=int(hidden),
        filter_channels=int(state["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[0]),
        n_heads=int(hidden // rel_k.shape[-1]),
        n_layers=_count(state, r"enc_p\.encoder\.attn_layers\.(\d+)\."),
        encoder_kernel_size=int(state["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[-1]),
        window_size=int((rel_k.shape[1] - 1) // 2),
        latent_channels=int(state["enc_p.proj.weight"].shape[0] // 2),
        flow_layers=_count(state, r"flow\.couplings\.(\d+)\."),
        flow_wn_layers=len(by_layer),
        flow_kernel_size=int(state["flow.couplings.0.enc.in_layers.0.weight"].shape[-1]),
        dp_filter_channels=int(state["dp.pre.weight"].shape[0]),
        dp_kernel_size=int(state["dp.convs.convs_sep.0.weight"].shape[-1]),
        dp_flows=_count(state, r"dp\.spline_flows\.(\d+)\.") + 1,  # + the flow VITS drops at inference
        spline_bins=int((state["dp.spline_flows.0.proj.weight"].shape[0] + 1) // 3),
        upsample_initial_channel=int(state["dec.conv_pre.weight"].shape[0]),
        upsample_rates=tuple(strides[f"dec.ups.{i}"] for i in range(n_upsamples)),
        upsample_kernel_sizes=tuple(int(state[f"dec.ups.{i}.weight"].shape[-1]) for i in range(n_upsamples)),
        resblock_kernel_sizes=tuple(resblock_kernels),
        resblock_dilations=tuple(resblock_dilations),
        resblock_type="1" if "dec.resblocks.0.convs2.0.weight" in state else "2",
        num_speakers=int(num_speakers),
        speaker_channels=int(speaker_channels),
    )
