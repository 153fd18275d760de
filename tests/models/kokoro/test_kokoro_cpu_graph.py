"""Kokoro's CPU graph (models/kokoro/cpu_graph.py) and the float32-statistics variant: the fused
AdaIN + Snake residual block computes the original block, a padded item decodes as it would alone,
and the exported "float32" and "cpu" graphs hold no float64 tensor (TensorRT builds neither) and
speak as their modules in onnxruntime. Tiny weights; the exports are marked slow."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from models.kokoro.cpu_graph import FusedAdaINResBlock1, cpu_model
from models.kokoro.layers import AdaINResBlock1, set_statistics_dtype
from models.kokoro.onnx_contract import (
    GRAPH_VARIANTS,
    graph_model,
    synthesizer_contract,
)
from models.kokoro.tiny import tiny_voice

STYLE_DIM = 128


def _block(seed: int = 0) -> AdaINResBlock1:
    torch.manual_seed(seed)
    block = AdaINResBlock1(channels=16, kernel_size=5, dilations=(1, 3, 5), style_dim=STYLE_DIM).eval()
    with torch.no_grad():
        for alpha in [*block.alpha1, *block.alpha2]:
            alpha.uniform_(0.3, 3.0)  # trained Snake alphas are not 1: the fold into the conv must hold
    return block


@pytest.mark.parametrize("masked", [False, True], ids=["whole", "padded"])
def test_fused_block_computes_the_block(masked):
    block = set_statistics_dtype(_block(), torch.float32)
    fused = FusedAdaINResBlock1(block).eval()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 50, generator=generator) + 0.5  # a mean away from zero: E[x^2] - E[x]^2 must hold
    style = torch.randn(2, STYLE_DIM, generator=generator)
    mask = (torch.arange(50) < torch.tensor([[50], [31]])).unsqueeze(1).float() if masked else None  # (B, 1, T)
    with torch.no_grad():
        expected, got = block(x, style, mask), fused(x, style, mask)
    assert torch.allclose(got, expected, atol=2e-5 * expected.abs().max().item())
    if masked:
        assert not got[1, :, 31:].any()  # zero past the item's end, as the original block


def test_cpu_model_speaks_as_the_model_and_a_padded_item_as_alone():
    voice = tiny_voice(0)
    ids = torch.randint(1, 170, (2, 12), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 0
    ids[0, -1] = ids[1, 8] = 0
    ids[1, 9:] = 0
    lengths = torch.tensor([12, 9])
    style = voice.style_rows(lengths)
    fast = cpu_model(voice.model)
    with torch.no_grad():
        reference = voice.model.forward_with_tokens(ids, style, lengths=lengths)
        batch = fast.forward_with_tokens(ids, style, lengths=lengths)
        alone = fast.forward_with_tokens(ids[1:, :9], style[1:], lengths=lengths[1:])
    assert torch.equal(batch.frames_per_token, reference.frames_per_token)
    # Random tiny weights make near-constant channels, where float32 statistics move the output
    # most; measured 5e-3 of peak here (real weights: 102-105 dB SNR, docs/results/cpu_8_kokoro_cpu.json).
    assert (batch.audio - reference.audio).abs().max() <= 1e-2 * reference.audio.abs().max()
    samples = alone.audio.shape[1]
    assert (batch.audio[1, :samples] - alone.audio[0]).abs().max() <= 1e-4 * alone.audio.abs().max()
    assert not batch.audio[1, samples:].any()
    assert voice.model.decoder.generator.resblocks[0].__class__ is AdaINResBlock1  # the voice's model untouched


def test_statistics_dtype_and_graph_variant_are_checked():
    with pytest.raises(ValueError, match="float16"):
        set_statistics_dtype(copy.deepcopy(_block()), torch.float16)
    with pytest.raises(ValueError, match="tensorrt"):
        graph_model(tiny_voice(0).model, "tensorrt")


@pytest.mark.slow
@pytest.mark.parametrize("variant", [v for v in GRAPH_VARIANTS if v != "reference"])
def test_float32_variants_export_without_float64_and_run_as_their_module(variant, exported_once):
    torch.set_num_threads(1)
    contract = synthesizer_contract(tiny_voice(0), variant)
    path = exported_once(contract)  # "cpu", the family's default, is read by other files too
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    tensors = [*graph.input, *graph.output, *graph.value_info]
    assert not [t.name for t in tensors if t.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE]
    assert not [t.name for t in graph.initializer if t.data_type == onnx.TensorProto.DOUBLE]
    assert not [n.name for n in graph.node for a in n.attribute if a.name == "to" and a.i == onnx.TensorProto.DOUBLE]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: tensor.numpy() for name, tensor in contract.example_inputs.items()})
    with torch.no_grad():
        audio, lengths, durations = (t.numpy() for t in contract.module(*contract.example_inputs.values()))
    assert np.abs(got[0] - audio).max() <= 1e-4 * np.abs(audio).max()
    assert np.array_equal(got[1], lengths) and np.array_equal(got[2], durations)
