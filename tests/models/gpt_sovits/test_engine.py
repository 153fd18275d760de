"""The T2S engine against the official fixtures, a naive full-recompute decode and the eager port,
itself alone vs batched, and its sampler against the eager port's (the official order). CPU, seconds;
GPU tests skip without CUDA."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from models.dynamic_int8 import DynamicInt8Linear, linear_names, quantize_linears
from models.gpt_sovits.engine import T2SEngine, T2SRequest, project
from models.gpt_sovits.engine_sampling import RowSampling, choose_tokens
from models.gpt_sovits.engine_weights import (
    MANIFEST_PATH,
    T2SWeights,
    random_state_dict,
)
from models.gpt_sovits.t2s import T2SConfig, Text2SemanticModel, sinusoid_table
from models.gpt_sovits.t2s_checkpoint import (
    load_state_dict_strictly,
    load_t2s_checkpoint,
    t2s_from_manifest,
)
from models.gpt_sovits.t2s_decode import choose_next_tokens, decode
from models.sampling import AutoregressiveSampling

FIXTURES = Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "gpt_sovits_v2"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"shared fixtures not found at {FIXTURES}")
FIXTURE_SAMPLING = {"top_k": 1, "repetition_penalty": 1.35, "early_stop_num": 40, "max_steps": 60}  # stops by 41
OTHER_SHAPE = {"vocab_size": 41, "phoneme_vocab_size": 23, "embedding_dim": 48, "hidden_dim": 48, "head": 3,
               "n_layer": 3, "EOS": 40}


@pytest.fixture(scope="module")
def fixture_model():
    model = load_t2s_checkpoint(FIXTURES / "tiny_gpt.ckpt").model
    cases = torch.load(FIXTURES / "cases.pt", weights_only=True)
    return model.config, model.state_dict(), cases


def fixture_requests(cases: dict) -> dict[str, tuple[T2SRequest, torch.Tensor, int]]:
    """Case name -> (request, expected generated tokens, expected official idx)."""
    requests = {}
    for case in ("case0", "case1", "case2"):
        prompt = cases[f"{case}/t2s.prompt_semantic"][0]
        request = T2SRequest(cases[f"{case}/t2s.phoneme_ids"][0], cases[f"{case}/t2s.bert_feature"][0], prompt,
                             **FIXTURE_SAMPLING)
        expected = cases[f"{case}/t2s.infer_panel.y"][0, prompt.shape[0]:]
        requests[case] = (request, expected, int(cases[f"{case}/t2s.infer_panel.idx"]))
    case = "extra_t2s_ref_free"
    request = T2SRequest(cases[f"{case}/t2s.phoneme_ids"][0], cases[f"{case}/t2s.bert_feature"][0], None,
                         **FIXTURE_SAMPLING)
    requests[case] = (request, cases[f"{case}/t2s.infer_panel.y"][0].long(), int(cases[f"{case}/t2s.infer_panel.idx"]))
    prompts = cases["extra_t2s_batch/t2s.prompts"]
    for row in range(2):
        request = T2SRequest(cases[f"extra_t2s_batch/t2s.x{row}"], cases[f"extra_t2s_batch/t2s.bert{row}"], prompts[row],
                             **FIXTURE_SAMPLING)
        expected = cases[f"extra_t2s_batch/t2s.y{row}"][prompts.shape[1]:]
        requests[f"extra_t2s_batch/{row}"] = (request, expected, int(cases[f"extra_t2s_batch/t2s.idx{row}"]))
    return requests


@needs_fixtures
def test_every_fixture_case_alone_gives_the_official_tokens(fixture_model):
    config, state_dict, cases = fixture_model
    engine = T2SEngine(T2SWeights.from_state_dict(config, state_dict, torch.float32, "cpu"), max_len=256)
    for name, (request, expected, idx) in fixture_requests(cases).items():
        result = engine.generate([request])[0]
        assert torch.equal(result.tokens, expected), name
        assert result.official_idx == idx, name


@needs_fixtures
def test_fixture_cases_batched_together_give_the_official_tokens(fixture_model):
    """All six rows through two slots: rows leave and others join between steps."""
    config, state_dict, cases = fixture_model
    engine = T2SEngine(T2SWeights.from_state_dict(config, state_dict, torch.float32, "cpu"), max_batch=2,
                       max_len=256, sync_every=5)
    cases_by_name = fixture_requests(cases)
    results = engine.generate([request for request, _, _ in cases_by_name.values()])
    for (name, (_, expected, idx)), result in zip(cases_by_name.items(), results):
        assert torch.equal(result.tokens, expected), name
        assert result.official_idx == idx, name
    assert [result.stopped_by for result in results[:3]] == ["eos", "early_stop", "eos"]


def naive_greedy_decode(config: T2SConfig, state_dict: dict, request: T2SRequest) -> list[int]:
    """Recompute the whole sequence at every step (no cache), official greedy rules, float64."""
    sd = {key: value.double() for key, value in state_dict.items()}
    d, heads = config.hidden_dim, config.num_heads
    table = sinusoid_table(4000, d).double()
    text = sd["ar_text_embedding.word_embeddings.weight"][request.phoneme_ids]
    text = text + request.bert_features.double().T @ sd["bert_proj.weight"].T + sd["bert_proj.bias"]
    text = text + sd["ar_text_position.alpha"] * table[: text.shape[0]]
    audio_ids = [] if request.prompt_tokens is None else request.prompt_tokens.tolist()
    generated = []
    for step in range(request.max_steps):
        ids = torch.tensor(audio_ids, dtype=torch.int64)
        audio = sd["ar_audio_embedding.word_embeddings.weight"][ids] + sd["ar_audio_position.alpha"] * table[: len(ids)]
        x = torch.cat([text, audio])
        n, t = x.shape[0], text.shape[0]
        allowed = torch.zeros(n, n, dtype=torch.bool)
        allowed[:, :t] = True
        allowed[t:, t:] = torch.ones(n - t, n - t, dtype=torch.bool).tril()
        for layer in range(config.num_layers):
            p = f"h.layers.{layer}."
            q, k, v = (x @ sd[p + "self_attn.in_proj_weight"].T + sd[p + "self_attn.in_proj_bias"]).chunk(3, dim=-1)
            q, k, v = (z.view(n, heads, -1).transpose(0, 1) for z in (q, k, v))
            scores = (q @ k.transpose(1, 2) / math.sqrt(d // heads)).masked_fill(~allowed, float("-inf"))
            attention = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, d)
            x = F.layer_norm(x + attention @ sd[p + "self_attn.out_proj.weight"].T + sd[p + "self_attn.out_proj.bias"],
                             (d,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], 1e-5)
            hidden = F.relu(x @ sd[p + "linear1.weight"].T + sd[p + "linear1.bias"])
            x = F.layer_norm(x + hidden @ sd[p + "linear2.weight"].T + sd[p + "linear2.bias"],
                             (d,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], 1e-5)
        logits = x[-1] @ sd["ar_predict_layer.weight"].T
        if step < request.eos_from_step:
            logits = logits[: config.eos_id]
        for token in set(audio_ids):
            logits[token] = logits[token] * request.repetition_penalty if logits[token] < 0 \
                else logits[token] / request.repetition_penalty
        token = int(logits.argmax())
        if token == config.eos_id:
            return generated
        generated.append(token)
        if request.early_stop_num != -1 and len(generated) > request.early_stop_num:
            return generated
        audio_ids.append(token)
    return generated


def eager_greedy_decode(model: Text2SemanticModel, request: T2SRequest) -> list[int]:
    """The eager port (t2s.py decoded by t2s_decode) on ``request``; its early stop as max_tokens."""
    max_tokens = request.max_steps if request.early_stop_num == -1 else min(request.early_stop_num + 1,
                                                                            request.max_steps)
    sampling = AutoregressiveSampling.deterministic(repetition_penalty=request.repetition_penalty,
                                                    max_tokens=max_tokens)
    bert_features = request.bert_features.to(model.ar_audio_embedding.word_embeddings.weight.dtype)
    return decode(model, request.phoneme_ids, bert_features, request.prompt_tokens, sampling,
                  eos_from_step=request.eos_from_step).tokens.tolist()


def other_shape_requests(config: T2SConfig, count: int) -> list[T2SRequest]:
    generator = torch.Generator().manual_seed(7)
    requests = []
    for index in range(count):
        text_len = 5 + 3 * index
        prompt = None if index == 2 else torch.randint(0, config.eos_id, (4 + 2 * index,), generator=generator)
        requests.append(T2SRequest(
            phoneme_ids=torch.randint(0, config.phoneme_vocab_size, (text_len,), generator=generator),
            bert_features=torch.randn(config.bert_feature_dim, text_len, generator=generator),
            prompt_tokens=prompt, early_stop_num=12 + 4 * index, max_steps=40, eos_from_step=3 + index,
        ))
    return requests


def test_engine_equals_a_naive_full_recompute_decode_on_another_shape():
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    state_dict = random_state_dict(config, seed=3)
    engine = T2SEngine(T2SWeights.from_state_dict(config, state_dict, torch.float64, "cpu"), max_len=128)
    model = Text2SemanticModel(config)
    load_state_dict_strictly(model, state_dict, "random weights")
    model = model.double().eval()
    stops = set()
    for request in other_shape_requests(config, 4):
        expected = naive_greedy_decode(config, state_dict, request)
        result = engine.generate([request])[0]
        assert result.tokens.tolist() == expected
        assert eager_greedy_decode(model, request) == expected
        stops.add(result.stopped_by)
    assert stops == {"eos", "early_stop"}, "the requests should exercise both stops"


def test_continuous_batching_gives_each_request_its_tokens_alone():
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float64, "cpu")
    requests = other_shape_requests(config, 6)
    alone = [T2SEngine(weights, max_len=128).generate([request])[0].tokens for request in requests]
    engine = T2SEngine(weights, max_batch=4, max_len=128, sync_every=3, batch_buckets=[1, 2, 4],
                       length_buckets=[32, 64, 128])
    batched = engine.generate(requests)
    assert all(torch.equal(one.tokens, tokens) for one, tokens in zip(batched, alone))
    assert not engine.has_work()


@pytest.mark.parametrize("keep_float", [("ar_predict_layer",), ()], ids=["float_head", "int8_head"])
def test_dynamic_int8_projections_decode_as_the_int8_eager_port_alone_and_batched(keep_float):
    """The int8_dynamic variant's T2S (models/dynamic_int8.py) served by token steps: the engine
    runs the converted model's own int8 products, so its tokens are the eager int8 port's, and a
    row's activations are quantized with its own scale, so batching changes no row's tokens."""
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    model = Text2SemanticModel(config)
    load_state_dict_strictly(model, random_state_dict(config, seed=3), "random weights")
    float_weights = T2SWeights.from_model(model.eval())
    assert float_weights.int8_projections == () and isinstance(float_weights.layers[0].qkv_weight, torch.Tensor)
    names, kept = linear_names(model, keep_float)
    quantize_linears(model, names)
    weights = T2SWeights.from_model(model)
    assert sorted(weights.int8_projections) == sorted(names) and kept == list(keep_float)
    assert isinstance(weights.layers[2].qkv_weight, DynamicInt8Linear) and isinstance(weights.bert_proj_weight,
                                                                                        DynamicInt8Linear)
    assert isinstance(weights.predict_weight, DynamicInt8Linear) == (not keep_float)
    requests = other_shape_requests(config, 6)
    alone = [T2SEngine(weights, max_len=128).generate([request])[0].tokens for request in requests]
    for request, tokens in zip(requests, alone):
        assert tokens.tolist() == eager_greedy_decode(model, request)
    engine = T2SEngine(weights, max_batch=4, max_len=128, sync_every=3, batch_buckets=[1, 2, 4],
                       length_buckets=[32, 64, 128])
    batched = engine.generate(requests)
    assert all(torch.equal(one.tokens, tokens) for one, tokens in zip(batched, alone))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("rows_shape", [(3,), (2, 5)], ids=["decode_rows", "prefill_positions"])
def test_a_float_projection_is_the_linear_layer_it_stands_for(bias, relu, rows_shape):
    torch.manual_seed(0)
    x, weight, bias_values = torch.randn(*rows_shape, 6), torch.randn(4, 6), torch.randn(4)
    expected = F.linear(x, weight, bias_values if bias else None)
    expected = F.relu(expected) if relu else expected
    got = project(x, weight, bias_values if bias else None, relu=relu)
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-6)


def test_a_decode_runs_no_step_past_the_max_steps_of_every_running_request():
    """advance(16) with requests of 5 and 7 tokens runs 6 steps (the prefill made each one's first
    token), and the tokens are those of a decode that reads its stop flags every step."""
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float64, "cpu")
    generator = torch.Generator().manual_seed(5)
    requests = [T2SRequest(torch.randint(0, config.phoneme_vocab_size, (6,), generator=generator),
                           torch.randn(config.bert_feature_dim, 6, generator=generator), None, max_steps=tokens,
                           eos_from_step=tokens) for tokens in (5, 7)]
    stepwise = T2SEngine(weights, max_batch=2, max_len=64, sync_every=1).generate(requests)
    engine = T2SEngine(weights, max_batch=2, max_len=64, sync_every=16)
    for request in requests:
        engine.submit(request)
    engine.admit()
    cache_len = engine.cache_len[:2].clone()
    engine.advance(16)
    assert (engine.cache_len[:2] - cache_len).tolist() == [6, 6]
    engine.collect()
    results = [engine.result(request_id) for request_id in (0, 1)]
    assert [len(result.tokens) for result in results] == [5, 7]
    assert all(torch.equal(one.tokens, other.tokens) for one, other in zip(results, stepwise))
    assert not engine.has_work()


def test_sampling_is_reproducible_with_a_seed_and_top_k_1_is_greedy():
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3, logit_std=1.0), torch.float32, "cpu")
    request = other_shape_requests(config, 1)[0]
    sampled = T2SRequest(request.phoneme_ids, request.bert_features, request.prompt_tokens, top_k=10, top_p=0.9,
                         temperature=1.2, max_steps=30, eos_from_step=30)
    first = T2SEngine(weights, max_len=128, seed=5).generate([sampled])[0].tokens
    again = T2SEngine(weights, max_len=128, seed=5).generate([sampled])[0].tokens
    other = T2SEngine(weights, max_len=128, seed=6).generate([sampled])[0].tokens
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    greedy = T2SRequest(request.phoneme_ids, request.bert_features, request.prompt_tokens, max_steps=30,
                        eos_from_step=30)
    one = T2SRequest(*(getattr(greedy, name) for name in ("phoneme_ids", "bert_features", "prompt_tokens")),
                     top_k=1, top_p=0.5, temperature=3.0, max_steps=30, eos_from_step=30)
    assert torch.equal(T2SEngine(weights, max_len=128).generate([greedy])[0].tokens,
                       T2SEngine(weights, max_len=128, seed=9).generate([one])[0].tokens)


@pytest.mark.parametrize("top_k,top_p,temperature", [(15, 1.0, 1.0), (5, 0.8, 0.7), (1025, 0.6, 1.5), (3, 0.99, 1.0)])
def test_device_sampler_follows_the_official_order(top_k, top_p, temperature):
    """Same logits, same history, same random draws: the engine's batched sampler picks what the
    eager port's sampler (official order) picks, and stops on EOS when it does."""
    vocab, eos_id = 1025, 1024
    eager_sampling = AutoregressiveSampling(top_k=top_k, top_p=top_p, temperature=temperature, repetition_penalty=1.35)
    sampling = RowSampling(torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([temperature]),
                           torch.tensor([1.35]), torch.tensor([0]))
    data = torch.Generator().manual_seed(top_k)
    for trial in range(40):
        logits = 3 * torch.randn(vocab, generator=data)
        logits[eos_id] = logits.max() + (1.0 if trial % 4 == 0 else -0.5)
        history = torch.randint(0, vocab, (30,), generator=data)
        seen = torch.zeros(1, vocab, dtype=torch.bool)
        seen[0, history] = True
        ours, ours_eos = choose_tokens(logits.unsqueeze(0), seen, sampling, torch.tensor([5]), eos_id,
                                       torch.Generator().manual_seed(trial), greedy=False)
        theirs, penalised = choose_next_tokens(logits.unsqueeze(0), history.unsqueeze(0), eager_sampling,
                                               torch.Generator().manual_seed(trial))
        assert int(ours) == int(theirs)
        assert bool(ours_eos) == (int(theirs) == eos_id or int(penalised.argmax()) == eos_id)


def test_bad_requests_and_weights_are_named():
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    state_dict = random_state_dict(config, seed=3)
    engine = T2SEngine(T2SWeights.from_state_dict(config, state_dict, torch.float32, "cpu"), max_len=64)
    request = other_shape_requests(config, 1)[0]
    with pytest.raises(ValueError, match="bert_features"):
        engine.submit(T2SRequest(request.phoneme_ids, request.bert_features[:, :2], request.prompt_tokens))
    with pytest.raises(ValueError, match="exceed the engine's max_len 64"):
        engine.submit(T2SRequest(request.phoneme_ids, request.bert_features, request.prompt_tokens, max_steps=100))
    state_dict["h.layers.0.linear1.weight"] = torch.zeros(7, 48)
    with pytest.raises(ValueError, match="wrong shape"):
        T2SWeights.from_state_dict(config, state_dict, torch.float32, "cpu")
    with pytest.raises(ValueError, match="embedding_dim"):
        T2SConfig.from_checkpoint_config({**OTHER_SHAPE, "embedding_dim": 32})


def test_full_size_random_weights_match_the_official_manifest():
    manifest = json.loads(MANIFEST_PATH.read_text())
    model = t2s_from_manifest(MANIFEST_PATH)
    state_dict = random_state_dict(model.config, seed=0)
    load_state_dict_strictly(model, state_dict, "random weights")
    assert sum(value.numel() for value in state_dict.values()) == manifest["total_parameters"]
    del state_dict["ar_predict_layer.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['ar_predict_layer.weight'\]"):
        load_state_dict_strictly(model, state_dict, "random weights")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@needs_fixtures
def test_cuda_graphs_equal_eager_steps_on_the_fixtures(fixture_model):
    config, state_dict, cases = fixture_model
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cuda")
    requests = [request for request, _, _ in fixture_requests(cases).values()]
    eager = T2SEngine(weights, max_batch=2, max_len=256, sync_every=5).generate(requests)
    graphed_engine = T2SEngine(weights, max_batch=2, max_len=256, sync_every=5)
    graphed_engine.capture_graphs()
    graphed = graphed_engine.generate(requests)
    for (request, expected, _), one, other in zip(fixture_requests(cases).values(), eager, graphed):
        assert torch.equal(one.tokens, expected)
        assert torch.equal(other.tokens, expected)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_sampling_is_reproducible_and_matches_eager_steps():
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3, logit_std=1.0), torch.float32,
                                         "cuda")
    base = other_shape_requests(config, 1)[0]
    request = T2SRequest(base.phoneme_ids, base.bert_features, base.prompt_tokens, top_k=10, top_p=0.9,
                         max_steps=30, eos_from_step=30)
    runs = []
    for capture in (False, True, True):
        engine = T2SEngine(weights, max_len=128, seed=5)
        if capture:
            engine.capture_graphs()
        runs.append(engine.generate([request])[0].tokens)
    assert torch.equal(runs[1], runs[2])
    assert torch.equal(runs[0], runs[1])


@pytest.mark.gpu
@needs_cuda
@needs_fixtures
# (2, 16): the fused step; (1, 16): two rows take the cuBLAS + attention-kernel step; (2, 1): the
# fused products on tensor cores (float32 weights: tl.dot in full float32).
@pytest.mark.parametrize(("fused_max_batch", "dot_min_batch"), [(2, 16), (1, 16), (2, 1)])
def test_fused_triton_step_in_cuda_graphs_gives_the_official_tokens(fixture_model, fused_max_batch, dot_min_batch):
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_triton import (
        TritonT2SEngine,  # Triton is a GPU-machine-only package
    )

    config, state_dict, cases = fixture_model
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cuda")
    engine = TritonT2SEngine(weights, max_batch=2, max_len=256, length_buckets=[256], sync_every=5,
                             fused_max_batch=fused_max_batch, dot_min_batch=dot_min_batch)
    engine.capture_graphs()
    cases_by_name = fixture_requests(cases)
    results = engine.generate([request for request, _, _ in cases_by_name.values()])
    for (name, (_, expected, idx)), result in zip(cases_by_name.items(), results):
        assert torch.equal(result.tokens, expected), name
        assert result.official_idx == idx, name


@pytest.mark.gpu
@needs_cuda
@needs_fixtures
def test_shards_on_their_own_streams_give_the_official_tokens(fixture_model):
    """Every fixture case through three one-to-two-slot shards on separate CUDA streams: requests wait
    in one queue and take whichever shard frees a slot, and each still gets its official tokens."""
    from models.gpt_sovits.engine_shards import ShardedT2SEngines

    config, state_dict, cases = fixture_model
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cuda")
    engines = [T2SEngine(weights, max_batch=batch, max_len=256, length_buckets=[256], sync_every=5)
               for batch in (1, 2, 1)]
    for engine in engines:
        engine.capture_graphs()
    sharded = ShardedT2SEngines(engines)
    cases_by_name = fixture_requests(cases)
    results = sharded.generate([request for request, _, _ in cases_by_name.values()])
    for (name, (_, expected, idx)), result in zip(cases_by_name.items(), results):
        assert torch.equal(result.tokens, expected), name
        assert result.official_idx == idx, name
    assert not sharded.has_work()


def test_shards_refuse_no_engines_and_engines_off_cuda():
    from models.gpt_sovits.engine_shards import ShardedT2SEngines

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, "cpu")
    with pytest.raises(ValueError, match="CUDA"):
        ShardedT2SEngines([T2SEngine(weights, max_batch=2, max_len=256)])
    with pytest.raises(ValueError, match="at least one"):
        ShardedT2SEngines([])


@pytest.mark.gpu
@needs_cuda
def test_shards_refuse_busy_engines_and_engines_that_differ():
    from models.gpt_sovits.engine_shards import ShardedT2SEngines

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, "cuda")
    other = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, "cuda")
    with pytest.raises(ValueError, match="share one T2SWeights"):
        ShardedT2SEngines([T2SEngine(weights, max_batch=1, max_len=256), T2SEngine(other, max_batch=1, max_len=256)])
    with pytest.raises(ValueError, match="share one T2SWeights"):
        ShardedT2SEngines([T2SEngine(weights, max_batch=1, max_len=256), T2SEngine(weights, max_batch=1, max_len=128)])
    busy = T2SEngine(weights, max_batch=1, max_len=256)
    busy.submit(T2SRequest(torch.zeros(5, dtype=torch.long), torch.zeros(config.bert_feature_dim, 5), None, max_steps=4))
    with pytest.raises(ValueError, match="in flight"):
        ShardedT2SEngines([busy])


@pytest.mark.gpu
@needs_cuda
def test_fp16_products_on_tensor_cores_match_the_fused_products_within_rounding():
    """The FP16 ``DOT`` branch (activations rounded to FP16 before tl.dot) against the 8-row fused
    products on the same 16 rows: one prefill and three steps, logits within FP16 rounding."""
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_triton import TritonT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float16, "cuda")
    generator = torch.Generator().manual_seed(0)
    requests = [T2SRequest(torch.randint(0, config.phoneme_vocab_size, (9,), generator=generator),
                           torch.randn(config.bert_feature_dim, 9, generator=generator), None, max_steps=8,
                           eos_from_step=8) for _ in range(16)]
    logits = []
    for dot_min_batch in (16, 17):  # 17: the same 16 rows on the broadcast products
        engine = TritonT2SEngine(weights, max_batch=16, max_len=256, length_buckets=[256], fused_max_batch=16,
                                 dot_min_batch=dot_min_batch)
        for request in requests:
            engine.submit(request)
        engine.admit()
        engine.advance(3)
        torch.cuda.synchronize()
        logits.append(engine._logits[:16].clone())
    scale = logits[1].abs().max()
    assert (logits[0] - logits[1]).abs().max() <= 2e-2 * scale


def test_free_slots_counts_waiting_requests_as_taken():
    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, "cpu")
    engine = T2SEngine(weights, max_batch=3, max_len=256)
    generator = torch.Generator().manual_seed(0)
    request = T2SRequest(torch.randint(0, config.phoneme_vocab_size, (5,), generator=generator),
                         torch.randn(config.bert_feature_dim, 5, generator=generator), None, max_steps=4, eos_from_step=4)
    assert engine.free_slots() == 3
    engine.submit(request)
    assert engine.free_slots() == 2  # waiting: promised a slot
    engine.admit()
    assert engine.free_slots() == 2  # decoding
    engine.run()
    assert engine.free_slots() == 3


@pytest.mark.gpu
@needs_cuda
@needs_fixtures
@pytest.mark.parametrize("asm_barrier,fold_ffn,fold_out",
                         [(True, True, False), (False, True, False), (True, False, False), (True, True, True),
                          (False, True, True)])
def test_persistent_step_in_cuda_graphs_gives_the_official_tokens(fixture_model, asm_barrier, fold_ffn, fold_out):
    """Every fixture case at batch 1 through the one-kernel step, with either grid barrier, the FFN
    as one phase (atomics) or two, the out phase folded into the attend phase or not."""
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_persistent import (
        PersistentT2SEngine,  # Triton is a GPU-machine-only package
    )

    config, state_dict, cases = fixture_model
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cuda")
    engine = PersistentT2SEngine(weights, max_batch=1, max_len=256, length_buckets=[256], sync_every=5,
                                 programs=3 * config.num_heads, asm_barrier=asm_barrier, fold_ffn=fold_ffn,
                                 fold_out=fold_out)
    engine.capture_graphs(greedy_modes=(True,))
    for name, (request, expected, idx) in fixture_requests(cases).items():
        result = engine.generate([request])[0]
        assert torch.equal(result.tokens, expected), name
        assert result.official_idx == idx, name
    assert not engine.barrier_timed_out()


@pytest.mark.gpu
@needs_cuda
@needs_fixtures
def test_a_stamped_persistent_step_keeps_the_official_tokens_and_times_every_phase(fixture_model):
    """``timeline=True``: the stamps change no token, and the last step's table reads back as one row
    per grid barrier whose spans add up to no more than the step."""
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_persistent import (
        PersistentT2SEngine,  # Triton is a GPU-machine-only package
    )
    from models.gpt_sovits.step_timeline import summarize

    config, state_dict, cases = fixture_model
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cuda")
    engine = PersistentT2SEngine(weights, max_batch=1, max_len=256, length_buckets=[256], sync_every=5,
                                 programs=3 * config.num_heads, timeline=True)
    engine.capture_graphs(greedy_modes=(True,))
    for name, (request, expected, _) in fixture_requests(cases).items():
        assert torch.equal(engine.generate([request])[0].tokens, expected), name
    summary = summarize(engine.step_timeline().numpy(), engine.step_layout, engine.program_roles())
    assert len(summary["rows"]) == engine.step_layout.barriers == config.num_layers * 2 + 1
    assert all(row["span_ns"] >= 0 and row["release_ns"] >= 0 for row in summary["rows"])
    assert 0 < sum(row["span_ns"] for row in summary["rows"]) <= summary["step_ns"] < 10_000_000
    assert not engine.barrier_timed_out()


@pytest.mark.slow
@needs_fixtures
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton kernels run on the CPU under TRITON_INTERPRET=1")
@pytest.mark.parametrize("step", ["fused_tensor_cores", "wide", "persistent_phases", "persistent_phases_folded_ffn",
                                  "persistent_phases_folded_ffn_and_out"])
def test_triton_steps_give_the_official_tokens_in_the_interpreter(fixture_model, step):
    """On the CPU (a minute a case, so the first two): the fused step's ``DOT`` products (tl.dot,
    LayerNorm statistics chunk by chunk), two rows at once; the wide step (cuBLAS products, the
    attention kernel writing the cache, the add + LayerNorm kernel), two rows at once; the persistent
    kernel's phase code, one launch per phase, with the FFN as two phases (the default) and as one,
    and with the out phase folded into the attend phase too."""
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_persistent import PersistentT2SEngine
    from models.gpt_sovits.engine_triton import TritonT2SEngine

    config, state_dict, cases = fixture_model
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cpu")
    if step == "fused_tensor_cores":
        engine = TritonT2SEngine(weights, max_batch=2, max_len=256, length_buckets=[256], sync_every=5,
                                 fused_max_batch=2, dot_min_batch=1)
    elif step == "wide":
        engine = TritonT2SEngine(weights, max_batch=2, max_len=256, length_buckets=[256], sync_every=5,
                                 fused_max_batch=1)
    else:
        engine = PersistentT2SEngine(weights, max_batch=1, max_len=256, length_buckets=[256],
                                     programs=4 * config.num_heads, phased=True,
                                     fold_ffn=step.startswith("persistent_phases_folded"),
                                     fold_out=step == "persistent_phases_folded_ffn_and_out")
    chosen = list(fixture_requests(cases).items())[:2]
    for start in range(0, len(chosen), engine.max_batch):
        group = chosen[start : start + engine.max_batch]
        results = engine.generate([request for _, (request, _, _) in group])
        for (name, (_, expected, idx)), result in zip(group, results):
            assert torch.equal(result.tokens, expected), name
            assert result.official_idx == idx, name


def test_tensor_core_tiles_narrower_than_16_are_refused():
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_triton import TritonT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, "cpu")
    with pytest.raises(ValueError, match="dot_block_n"):
        TritonT2SEngine(weights, max_batch=2, max_len=256, length_buckets=[256], dot_block_n=8)
    narrow = T2SConfig.from_checkpoint_config({**OTHER_SHAPE, "embedding_dim": 40, "hidden_dim": 40, "head": 4})
    narrow_weights = T2SWeights.from_state_dict(narrow, random_state_dict(narrow, seed=3), torch.float32, "cpu")
    with pytest.raises(ValueError, match="hidden_dim 40"):
        TritonT2SEngine(narrow_weights, max_batch=2, max_len=256, length_buckets=[256], fused_max_batch=2, dot_min_batch=1)
    TritonT2SEngine(narrow_weights, max_batch=2, max_len=256, length_buckets=[256], fused_max_batch=2)  # DOT off: fine


def test_persistent_engine_refuses_a_grid_without_a_program_per_role():
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_persistent import PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)  # random weights: no shared fixtures needed
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, "cpu")
    with pytest.raises(ValueError, match="programs"):
        PersistentT2SEngine(weights, max_batch=1, max_len=256, length_buckets=[256], programs=2 * config.num_heads,
                            phased=True)
    with pytest.raises(ValueError, match="sum_replicas"):
        PersistentT2SEngine(weights, max_batch=1, max_len=256, length_buckets=[256], phased=True, sum_replicas=0)
    with pytest.raises(ValueError, match="needs fold_ffn or fold_out"):
        PersistentT2SEngine(weights, max_batch=1, max_len=256, length_buckets=[256], phased=True, fold_ffn=False,
                            fold_out=False, sum_replicas=2)
    for knob in ("prefetch_out", "late_key_score"):
        with pytest.raises(ValueError, match="fold_out"):
            PersistentT2SEngine(weights, max_batch=1, max_len=256, length_buckets=[256], phased=True, fold_out=False,
                                **{knob: True})


@needs_fixtures
# None: the pass padded to its longest row; 256: to 256 positions, as a captured pass's bucket is.
@pytest.mark.parametrize("positions", [None, 256])
def test_a_padded_prefill_batch_fills_each_slot_as_a_prefill_alone_would(fixture_model, positions):
    """Rows of different text and prompt lengths (one reference-free) prefilled together: each
    slot's cache and first token equal those of its own prefill."""
    config, state_dict, cases = fixture_model
    requests = [request for request, _, _ in fixture_requests(cases).values()][:4]
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cpu")
    together = T2SEngine(weights, max_batch=4, max_len=256)
    with pytest.raises(ValueError, match="cannot hold"):
        together.prefill([0], requests[:1], positions=4)
    together.prefill([0, 1, 2, 3], requests, positions=positions)
    alone = T2SEngine(weights, max_batch=4, max_len=256)
    for slot, request in enumerate(requests):
        alone.prefill([slot], [request])
    for slot in range(4):
        length = int(alone.cache_len[slot])
        assert int(together.cache_len[slot]) == length
        torch.testing.assert_close(together.kv_cache[:, slot, :length], alone.kv_cache[:, slot, :length],
                                   rtol=0, atol=1e-5)
    assert torch.equal(together.last_token, alone.last_token)
    assert torch.equal(together.seen, alone.seen)


@pytest.mark.gpu
@needs_cuda
@needs_fixtures
def test_captured_prefill_fills_slots_as_the_eager_prefill_does(fixture_model):
    """Admission as one CUDA graph per (group size, length bucket): three groups replayed into the
    same engine (each refills the static inputs; buckets 256 and 64; one row sampling) leave every
    slot's cache, counters and first token as the eager prefill does, and no pass runs eagerly."""
    config, state_dict, cases = fixture_model
    requests = [request for request, _, _ in fixture_requests(cases).values()][:4]
    requests[1] = dataclasses.replace(requests[1], top_k=5, temperature=0.8)
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float32, "cuda")
    graphed = T2SEngine(weights, max_batch=4, max_len=256, prefill_buckets=[64, 256])
    graphed.capture_graphs(greedy_modes=(True,))
    assert sorted(graphed._prefill_graphs) == [(groups, bucket) for groups in range(1, 5) for bucket in (64, 256)]

    def no_eager_pass(inputs):
        raise AssertionError("a captured prefill ran eagerly")

    graphed._prefill_pass = no_eager_pass
    eager = T2SEngine(weights, max_batch=4, max_len=256, prefill_buckets=[64, 256])
    lengths = [request.phoneme_ids.shape[0] + (0 if request.prompt_tokens is None else request.prompt_tokens.shape[0])
               for request in requests]
    short = min(range(4), key=lambda row: lengths[row])
    assert lengths[short] <= 64 < max(lengths)  # both buckets are replayed
    long = [row for row in range(4) if row != short]
    for engine in (graphed, eager):
        engine.prefill([3, 1], [requests[long[0]], requests[long[1]]])
        engine.prefill([0], [requests[long[2]]])
        engine.prefill([2], [requests[short]])
    for slot in range(4):
        length = int(eager.cache_len[slot])
        torch.testing.assert_close(graphed.kv_cache[:, slot, :length], eager.kv_cache[:, slot, :length],
                                   rtol=0, atol=1e-4)
    for name in ("cache_len", "audio_pos", "last_token", "step", "done", "seen", "tokens", "max_steps"):
        assert torch.equal(getattr(graphed, name), getattr(eager, name)), name


def _triton_device_or_skip(device: str) -> None:
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels run on the CPU under TRITON_INTERPRET=1")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("triton")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("vocab", [41, 1025])
def test_the_one_kernel_choice_equals_the_torch_sampler_and_its_bookkeeping(device, vocab):
    """The fused step's choice kernel (greedy and sampling) against ``T2SEngine._choose_and_record``:
    rows with different top-k, top-p, temperature, penalty, seen ids and EOS blocks, five steps
    from one generator seed, give the same tokens, stop flags and repetition history."""
    _triton_device_or_skip(device)
    from models.gpt_sovits.engine_triton import TritonT2SEngine

    config = T2SConfig.from_checkpoint_config({**OTHER_SHAPE, "vocab_size": vocab, "EOS": vocab - 1})
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, device)
    rows = 6
    fused, reference = (TritonT2SEngine(weights, max_batch=rows, max_len=64, length_buckets=[64], seed=11)
                        for _ in range(2))
    generator = torch.Generator().manual_seed(5)
    for engine in (fused, reference):
        engine.done.fill_(False)
        engine.early_stop.fill_(-1)
        engine.max_steps.fill_(4)  # rows stop at max_steps: rows 2-5 at once, row 1 on the 2nd call, row 0 on the 4th
        engine.step.copy_(torch.tensor([0, 2, 5, 9, 12, 20]))
        engine.sampling.eos_from_step.fill_(11)
        engine.sampling.top_k.copy_(torch.tensor([1, 3, 15, vocab, 2, 7]))
        engine.sampling.top_p.copy_(torch.tensor([1.0, 0.8, 1.0, 0.5, 0.95, 1.0]))
        engine.sampling.temperature.copy_(torch.tensor([1.0, 0.7, 1.3, 1.0, 0.5, 2.0]))
        engine.sampling.repetition_penalty.fill_(1.35)
    seen = torch.rand(rows, vocab, generator=generator) < 0.2
    for engine in (fused, reference):
        engine.seen.copy_(seen)
    for step in range(5):
        logits = (3 * torch.randn(rows, vocab, generator=generator)).to(device)
        greedy = step == 2
        fused._record(rows, logits, greedy)
        T2SEngine._choose_and_record(reference, slice(0, rows), logits, greedy)
        for name in ("tokens", "done", "stop_step", "stop_by_eos", "seen", "last_token", "step"):
            assert torch.equal(getattr(fused, name), getattr(reference, name)), (step, name)
        assert torch.equal(fused.cache_len, torch.full((rows,), step + 1, device=device))


def assert_same_steps(engines: list, cache_bucket: int, steps: int = 6) -> None:
    """Two prefilled batch-1 engines (the variant first) decode ``steps`` greedy steps: each step's
    logits equal up to float32 summation order, and the same tokens."""
    for step in range(steps):
        for engine in engines:
            engine.decode_step(1, cache_bucket, greedy=True)
        variant, reference = (engine._step_logits for engine in engines)
        assert variant.abs().max() > 0.1  # a real forward pass, not zeros
        torch.testing.assert_close(variant, reference, rtol=0, atol=1e-5 * float(reference.abs().max()))
        assert torch.equal(engines[0].tokens, engines[1].tokens), step


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fold_ffn", [False, True])
def test_the_folded_out_phase_gives_the_logits_of_the_out_phase(device, fold_ffn):
    """The persistent step without its out phase (each head's last attend program adds the head's
    out projection into sum 1 with float atomics) against the step with it: the same request, six
    steps, each step's logits equal up to float32 summation order; both take the same tokens. In the
    interpreter the head's value program always arrives last; on a GPU any may."""
    _triton_device_or_skip(device)
    from models.gpt_sovits.engine_persistent import DEFAULT_SUM_REPLICAS, PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=5), torch.float32, device)
    engines = [PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64], programs=4 * config.num_heads,
                                   phased=device == "cpu", fold_ffn=fold_ffn, fold_out=fold)
               for fold in (True, False)]
    request = other_shape_requests(config, 1)[0]
    for engine in engines:
        engine.prefill([0], [request])
    # The default replicas: one sum 1 row a head at most (one adder a head).
    assert engines[0].sum1_replicas == min(DEFAULT_SUM_REPLICAS, config.num_heads)
    assert engines[0]._step_sum1.shape == (config.num_layers, engines[0].sum1_replicas * config.hidden_dim)
    assert_same_steps(engines, 64)
    # Every head of every layer counted all of its programs once, at the last step.
    assert torch.equal(engines[0]._head_arrivals, torch.full_like(engines[0]._head_arrivals, engines[0].chunks + 2))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_folded_ffn_phase_gives_the_logits_of_the_two_phase_ffn(device):
    """The persistent step with the FFN as one phase (partials of sum 2 added by float atomics)
    against the same step with the FFN as two phases: the same request, six steps, each step's
    logits equal up to float32 summation order; both take the same tokens."""
    _triton_device_or_skip(device)
    from models.gpt_sovits.engine_persistent import DEFAULT_SUM_REPLICAS, PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=3), torch.float32, device)
    engines = [PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64],
                                   programs=4 * config.num_heads, phased=device == "cpu", fold_ffn=fold)
               for fold in (True, False)]
    request = other_shape_requests(config, 1)[0]
    for engine in engines:
        engine.prefill([0], [request])
    assert engines[1]._step_sum2.shape == (config.hidden_dim,)  # the two-phase engine keeps one row
    assert engines[0]._step_sum2.shape == (config.num_layers, DEFAULT_SUM_REPLICAS * config.hidden_dim)
    assert_same_steps(engines, 64)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("prefetch_out,sum_replicas,late_key_score",
                         [(True, 1, False), (False, 4, False), (False, 1, True), (True, 3, True)])
def test_prefetched_out_columns_and_replicated_sums_give_the_logits_of_the_plain_folded_step(
        device, prefetch_out, sum_replicas, late_key_score):
    """The folded persistent step with each head's W_o columns loaded early (right after the
    program's own product), its sum rows split into replicas (the programs adding into them in
    turn) and/or the new key scored by the head's last program, against the same step without: the
    same request, six steps, each step's logits equal up to float32 summation order; both take the
    same tokens. In the interpreter the head's value program always arrives last, after chunk 0 and
    the key program have written q and k; on a GPU any may."""
    _triton_device_or_skip(device)
    from models.gpt_sovits.engine_persistent import PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=7), torch.float32, device)
    variant, plain = (PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64],
                                          programs=4 * config.num_heads, phased=device == "cpu", **knobs)
                      for knobs in ({"prefetch_out": prefetch_out, "sum_replicas": sum_replicas,
                                     "late_key_score": late_key_score}, {}))
    request = other_shape_requests(config, 1)[0]
    for engine in (variant, plain):
        engine.prefill([0], [request])
    sum1_replicas = min(sum_replicas, config.num_heads)  # one adder a head: no more replicas than heads
    assert variant._step_sum1.shape == (config.num_layers, sum1_replicas * config.hidden_dim)
    assert variant._step_sum2.shape == (config.num_layers, sum_replicas * config.hidden_dim)
    assert_same_steps([variant, plain], 64)
    # Every replica of the last layer's sums received partials.
    for sums, replicas in ((variant._step_sum1, sum1_replicas), (variant._step_sum2, sum_replicas)):
        assert bool((sums[-1].view(replicas, config.hidden_dim).abs().amax(dim=1) > 0).all())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("programs_per_head,sum_replicas", [(4, 1), (5, 3)])
def test_the_split_out_projection_gives_the_logits_of_the_plain_folded_step(device, programs_per_head, sum_replicas):
    """The folded step with each head's out projection shared among the head's programs (each adds
    its rows of W_o times the head's attention) against the plain folded step, where the head's last
    program adds all of them: the same request, six steps, each step's logits equal up to float32
    summation order; both take the same tokens. Five programs a head: three chunks and the key and
    value programs, of which the first four hold rows and the value program none."""
    _triton_device_or_skip(device)
    from models.gpt_sovits.engine_persistent import PERSISTENT, PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=11), torch.float32, device)
    variant, plain = (PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64],
                                          programs=programs_per_head * config.num_heads, phased=device == "cpu",
                                          sum_replicas=sum_replicas, **knobs)
                      for knobs in ({"split_out": True}, {}))
    assert variant.kernel_constants(PERSISTENT)["OUT_GROUPS"] == 4
    request = other_shape_requests(config, 1)[0]
    for engine in (variant, plain):
        engine.prefill([0], [request])
    assert_same_steps([variant, plain], 64)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_l2_hints_and_barrier_variants_give_the_logits_of_the_plain_folded_step(device):
    """``out_in_l2`` (on by default with the folded out phase: streamed weights loaded evict-first,
    W_o evict-last), ``prefetch_l2`` (each tile asked of L2 a phase early), ``relaxed_polls`` (the
    barrier's polls relaxed, one acquire fence), ``arrive_first`` (the arrival before the tile
    loads) and ``hoist_loads`` (loads issued before the block barriers that follow them) change no
    arithmetic, and ``one_pass_norm`` (each LayerNorm's statistics from one reduction) only its float32
    rounding: the same request, six steps, logits equal up to float32 summation order and the same
    tokens as the folded step without any of them. The interpreter has no L2 and
    no barrier (and runs no prefetch), so on the CPU this checks the knobs' plumbing only."""
    _triton_device_or_skip(device)
    from models.gpt_sovits.engine_persistent import PERSISTENT, PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=13), torch.float32, device)
    variant, plain = (PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64],
                                          programs=4 * config.num_heads, phased=device == "cpu", **knobs)
                      for knobs in ({"relaxed_polls": True, "prefetch_l2": True, "arrive_first": True,
                                     "one_pass_norm": True},
                                    {"out_in_l2": False, "arrive_first": False, "hoist_loads": False}))
    constants = variant.kernel_constants(PERSISTENT)
    assert (constants["STREAM_EVICT"], constants["OUT_EVICT"], constants["ASM_BARRIER"], constants["PREFETCH_L2"]) == (
        "evict_first", "evict_last", 1 | 2 | 4, True)
    assert constants["HOIST_LOADS"] and not plain.kernel_constants(PERSISTENT)["HOIST_LOADS"]
    assert constants["ONE_PASS_NORM"] and not plain.kernel_constants(PERSISTENT)["ONE_PASS_NORM"]
    assert plain.kernel_constants(PERSISTENT)["OUT_EVICT"] == ""
    request = other_shape_requests(config, 1)[0]
    for engine in (variant, plain):
        engine.prefill([0], [request])
    assert_same_steps([variant, plain], 64)


def test_barrier_and_cache_knobs_refuse_the_steps_they_do_not_change():
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_persistent import PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=0), torch.float32, "cpu")
    for knobs, message in (({"relaxed_polls": True, "asm_barrier": False}, "need asm_barrier=True"),
                           ({"arrive_first": True, "asm_barrier": False}, "need asm_barrier=True"),
                           ({"out_in_l2": True, "fold_out": False}, "needs fold_out=True"),
                           ({"prefetch_l2": True, "fold_ffn": False}, "needs fold_ffn=True"),
                           ({"one_pass_norm": True, "hoist_loads": False}, "needs hoist_loads=True")):
        with pytest.raises(ValueError, match=message):
            PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64], programs=4 * config.num_heads,
                                phased=True, **knobs)


def test_split_out_refuses_the_knobs_it_replaces():
    pytest.importorskip("triton")
    from models.gpt_sovits.engine_persistent import PersistentT2SEngine

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=0), torch.float32, "cpu")

    for knobs, message in (({"fold_out": False}, "need fold_out=True"), ({"prefetch_out": True}, "replaces"),
                           ({"late_key_score": True}, "replaces")):
        with pytest.raises(ValueError, match=message):
            PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64], programs=4 * config.num_heads,
                                phased=True, split_out=True, **knobs)


def test_the_step_kernel_compiles_for_a_small_model_with_every_knob():
    """The persistent kernel compiled offline (Triton's own compiler, no GPU) for sm_90 at the test
    shape (hidden 48: under one 128-byte line of FP16 a row), FP32 weights as the tests load them, with
    every knob that adds code the interpreter never runs: the L2 prefetch once asked for no line of
    a row narrower than 64 elements and failed only on the GPU."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from models.gpt_sovits.engine_persistent import PERSISTENT, PersistentT2SEngine, _t2s_step_kernel
    from scripts.t2s_persistent_registers import aligned_arguments, signature

    config = T2SConfig.from_checkpoint_config(OTHER_SHAPE)
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=0), torch.float32, "cpu")
    types = {name: "*fp32" if kind == "*fp16" else kind for name, kind in signature().items()}
    for knobs in ({"prefetch_l2": True, "relaxed_polls": True, "timeline": True}, {"split_out": True},
                  {"asm_barrier": False, "hoist_loads": False}, {"split_out": True, "hoist_loads": False}):
        engine = PersistentT2SEngine(weights, max_batch=1, max_len=64, length_buckets=[64],
                                     programs=4 * config.num_heads, phased=True, **knobs)
        source = ASTSource(_t2s_step_kernel, types, engine.kernel_constants(PERSISTENT), aligned_arguments())
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
        assert ("prefetch.global.L2" in ptx) == knobs.get("prefetch_l2", False), knobs


def test_the_hopper_step_kernel_as_launched_keeps_its_tiles_in_registers():
    """ptxas (bundled with Triton, no GPU needed) on the persistent step kernel for sm_90a, with the
    official v2 shapes, the engine's own constexprs and a launch's alignment hints: the default folded
    kernel and the ones with ``late_key_score``, ``split_out`` and ``timeline`` fit one thread's 255 registers
    without spilling; the split kernel compiles its in-kernel head barrier and the stamped one its timer reads,
    which the interpreter never runs. A
    weight tile added across a barrier that does not fit fails here, before a GPU times it."""
    pytest.importorskip("triton")
    from scripts.t2s_persistent_registers import bundled_ptxas, compile_step, ptxas_report, step_engine

    if not bundled_ptxas().exists():
        pytest.skip("this Triton wheel bundles no ptxas")
    config = t2s_from_manifest(MANIFEST_PATH).config
    state_dict = random_state_dict(config, seed=0)
    for knobs in ({}, {"late_key_score": True}, {"split_out": True}, {"timeline": True}, {"relaxed_polls": True},
                  {"out_in_l2": False}, {"prefetch_l2": True}, {"arrive_first": True}, {"hoist_loads": False},
                  {"prefetch_out": True}, {"one_pass_norm": True}):
        report = ptxas_report(compile_step(step_engine(state_dict, config, **knobs)).asm["ptx"], "sm_90a")
        assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, (knobs, report)
        assert report["registers"] > 128, (knobs, report)  # a real kernel, compiled at 8 warps
