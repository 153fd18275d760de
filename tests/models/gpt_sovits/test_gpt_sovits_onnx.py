"""GPT-SoVITS v2's ONNX graphs on the tiny voice: exported by the dynamo exporter, run in
onnxruntime, against the eager model (models/gpt_sovits/onnx_contract.py).

    python -m pytest -q tests/models/gpt_sovits/test_onnx_contract.py
"""
from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.graph_checks import op_histogram
from export.onnx_export import export_graph
from export.rewrites.rvq import MatMulResidualVQ
from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.onnx_contract import (
    DECODE_STEP,
    FORBIDDEN_OPS,
    GRAPH_NAMES,
    PREFILL,
    REFERENCE_ENCODER,
    RVQ_ENCODE,
    SOVITS_DECODER,
    graph_contracts,
    refuse_dynamic_ops,
    t2s_contracts,
)
from models.gpt_sovits.onnx_decode import OnnxT2SDecoder
from models.gpt_sovits.t2s_decode import choose_next_tokens, decode, step_candidates
from models.gpt_sovits.tiny import tiny_voice

MAX_LEN = 256  # the prefill's static cache: room for the texts, prompt and steps below
STEPS = 30
DECODE_BUCKET = 96  # the batch decode below reads a length bucket of the static cache, not all of it


def _peak_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-12))


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


@pytest.fixture(scope="module")
def contracts(voice):
    return graph_contracts(voice, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def graph_path(contracts, exported_once):
    """A graph's file, exported lazily and once per test run (conftest.py ``exported_once``): the SoVITS
    decoder alone takes most of a minute, and tests/families/test_contract.py checks the same graphs
    (all but the prefill, whose cache length differs there)."""
    return lambda name: exported_once(contracts[name])


@pytest.fixture(scope="module")
def sessions(graph_path):
    """Opened lazily, once per graph."""
    cache = {}

    def session(name: str) -> tuple[ort.InferenceSession, onnx.ModelProto]:
        if name not in cache:
            path = graph_path(name)
            cache[name] = (ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), onnx.load(str(path)))
        return cache[name]
    return session


def _texts(voice, lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    vocab = voice.t2s.config.phoneme_vocab_size
    ids = [torch.randint(1, vocab, (n,), generator=generator) for n in lengths]
    bert = [torch.randn(1024, n, generator=generator) for n in lengths]
    prompt = torch.randint(0, voice.t2s.config.eos_id, (9,), generator=generator)
    return ids, bert, prompt


def _prefill_feeds(ids, bert, prompt):
    """Right-padded batch feeds for the prefill graph."""
    batch, longest = len(ids), max(len(row) for row in ids)
    phoneme_ids = np.zeros((batch, longest), np.int64)
    bert_features = np.zeros((batch, 1024, longest), np.float32)
    for row, (row_ids, row_bert) in enumerate(zip(ids, bert)):
        phoneme_ids[row, : len(row_ids)] = row_ids.numpy()
        bert_features[row, :, : len(row_ids)] = row_bert.numpy()
    return {"phoneme_ids": phoneme_ids, "bert_features": bert_features,
            "text_lengths": np.array([len(row) for row in ids], np.int64),
            "prompt_tokens": np.tile(prompt.numpy(), (batch, 1))}


def test_the_family_declares_its_graphs_and_no_synthesizer(contracts):
    assert tuple(contracts) == GRAPH_NAMES
    assert all(contract.feeds is None for contract in contracts.values())


def test_prefill_packs_each_row_as_the_eager_model_caches_it(voice, sessions):
    """Batch 3 of unequal texts (not the traced sizes): per row, the first-step logits and the cache
    are the eager model's for that row alone; positions past the row's length are zero."""
    session, _ = sessions(PREFILL)
    ids, bert, prompt = _texts(voice, (6, 15, 10), seed=3)
    logits, keys, values, lengths = session.run(None, _prefill_feeds(ids, bert, prompt))
    assert keys.shape[3] == MAX_LEN
    t2s = voice.t2s
    for row, (row_ids, row_bert) in enumerate(zip(ids, bert)):
        with torch.no_grad():
            eager_logits, cache = t2s.prefill(t2s.embed_text(row_ids[None], row_bert[None]),
                                              t2s.embed_audio(prompt[None], 0))
        length = len(row_ids) + len(prompt)
        assert lengths[row] == length
        assert _peak_error(logits[row], eager_logits[0].numpy()) <= 1e-4
        eager_keys = torch.stack(cache.keys)[:, 0].numpy()  # (layers, H, S, D_head)
        eager_values = torch.stack(cache.values)[:, 0].numpy()
        assert _peak_error(keys[:, row, :, :length], eager_keys) <= 1e-4
        assert _peak_error(values[:, row, :, :length], eager_values) <= 1e-4
        assert not keys[:, row, :, length:].any() and not values[:, row, :, length:].any()


def test_prefill_without_a_prompt_is_the_reference_free_first_step(voice, sessions):
    """An empty prompt (B, 0): the first-step logits come from each row's last text id."""
    session, _ = sessions(PREFILL)
    ids, bert, _ = _texts(voice, (8, 5), seed=6)
    logits, _, _, lengths = session.run(None, _prefill_feeds(ids, bert, torch.zeros(0, dtype=torch.long)))
    assert lengths.tolist() == [8, 5]
    for row, (row_ids, row_bert) in enumerate(zip(ids, bert)):
        with torch.no_grad():
            expected, _ = voice.t2s.prefill(voice.t2s.embed_text(row_ids[None], row_bert[None]), None)
        assert _peak_error(logits[row], expected[0].numpy()) <= 1e-4


def _greedy_onnx(voice, sessions, ids, bert, prompt, sampling):
    """Prefill, then decode steps over a static cache written by index; the choice rules of the
    eager decoder (penalty, EOS blocked early, stop on EOS) applied per row on the host."""
    prefill, _ = sessions(PREFILL)
    step, _ = sessions(DECODE_STEP)
    logits, keys, values, lengths = prefill.run(None, _prefill_feeds(ids, bert, prompt))
    keys, values = np.ascontiguousarray(keys[:, :, :, :DECODE_BUCKET]), np.ascontiguousarray(values[:, :, :, :DECODE_BUCKET])
    batch, eos_id = len(ids), voice.t2s.config.eos_id
    history = [prompt.clone() for _ in range(batch)]
    finished = [False] * batch
    tokens = np.zeros((batch, 1), np.int64)
    for index in range(sampling.max_tokens):
        for row in range(batch):
            if finished[row]:
                continue
            candidates = step_candidates(torch.from_numpy(logits[row : row + 1]), index)
            token, penalised = choose_next_tokens(candidates, history[row][None], sampling, None)
            if int(token) == eos_id or int(penalised.argmax()) == eos_id:
                finished[row] = True
                continue
            history[row] = torch.cat([history[row], token])
            tokens[row, 0] = int(token)
        if all(finished) or index + 1 == sampling.max_tokens:
            break
        logits, new_keys, new_values = step.run(None, {
            "token": tokens, "audio_position": np.full(batch, len(prompt) + index, np.int64),
            "key_cache": keys, "value_cache": values, "cache_lengths": lengths})
        rows = np.arange(batch)
        keys[:, rows, :, lengths] = new_keys[:, :, :, 0].transpose(1, 0, 2, 3)  # (B, layers, H, D_head) at (row, pos)
        values[:, rows, :, lengths] = new_values[:, :, :, 0].transpose(1, 0, 2, 3)
        lengths = lengths + 1
    return [h[len(prompt):] for h in history]


def test_greedy_onnx_decode_gives_the_eager_decoders_tokens(voice, sessions):
    """Two rows of unequal texts decoded together in onnxruntime: each row's tokens are exactly
    what the eager decoder gives for that row alone, greedy (top_k 1) with repetition penalty."""
    ids, bert, prompt = _texts(voice, (12, 7), seed=5)
    sampling = GptSovitsSampling.deterministic(max_tokens=STEPS)
    got = _greedy_onnx(voice, sessions, ids, bert, prompt, sampling)
    for row, (row_ids, row_bert) in enumerate(zip(ids, bert)):
        expected = decode(voice.t2s, row_ids, row_bert, prompt, sampling).tokens
        assert len(expected) > 11, "the check needs more than the EOS-blocked steps"
        assert torch.equal(got[row], expected), f"row {row}: {got[row].tolist()} != {expected.tolist()}"


@pytest.fixture(scope="module")
def onnx_decoder(voice, graph_path):
    return OnnxT2SDecoder(graph_path(PREFILL), graph_path(DECODE_STEP), threads=1, eos_id=voice.t2s.config.eos_id)


@pytest.mark.parametrize("sampling, eos_from_step", [
    (GptSovitsSampling.deterministic(max_tokens=STEPS), STEPS),  # EOS suppressed, as the benchmark decodes
    (GptSovitsSampling(top_k=15, seed=7, max_tokens=STEPS), 11),  # sampled from the request's seed
], ids=["greedy", "top_k_seeded"])
def test_onnx_decoder_gives_the_eager_decoders_tokens(voice, onnx_decoder, sampling, eos_from_step):
    (ids,), (bert,), prompt = _texts(voice, (11,), seed=8)
    for row_prompt in (prompt, None):  # with a reference prompt, and reference-free
        expected = decode(voice.t2s, ids, bert, row_prompt, sampling, eos_from_step=eos_from_step).tokens
        got = onnx_decoder.decode(ids, bert, row_prompt, sampling, eos_from_step=eos_from_step)
        assert len(expected) == STEPS
        assert torch.equal(got, expected), f"{got.tolist()} != {expected.tolist()}"


def test_onnx_decoder_stops_where_the_eager_decoder_chooses_eos(voice, tmp_path):
    """A copy of the model whose head favours EOS: both decoders stop at the first step EOS is allowed."""
    t2s = copy.deepcopy(voice.t2s)
    weight = t2s.ar_predict_layer.weight
    t2s.ar_predict_layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    with torch.no_grad():
        t2s.ar_predict_layer.weight.copy_(weight)
        t2s.ar_predict_layer.bias.zero_()
        t2s.ar_predict_layer.bias[t2s.config.eos_id] = 1e3
    contracts = t2s_contracts(t2s, max_len=MAX_LEN)
    paths = [export_graph(contracts[name], tmp_path / f"{name}.onnx") for name in (PREFILL, DECODE_STEP)]
    decoder = OnnxT2SDecoder(*paths, threads=1, eos_id=t2s.config.eos_id)
    (ids,), (bert,), prompt = _texts(voice, (11,), seed=8)
    sampling = GptSovitsSampling.deterministic(max_tokens=STEPS)
    expected = decode(t2s, ids, bert, prompt, sampling)
    assert expected.stopped_by == "eos" and len(expected.tokens) == 11
    assert torch.equal(decoder.decode(ids, bert, prompt, sampling), expected.tokens)


def test_onnx_decoder_refuses_a_decode_longer_than_its_cache(voice, onnx_decoder):
    """20 text + prompt positions and 236 tokens fill the 256 exported positions; one more token does not fit."""
    (ids,), (bert,), prompt = _texts(voice, (11,), seed=8)
    assert len(ids) + len(prompt) == 20
    fits = onnx_decoder.decode(ids, bert, prompt, GptSovitsSampling.deterministic(max_tokens=237), eos_from_step=237)
    assert len(fits) == 237
    with pytest.raises(ValueError, match=r"= 257 cache positions; the prefill graph was exported with 256"):
        onnx_decoder.decode(ids, bert, prompt, GptSovitsSampling.deterministic(max_tokens=238))


def test_decode_step_never_reads_past_the_valid_length(contracts, sessions):
    """Whatever sits at or past a row's valid length changes no output bit."""
    session, _ = sessions(DECODE_STEP)
    feeds = {name: tensor.numpy().copy() for name, tensor in contracts[DECODE_STEP].example_inputs.items()}
    clean = session.run(None, feeds)
    generator = np.random.default_rng(0)
    for cache in ("key_cache", "value_cache"):
        for row, length in enumerate(feeds["cache_lengths"]):
            tail = feeds[cache][:, row, :, length:]
            feeds[cache][:, row, :, length:] = generator.normal(0, 1e4, tail.shape).astype(np.float32)
    for name, before, after in zip(("logits", "new_keys", "new_values"), clean, session.run(None, feeds)):
        assert np.array_equal(before, after), name


def test_rvq_encode_is_matmul_argmin_gather_with_the_quantizers_codes(voice, contracts, sessions):
    session, model = sessions(RVQ_ENCODE)
    ops = op_histogram(model)
    assert ops.get("ArgMin") == ops.get("MatMul") == 1 and "Gather" in ops, ops
    assert not {"ReduceMin", "TopK", "ArgMax"} & set(ops), ops
    sovits = voice.sovits
    ssl = torch.randn(3, sovits.config.ssl_dim, 41, generator=torch.Generator().manual_seed(9))  # not the traced size
    (codes,) = session.run(None, {"ssl_features": ssl.numpy()})
    with torch.no_grad():
        expected = sovits.extract_latent(ssl)  # (B, S, T_codes)
        latents = sovits.ssl_proj(ssl).transpose(1, 2)  # (B, T_codes, D)
        rewrite = MatMulResidualVQ(sovits.quantizer.codebooks())(latents)[1].transpose(1, 2)  # (B, S, T_codes)
    assert codes.dtype == np.int64 and codes.shape == (3, 1, 20)
    assert np.array_equal(codes, expected.numpy())
    assert torch.equal(rewrite, expected), "export/rewrites/rvq.py gives other codes than the contract's module"


def test_no_graph_has_control_flow_random_draws_or_data_dependent_shapes(sessions):
    for name in (PREFILL, DECODE_STEP, RVQ_ENCODE, REFERENCE_ENCODER):
        _, model = sessions(name)
        assert not FORBIDDEN_OPS & set(op_histogram(model)), name


def test_a_graph_with_nonzero_is_refused():
    graph = onnx.helper.make_graph([onnx.helper.make_node("NonZero", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [1, None])])
    with pytest.raises(ValueError, match="NonZero"):
        refuse_dynamic_ops(onnx.helper.make_model(graph))


def test_reference_encoder_gives_the_voices_reference_embedding(voice, sessions):
    session, _ = sessions(REFERENCE_ENCODER)
    spectrogram = voice.prompt_of(voice.default_reference).spectrogram  # (1, bins, T_ref)
    (ge,) = session.run(None, {"reference_spectrogram": spectrogram.numpy()})
    with torch.no_grad():
        expected = voice.sovits.reference_embedding([spectrogram]).numpy()
    assert _peak_error(ge, expected) <= 1e-4


@pytest.mark.slow  # the dynamo export of the SoVITS decoder takes most of a minute on two cores
@pytest.mark.parametrize("noise_scale", [0.0, 0.5])
def test_sovits_decoder_speaks_as_the_synthesizer(voice, sessions, noise_scale):
    """Batch 1 at untraced lengths, ge from the voice's reference: the synthesizer's ``decode``
    with the same noise; no forbidden op in the graph."""
    session, model = sessions(SOVITS_DECODER)
    assert not FORBIDDEN_OPS & set(op_histogram(model))
    sovits, generator = voice.sovits, torch.Generator().manual_seed(4)
    spectrogram = voice.prompt_of(voice.default_reference).spectrogram
    codes = torch.randint(0, sovits.config.codebook_size, (1, 1, 14), generator=generator)
    phoneme_ids = torch.randint(1, sovits.config.phoneme_vocab_size, (1, 10), generator=generator)
    noise = torch.randn(1, sovits.config.inter_channels, 28, generator=generator)
    with torch.no_grad():
        ge = sovits.reference_embedding([spectrogram])
        expected = sovits.decode(codes, phoneme_ids, [spectrogram], noise if noise_scale else None, noise_scale)
    (audio,) = session.run(None, {
        "codes": codes.numpy(), "code_lengths": np.array([14]), "phoneme_ids": phoneme_ids.numpy(),
        "phoneme_lengths": np.array([10]), "ge": ge.numpy(), "noise": noise.numpy(),
        "noise_scale": np.array([noise_scale], np.float32)})
    assert audio.shape == expected.shape == (1, 1, 28 * sovits.samples_per_code // 2)
    assert _peak_error(audio, expected.numpy()) <= 1e-4
