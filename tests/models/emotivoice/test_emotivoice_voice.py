"""An EmotiVoice voice through the TTSModel interface on tiny random weights: front end, prompts
and their cache, speakers, masked batches, refusals, the released file layout, and the ONNX graph."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml

from models.emotivoice.family import FAMILY
from models.emotivoice.symbols import synthetic_tokenlist
from models.emotivoice.tiny import TINY_BERT, tiny_voice
from models.emotivoice.voice_files import EmotiVoiceFiles, load_voice
from models.graph_contract import SYNTHESIZER
from models.interface import (
    SynthesisRequest,
    TTSModel,
    UnspeakableTextError,
    VoiceCondition,
)


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


def _request(voice, text, **condition):
    return SynthesisRequest.from_utterances(voice.text_to_utterances(text), voice=VoiceCondition(**condition))


def test_family_entry_matches_the_model(voice):
    assert isinstance(voice, TTSModel)
    assert voice.family == FAMILY.name and voice.capabilities == FAMILY.capabilities
    assert tuple(voice.parts()) == FAMILY.part_roles
    assert FAMILY.sampling_type.deterministic() == FAMILY.sampling_type()


def test_mandarin_and_english_sentences_become_token_ids(voice):
    utterances = voice.text_to_utterances("我来到北京，清华大学。The quick brown fox jumps.")
    assert [u.text for u in utterances] == ["我来到北京，清华大学。", "The quick brown fox jumps."]
    assert " ".join(utterances[0].phonemes) == ("<sos/eos> uo3 sp1 l ai2 sp0 d ao4 sp1 b ei3 sp0 j ing1 sp3 "
                                                "q ing1 sp0 h ua2 sp0 d a4 sp0 x ve2 <sos/eos>")
    assert utterances[1].phonemes[:4] == ("<sos/eos>", "[DH]", "[AH0]", "engsp1")
    tokens = voice.frontend.tokens
    assert all(tokens[i] == p for u in utterances for i, p in zip(u.phoneme_ids, u.phonemes))
    with pytest.raises(UnspeakableTextError):
        voice.text_to_utterances(" … ")


def test_prompts_are_cached_and_batched(voice):
    voice.prompts.clear()
    before = voice.prompts.calls
    first = voice.synthesize(_request(voice, "今天天气很好。Let us go.", emotion="开心"))
    assert voice.prompts.calls == before + 2  # the prompt, then both sentences in one BERT call
    again = voice.synthesize(_request(voice, "今天天气很好。Let us go.", emotion="happy"))
    assert voice.prompts.calls == before + 2 and torch.equal(first.audio, again.audio)
    sad = voice.synthesize(_request(voice, "今天天气很好。Let us go.", prompt="悲伤"))
    assert not torch.equal(first.audio, sad.audio)


def test_speakers_change_the_voice_and_bad_conditions_are_refused(voice):
    one, two = (voice.synthesize(_request(voice, "Hello there.", speaker_id=torch.tensor([s]))) for s in (1, 2))
    assert not torch.equal(one.audio, two.audio)
    for condition, message in (({"speaker_id": torch.tensor([99])}, "speaker_id"),
                               ({"emotion": "sleepy"}, "emotion 'sleepy'"),
                               ({"emotion": "开心", "prompt": "悲伤"}, "not both"),
                               ({"reference_embedding": torch.zeros(1, 4)}, "reference_embedding")):
        with pytest.raises(ValueError, match=message):
            voice.synthesize(_request(voice, "Hello there.", **condition))
    assert voice.speaker_index("3") == 3


def test_batch_rows_equal_single_runs(voice):
    request = _request(voice, "The quick brown fox jumps. 今天天气很好，我们去公园散步吧。", emotion="惊讶")
    batch = voice.synthesize(request)
    for row, utterance in enumerate(voice.text_to_utterances("The quick brown fox jumps. 今天天气很好，我们去公园散步吧。")):
        alone = voice.synthesize(SynthesisRequest.from_utterances([utterance], voice=VoiceCondition(emotion="惊讶")))
        assert torch.equal(batch.durations[row, : len(utterance.phoneme_ids)], alone.durations[0])
        torch.testing.assert_close(batch.waveforms()[row], alone.waveforms()[0], atol=1e-6, rtol=0)
        assert batch.audio_lengths[row] == alone.durations.sum() * voice.hop_length


def test_length_scale_slows_speech(voice):
    utterances = voice.text_to_utterances("Hello there.")
    normal, slow = (voice.synthesize(SynthesisRequest.from_utterances(
        utterances, sampling=FAMILY.sampling(length_scale=scale))) for scale in (1.0, 2.0))
    assert slow.audio_lengths[0] == 2 * normal.audio_lengths[0]


def test_released_file_layout_loads_and_speaks(voice, tmp_path):
    """The tiny voice written as the release writes its files (legacy weight-norm names, module.
    prefixes, position_ids) loads through the user's path and speaks as the original."""
    state = {}
    for key, value in voice.generator.state_dict().items():  # the voice holds its vocoder folded
        if key.startswith("generator.") and key.endswith(".weight"):  # every vocoder conv: weight norm, dim 0
            stem = key.removesuffix(".weight")
            state[f"{stem}.weight_g"] = torch.linalg.vector_norm(value, dim=(1, 2), keepdim=True)
            state[f"{stem}.weight_v"] = value
        else:
            state[key] = value
    torch.save({"generator": state}, tmp_path / "g_00140000")
    config = voice.generator.config
    yaml_config = {"n_mels": config.n_mels, "sr": config.sample_rate_hz, "hop_length": config.hop_length, "model": {
        "encoder_n_layers": 2, "encoder_n_heads": 2, "encoder_n_hidden": 32, "encoder_kernel_size_conv_mod": 3,
        "decoder_n_layers": 2, "decoder_n_heads": 2, "decoder_n_hidden": 32, "decoder_kernel_size_conv_mod": 3,
        "variance_n_hidden": 24, "variance_n_layers": 2, "variance_kernel_size": 3, "variance_embed_kernel_size": 9,
        "duration_n_layers": 2, "duration_kernel_size": 3, "bert_embedding": 32, "initial_channel": 80,
        "upsample_initial_channel": 32, "upsample_rates": [4, 4], "upsample_kernel_sizes": [8, 8], "resblock": "1",
        "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]]}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(yaml_config))
    style = {"module.bert.embeddings.position_ids": torch.arange(TINY_BERT["max_position_embeddings"])[None],
             **{f"module.{key}": value for key, value in voice.style_encoder.state_dict().items()}}
    torch.save({"model": style}, tmp_path / "checkpoint_163431")
    (tmp_path / "config.json").write_text(voice.style_encoder.bert.config.to_json_string())
    vocab = sorted(voice.prompts.tokenizer.get_vocab().items(), key=lambda item: item[1])
    (tmp_path / "vocab.txt").write_text("".join(f"{piece}\n" for piece, _ in vocab), encoding="utf-8")
    (tmp_path / "tokenlist").write_text("".join(f"{t}\n" for t in synthetic_tokenlist()), encoding="utf-8")
    (tmp_path / "speaker2").write_text("".join(f"{name}\n" for name in ("8051", "11614", "9017", "6097")))

    loaded = FAMILY.load_teacher(f"checkpoint={tmp_path / 'g_00140000'};style_encoder={tmp_path / 'checkpoint_163431'};"
                                 f"data_dir={tmp_path};bert_dir=None", tmp_path)
    assert loaded.speaker_index("9017") == 2
    text = "The quick brown fox jumps."
    expected = voice.synthesize(_request(voice, text, emotion="开心"))
    got = loaded.synthesize(_request(loaded, text, emotion="开心"))
    torch.testing.assert_close(got.audio, expected.audio, atol=1e-6, rtol=0)

    with pytest.raises(ValueError, match="released files go together"):
        EmotiVoiceFiles.parse(f"checkpoint={tmp_path / 'g_00140000'}")
    torch.save({"model": {}}, tmp_path / "not_a_generator")
    with pytest.raises(ValueError, match="expected a dict with 'generator'"):
        load_voice(EmotiVoiceFiles(tmp_path / "not_a_generator", tmp_path / "checkpoint_163431", tmp_path))


def test_synthesizer_graph_speaks_as_the_model(voice, exported_once):
    contract = FAMILY.graph_contracts(voice)[SYNTHESIZER]
    path = exported_once(contract)
    request = _request(voice, "The quick brown fox jumps. 今天天气很好。", emotion="恐惧")
    expected = voice.synthesize(request)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = dict(zip(contract.output_names, session.run(None, contract.feeds(request))))
    assert np.array_equal(outputs["durations"], expected.durations.numpy())
    for row, waveform in enumerate(expected.waveforms()):
        np.testing.assert_allclose(outputs["audio"][row, : waveform.numel()], waveform.numpy(), atol=1e-4)


@pytest.mark.slow  # full-size random weights: 53 M generator + 97 M style encoder parameters
def test_teacher_without_files_is_the_full_size_layout():
    teacher = FAMILY.load_teacher(FAMILY.default_voice, None)
    # The release's 53,277,015 elements less the training-only aligner's 1,273,728, less the
    # vocoder's 10,113 weight-norm magnitudes (the voice folds them into the weights).
    assert sum(p.numel() for p in teacher.generator.parameters()) == 52_003_287 - 10_113
    result = teacher.synthesize(_request(teacher, "今天天气很好。", emotion="开心"))
    assert result.sample_rate_hz == 16000 and result.audio_lengths[0] == result.durations.sum() * 256


def test_each_row_of_a_padded_batch_gets_its_own_sentence_text(voice):
    """The content embedding reads each row's text: the sentence the front end made those ids from, and
    for ids it never made, their symbols joined; padding past a row's length is never read."""
    texts = ["Yes.", "The train leaves at nine tonight."]
    utterances = [utterance for text in texts for utterance in voice.text_to_utterances(text)]
    request = SynthesisRequest.from_utterances(utterances)
    assert request.phoneme_ids.shape[1] > int(request.phoneme_lengths.min())  # the short row is padded
    assert voice.sentence_texts(request) == [utterance.text for utterance in utterances]
    unknown = tuple(utterances[0].phoneme_ids[::-1])
    assert voice.sentence_text(unknown) == " ".join(voice.frontend.tokens[i] for i in unknown)


def test_cached_word_symbols_equal_a_fresh_reading_in_every_context(monkeypatch):
    """The word cache must be exact: pypinyin reads one word at a time, so every sentence read with its
    words cached gets the symbols it gets with the cache bypassed."""
    from models.emotivoice import mandarin
    from texts import load_sentences

    sentences = load_sentences("eval_zh")
    cached = mandarin.word_phonemes
    with monkeypatch.context() as bypassed:
        bypassed.setattr(mandarin, "word_phonemes", cached.__wrapped__)
        fresh = [mandarin.mandarin_phonemes(sentence) for sentence in sentences]
    cached.cache_clear()
    [mandarin.mandarin_phonemes(sentence) for sentence in sentences]  # fills the cache
    assert [mandarin.mandarin_phonemes(sentence) for sentence in sentences] == fresh
    assert cached.cache_info().hits > len(sentences)
    assert isinstance(cached("一个"), tuple)  # nobody can change what the next caller gets
    # 一 changes its tone inside its word (sandhi before the fourth tone of 个; first tone as an ordinal).
    assert cached("一个") == ("i2", "sp0", "g", "e4", "sp1")
    assert cached("第一") == ("d", "i4", "sp0", "i1", "sp1")
