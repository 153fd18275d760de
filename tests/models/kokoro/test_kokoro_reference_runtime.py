"""Kokoro's reference runtime (models/kokoro/reference_runtime.py) and INT8 blocks: the shipped int8
graph prepared with a durations output, a graph of Kokoro's contract run in the same runtime as
KokoroVoice speaks, the pipeline settings that use them, and the block names of the exported graph.

    python -m pytest -q tests/models/kokoro/test_kokoro_reference_runtime.py          # seconds
    python -m pytest -q tests/models/kokoro/test_kokoro_reference_runtime.py -m slow  # real graph, tiny export
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from compress.run_config import settings_from_config
from core.config import ConfigError
from models.graph_contract import SYNTHESIZER
from models.interface import SynthesisRequest
from models.kokoro.family import FAMILY
from models.kokoro.onnx_contract import INPUT_NAMES, graph_contracts, kokoro_feeds
from models.kokoro.onnx_runtime import INTERNAL_OUTPUTS, Int8Graph
from models.kokoro.quantization import QUANTIZATION
from models.kokoro.reference_runtime import (
    DURATIONS_OUTPUT,
    KokoroOnnxRuntimeVoice,
    pack_rows,
    prepare_graph,
)
from models.kokoro.release import int8_graph_path, voice_pack
from models.kokoro.sampling import KokoroSampling
from models.kokoro.tiny import tiny_voice
from tests.conftest import compose_config

JAPANESE = ("散歩に行きましょう。", "駅の前に新しい本屋ができたそうです。")


def _graph_with_frames_node(path) -> None:
    """A stand-in for the shipped graph: the shipped inputs and the node whose output is its frames."""
    frames = INTERNAL_OUTPUTS["frames_per_token"]
    tokens = onnx.helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, [1, None])
    audio = onnx.helper.make_tensor_value_info("audio", onnx.TensorProto.FLOAT, [None])
    nodes = [onnx.helper.make_node("Cast", ["tokens"], ["as_float"], to=onnx.TensorProto.FLOAT),  # (1, T)
             onnx.helper.make_node("Clip", ["as_float"], [frames], name="/encoder/Clip"),
             onnx.helper.make_node("Identity", [frames], ["audio"])]
    graph = onnx.helper.make_graph(nodes, "shipped_stand_in", [tokens], [audio])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]), str(path))


def test_prepare_graph_adds_the_durations_output_once(tmp_path):
    path = tmp_path / "stand_in.onnx"
    _graph_with_frames_node(path)
    prepared = prepare_graph(path)
    assert [o.name for o in prepared.graph.output] == ["audio", DURATIONS_OUTPUT]
    assert prepared.graph.output[1].type.tensor_type.elem_type == onnx.TensorProto.INT64
    onnx.checker.check_model(prepared)
    onnx.save(prepared, str(tmp_path / "prepared.onnx"))
    assert [o.name for o in prepare_graph(tmp_path / "prepared.onnx").graph.output] == ["audio", DURATIONS_OUTPUT]


def test_prepare_graph_refuses_another_graph(tmp_path):
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "other",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    onnx.save(onnx.helper.make_model(graph), str(tmp_path / "other.onnx"))
    with pytest.raises(ValueError, match="kokoro-v1.0.int8.onnx"):
        prepare_graph(tmp_path / "other.onnx")
    with pytest.raises(ValueError, match="Kokoro's contract"):
        KokoroOnnxRuntimeVoice("jf_alpha", graph_path=tmp_path / "other.onnx")


def test_family_registers_the_shipped_graph_and_the_int8_blocks():
    assert FAMILY.reference.prepare_graph is prepare_graph
    assert FAMILY.reference.graph_path("jf_alpha") == int8_graph_path()
    assert FAMILY.quantization is QUANTIZATION
    names = {
        "/generator/resblocks.3/convs1.0/Conv": "generator.resblocks.3",
        "/generator/noise_res.1/convs2.2/Conv": "generator.noise_res.1",
        "/model/decoder/generator/ups.1/ConvTranspose": "generator.ups.1",
        "/decode.2/conv1/Conv": "decode.2",
        "/encoder/albert_layer_groups.0/albert_layers.0/ffn/MatMul_3": "encoder",
        "/generator/Conv": "generator",
        "/MatMul_1": "top_level",
    }
    assert {name: QUANTIZATION.block_of(name) for name in names} == names
    with pytest.raises(ValueError, match="not one latent"):
        QUANTIZATION.decoder_latent_channels(tiny_voice(0))


def test_style_rows_are_the_voice_rows():
    """The runtime picks a sentence's style row as KokoroVoice does (row n - 1 for n phonemes)."""
    voice = tiny_voice(0)
    lengths = torch.tensor([3, 2, 40, 600])  # one phoneme, none (row 0), forty, past the pack's 510 rows
    assert torch.equal(pack_rows(voice.style_pack, lengths), voice.style_rows(lengths))


def test_kokoro_ja_keeps_original_onnx_and_checks_the_teacher_graph_variants(tmp_path):
    base = ["model=kokoro_ja", "+experiment=debug_kokoro"]
    settings = settings_from_config(compose_config(tmp_path, base))
    assert settings.variants == ("original_onnx", "teacher", "teacher_ort", "teacher_int8")
    assert (settings.data.eval_set, settings.data.calibration_set) == ("eval_ja", "calibration_ja")
    assert "wer" not in settings.evaluate.metrics
    assert "generator.resblocks.5" in settings.stages["int8_ort"].sensitivity_blocks
    with pytest.raises(ConfigError, match="export.enabled=true"):
        settings_from_config(compose_config(tmp_path, [*base, "export.enabled=false"]))
    with pytest.raises(ConfigError, match="list 'teacher_ort'"):
        settings_from_config(compose_config(tmp_path, [*base, "variants=[teacher,teacher_int8]"]))


@pytest.mark.slow
def test_shipped_graph_speaks_a_batch_as_its_items_alone():
    runtime = FAMILY.reference.load("jf_alpha", 1)
    utterances = [runtime.text_to_utterances(text)[0] for text in JAPANESE]
    batch = runtime.synthesize(SynthesisRequest.from_utterances(utterances))
    graph = Int8Graph(int8_graph_path(), threads=1)
    pack = voice_pack("jf_alpha")
    for item, utterance in enumerate(utterances):
        alone = graph.run(utterance.phoneme_ids, pack[len(utterance.phoneme_ids) - 3].numpy())["audio"]
        length = int(batch.audio_lengths[item])
        assert length == alone.size == int(batch.durations[item].sum()) * runtime.hop_length
        assert np.array_equal(batch.audio[item, :length].numpy(), alone)
        assert not batch.audio[item, length:].any()
        assert (batch.durations[item, : len(utterance.phoneme_ids)] >= 1).all()
        assert not batch.durations[item, len(utterance.phoneme_ids):].any()


@pytest.mark.slow
def test_a_contract_graph_speaks_as_the_voice(exported_once):
    """load_graph on an exported tiny synthesizer: the audio and durations KokoroVoice.synthesize
    gives for a padded batch with the source noise on, and the feeds calibration replays."""
    torch.set_num_threads(1)
    voice = tiny_voice(0)
    path = exported_once(graph_contracts(voice)[SYNTHESIZER])
    runtime = FAMILY.reference.load_graph("jf_alpha", 1, path)
    runtime.style_pack, runtime.hop_length = voice.style_pack, voice.hop_length  # the tiny voice's own
    utterances = [u for text in ("The fox jumps.", "Where did Kenji leave his lantern?") for u in voice.text_to_utterances(text)]
    request = SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling(seed=3))
    got, expected = runtime.synthesize(request), voice.synthesize(request)
    assert torch.equal(got.audio_lengths, expected.audio_lengths)
    assert torch.equal(got.durations, expected.durations)
    assert (got.audio - expected.audio).abs().max() <= 1e-4 * expected.audio.abs().max()
    single = SynthesisRequest.from_utterances(utterances[:1], sampling=KokoroSampling(seed=3))
    feeds = runtime.session_feeds(single)
    assert tuple(feeds) == INPUT_NAMES
    assert all(np.array_equal(feeds[name], value) for name, value in kokoro_feeds(single, voice).items())
