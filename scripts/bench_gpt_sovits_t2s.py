"""T2S decode speed of GPT-SoVITS v2 at full size (random weights from the official manifest).

    PYTHONPATH=. python scripts/bench_gpt_sovits_t2s.py --device cuda --out $OUT/gpt_sovits_t2s_h200.json
    PYTHONPATH=. python scripts/bench_gpt_sovits_t2s.py --device cuda --only-streams --rounds 3 \\
        --out $OUT/gpt_sovits_streams_h200.json      # 64 streams: the engines of STREAM_ROWS
    PYTHONPATH=. python scripts/bench_gpt_sovits_t2s.py --device cpu --threads 2 --tokens 60 --repeats 3 \\
        --out docs/results/cpu_16_gpt_sovits_t2s.json

Light on purpose (torch and numpy only): it runs on a bare GPU machine. Every request is a ~60
position prefill (30 phonemes + 30 prompt tokens) and a fixed-length greedy decode with EOS
suppressed (``eos_from_step`` past the end), so each run makes exactly ``--tokens`` tokens.

CUDA, side by side in one process: the eager FP32 port (``t2s.py`` decoded by ``t2s_decode``:
growing cache, batch 1); the engine in FP32, FP16 and BF16 with CUDA graphs at batch 1 (median of
warm runs), on the cuBLAS step, on the fused Triton step (its knobs swept first at FP16) and on the
persistent one-kernel step (both grid barriers), and FP16 on the cluster step (``engine_cluster.py``, one CUDA
C++ kernel); FP16 top-k sampling; aggregate tokens/s with continuous batching over 64 slots; time to the first 25
tokens; peak VRAM; the kernels of one step; greedy token agreement of each engine with the eager
FP32 port. The JSON is rewritten after
each section, so a run cut short still leaves what it measured.

CPU: eager FP32, dynamic INT8 (models/dynamic_int8.py on the port's ``nn.Linear`` layers as the
int8_dynamic stage converts them: bert_proj, the packed q/k/v projection, out_proj and the
feed-forward pair; the output head stays float) and, for comparison, torch.ao's deprecated
``quantize_dynamic`` on the same layers; the engine without graphs in FP32 and on those INT8 layers
(what the server runs); and onnxruntime (the prefill and decode-step graphs exported from the eager port,
decoded by models/gpt_sovits/onnx_decode.py) as exported and with onnxruntime's dynamic INT8, same
run; each row the median of ``--repeats`` warm runs, one row after the other.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from core.publishing import add_allow_dirty_argument, publication_or_exit
from models.dynamic_int8 import linear_names, quantize_linears
from models.gpt_sovits.engine import T2SEngine, T2SRequest
from models.gpt_sovits.engine_weights import (
    MANIFEST_PATH,
    T2SWeights,
    random_state_dict,
)
from models.gpt_sovits.t2s import T2SConfig, Text2SemanticModel
from models.gpt_sovits.t2s_checkpoint import load_state_dict_strictly, t2s_from_manifest
from models.gpt_sovits.t2s_decode import decode
from models.sampling import AutoregressiveSampling

PHONEMES = 30
PROMPT_TOKENS = 30
TTFA_TOKENS = 25  # 25 semantic tokens = 1 s of audio at 25 Hz: a first streamed chunk
STREAMS = 64
INT8_KEEP_FLOAT = ("ar_predict_layer",)  # conf/stages/family/gpt_sovits.yaml's int8_dynamic.keep_float


def make_request(config: T2SConfig, tokens: int, seed: int, top_k: int = 1) -> T2SRequest:
    generator = torch.Generator().manual_seed(seed)
    return T2SRequest(
        phoneme_ids=torch.randint(0, config.phoneme_vocab_size, (PHONEMES,), generator=generator),
        bert_features=0.5 * torch.randn(config.bert_feature_dim, PHONEMES, generator=generator),
        prompt_tokens=torch.randint(0, config.vocab_size - 1, (PROMPT_TOKENS,), generator=generator),
        top_k=top_k,
        max_steps=tokens,
        eos_from_step=tokens,  # EOS suppressed: every run makes exactly `tokens` tokens
    )


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def agreement(tokens: torch.Tensor, reference: torch.Tensor) -> dict:
    equal = tokens == reference
    first = int((~equal).nonzero()[0]) if not bool(equal.all()) else None
    return {"fraction_equal": round(float(equal.float().mean()), 4), "first_difference_at": first,
            "identical": first is None}


def request_sampling(request: T2SRequest) -> AutoregressiveSampling:
    """The engine request's decoding settings, for the decoders that take a Sampling."""
    return AutoregressiveSampling(top_k=request.top_k, top_p=request.top_p, temperature=request.temperature,
                                  repetition_penalty=request.repetition_penalty, max_tokens=request.max_steps)


def decode_eager(model: Text2SemanticModel, request: T2SRequest) -> torch.Tensor:
    """One whole eager decode of ``request`` (prefill included): its tokens."""
    return decode(model, request.phoneme_ids, request.bert_features, request.prompt_tokens, request_sampling(request),
                  eos_from_step=request.eos_from_step).tokens


def time_eager(model: Text2SemanticModel, request: T2SRequest, device: str) -> tuple[float, torch.Tensor]:
    """Seconds for one whole eager decode (prefill included) of ``request`` and its tokens."""
    synchronize(device)
    start = time.perf_counter()
    tokens = decode_eager(model, request)
    synchronize(device)
    return time.perf_counter() - start, tokens


def cpu_row(decode_request: Callable[[T2SRequest], torch.Tensor], request: T2SRequest, warm_request: T2SRequest,
            repeats: int) -> tuple[dict, torch.Tensor]:
    """(end-to-end tokens/s of ``decode_request`` on ``request``: the median of ``repeats`` runs after one
    decode of ``warm_request``, and the last run's tokens)."""
    decode_request(warm_request)
    seconds, tokens = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = decode_request(request)
        seconds.append(time.perf_counter() - start)
    return {"end_to_end_tokens_per_s": round(request.max_steps / statistics.median(seconds), 2),
            "runs_s": [round(s, 3) for s in seconds]}, tokens


def engine_run(engine: T2SEngine, request: T2SRequest, device: str) -> tuple[float, float, torch.Tensor]:
    """(seconds end to end, seconds of decode steps after the prefill, tokens) of one request alone."""
    synchronize(device)
    start = time.perf_counter()
    request_id = engine.submit(request)
    engine.admit()
    synchronize(device)
    decode_start = time.perf_counter()
    while engine.has_work():
        engine.advance(engine.sync_every)
        engine.collect()
    end = time.perf_counter()
    return end - start, end - decode_start, engine.result(request_id).tokens


def bench_engine(engine: T2SEngine, request: T2SRequest, device: str, repeats: int) -> dict:
    engine_run(engine, request, device)  # warm
    runs = [engine_run(engine, request, device) for _ in range(repeats)]
    tokens = request.max_steps
    decode_s = statistics.median(run[1] for run in runs)
    total_s = statistics.median(run[0] for run in runs)
    return {
        "decode_tokens_per_s": round((tokens - 1) / decode_s, 1),  # token 0 comes from the prefill
        "end_to_end_tokens_per_s": round(tokens / total_s, 1),
        "step_ms": round(1000 * decode_s / (tokens - 1), 4),
        "runs_decode_s": [round(run[1], 5) for run in runs],
        "tokens": runs[-1][2],
    }


def time_to_first_tokens(engine: T2SEngine, request: T2SRequest, repeats: int) -> dict:
    """Request submitted -> its first TTFA_TOKENS tokens on the host, batch 1."""
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        request_id = engine.submit(request)
        engine.admit()
        engine.advance(TTFA_TOKENS - 1)
        first = engine.tokens_so_far(request_id)
        times.append(time.perf_counter() - start)
        if first.shape[0] != TTFA_TOKENS:
            raise RuntimeError(f"expected {TTFA_TOKENS} tokens, got {first.shape[0]}")
        engine.run()
        engine.result(request_id)
    return {"ms_median": round(1000 * statistics.median(times[1:]), 3), "ms_runs": [round(1000 * t, 3) for t in times[1:]]}


def stream_request_lengths(tokens: int, requests: int) -> np.ndarray:
    """Tokens per request of the continuous-batching run: evenly from ``tokens // 2`` to ``tokens``,
    in rising order."""
    return np.linspace(tokens // 2, tokens, requests).astype(int)


def continuous_batching(engine: T2SEngine, config: T2SConfig, tokens: int, requests: int,
                        tokens_out: list | None = None, top_k: int = 1) -> dict:
    """Requests of different lengths through 64 slots: rows leave and new ones join between steps.
    ``tokens_out``: receives each request's tokens (to compare engines); ``top_k`` > 1 samples."""
    lengths = stream_request_lengths(tokens, requests)
    batch = [make_request(config, int(length), seed=1000 + index, top_k=top_k) for index, length in enumerate(lengths)]
    engine.generate(batch[:STREAMS])  # warm
    torch.cuda.synchronize()
    start = time.perf_counter()
    results = engine.generate(batch)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    made = sum(result.tokens.shape[0] for result in results)
    if tokens_out is not None:
        tokens_out[:] = [result.tokens for result in results]
    # Every slot full and no turnover: the decode ceiling at 64 rows.
    for index in range(STREAMS):
        engine.submit(make_request(config, tokens, seed=2000 + index, top_k=top_k))
    engine.admit()
    torch.cuda.synchronize()
    decode_start = time.perf_counter()
    engine.run()
    torch.cuda.synchronize()
    decode_s = time.perf_counter() - decode_start
    return {
        "streams": STREAMS,
        "requests": requests,
        "tokens_per_request": [int(lengths.min()), int(lengths.max())],
        "aggregate_tokens_per_s": round(made / elapsed, 1),
        "wall_s": round(elapsed, 3),
        "full_batch_decode_tokens_per_s": round(STREAMS * (tokens - 1) / decode_s, 1),
    }


def stream_agreement(tokens: list[torch.Tensor], reference: list[torch.Tensor]) -> dict:
    """How far two engines' greedy tokens agree over the same requests."""
    prefixes = []
    for mine, theirs in zip(tokens, reference):
        differs = (mine[: theirs.shape[0]] != theirs[: mine.shape[0]]).nonzero()
        prefixes.append(int(differs[0]) if differs.numel() else min(mine.shape[0], theirs.shape[0]))
    return {"requests_identical": sum(torch.equal(a, b) for a, b in zip(tokens, reference)),
            "requests": len(reference),
            "median_tokens_before_first_difference": statistics.median(prefixes)}


# Continuous-batching rows of ``--only-streams``: name -> (shards, engine knobs; ``top_k`` is the
# requests'). One shard of 64 slots on the cuBLAS products with the attention kernel (the engine's
# 64-stream step, greedy and sampling top-k 15 as the official defaults do; also with admissions
# prefilled eagerly, and that with the wide step's kernels unfolded as before), the fused
# step on tensor cores at three tile widths, and the 64 slots split into shards of 32, 16 or 8 on
# their own CUDA streams (models/gpt_sovits/engine_shards.py) with the cuBLAS or the fused step.
STREAM_ROWS = {
    "cublas_triton_attention": (1, {"fused_max_batch": 1}),
    "cublas_triton_attention_top_k15": (1, {"fused_max_batch": 1, "top_k": 15}),
    "cublas_triton_attention_eager_prefill": (1, {"fused_max_batch": 1, "prefill_graphs": False}),
    "cublas_triton_attention_unfolded_eager_prefill": (1, {"fused_max_batch": 1, "fused_wide_step": False,
                                                           "prefill_graphs": False}),
    "fused_dot_n16": (1, {"fused_max_batch": STREAMS, "dot_min_batch": 16, "dot_block_n": 16}),
    "fused_dot_n32": (1, {"fused_max_batch": STREAMS, "dot_min_batch": 16, "dot_block_n": 32}),
    "fused_dot_n64": (1, {"fused_max_batch": STREAMS, "dot_min_batch": 16, "dot_block_n": 64}),
    "shards_2x32_cublas_triton_attention": (2, {"fused_max_batch": 1}),
    "shards_4x16_cublas_triton_attention": (4, {"fused_max_batch": 1}),
    "shards_4x16_fused": (4, {"fused_max_batch": 16, "dot_min_batch": 17}),
    "shards_4x16_fused_dot": (4, {"fused_max_batch": 16, "dot_min_batch": 16, "dot_block_n": 16}),
    "shards_8x8_fused": (8, {"fused_max_batch": 8}),
}


def stream_top_k(name: str) -> int:
    """The requests' top-k of a ``STREAM_ROWS`` row (1: greedy)."""
    return STREAM_ROWS[name][1].get("top_k", 1)


def stream_rounds(args: argparse.Namespace, config: T2SConfig, engine_for, result: dict) -> None:
    """Each ``--stream-rows`` engine through the continuous-batching run ``--rounds`` times,
    visiting the engines in a rotated order each round (a drift of the machine falls on each alike);
    a row's figure is the median of its rounds and ``*_spread`` their range."""
    from models.gpt_sovits.engine_shards import ShardedT2SEngines  # CUDA streams: GPU machine only

    rows = result["continuous_batching_fp16_rounds"] = {}
    engines, tokens = {}, {}
    for name in args.stream_rows:
        shards, knobs = STREAM_ROWS[name]
        engine_knobs = {key: value for key, value in knobs.items() if key != "top_k"}
        sampling = stream_top_k(name) > 1
        try:
            built = [engine_for(torch.float16, fused=True, sampling=sampling, max_batch=STREAMS // shards, **engine_knobs)]
            built += [engine_for(torch.float16, fused=True, sampling=sampling, max_batch=STREAMS // shards,
                                 weights=built[0].weights, **engine_knobs)
                      for _ in range(shards - 1)]  # one copy of the weights for every shard
            engines[name] = built[0] if shards == 1 else ShardedT2SEngines(built)
            rows[name] = {"shards": shards, "knobs": knobs, "rounds": []}
        except Exception as error:  # noqa: BLE001 - recorded in the results, the others go on
            rows[name] = {"shards": shards, "knobs": knobs, "error": f"{type(error).__name__}: {error}"[:800]}
    names = list(engines)
    for round_index in range(args.rounds):
        for name in names[round_index % len(names):] + names[: round_index % len(names)]:
            made: list = []
            try:
                rows[name]["rounds"].append(continuous_batching(engines[name], config, args.tokens,
                                                                args.stream_requests, made,
                                                                top_k=stream_top_k(name)))
                tokens[name] = made
            except Exception as error:  # noqa: BLE001
                rows[name]["error"] = f"{type(error).__name__}: {error}"[:800]
            write(result, args.out)
    reference = names[0] if names else None
    for name in names:
        measured = rows[name]["rounds"]
        for figure in ("aggregate_tokens_per_s", "full_batch_decode_tokens_per_s"):
            values = [run[figure] for run in measured]
            if values:
                rows[name][figure] = statistics.median(values)
                rows[name][f"{figure}_spread"] = round(max(values) - min(values), 1)
        same_sampler = stream_top_k(name) == stream_top_k(reference)
        if name != reference and same_sampler and name in tokens and reference in tokens:
            rows[name][f"agreement_with_{reference}"] = stream_agreement(tokens[name], tokens[reference])
    write(result, args.out)


def write(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=lambda value: value.tolist()) + "\n")


def fresh_memory() -> int:
    """Free what earlier sections left (engines hold reference cycles), reset the peak; bytes in use."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def guarded(measure, *args) -> dict:
    """``measure(*args)``, or what went wrong: one failed measurement must not end the run."""
    try:
        return measure(*args)
    except Exception as error:  # noqa: BLE001 - recorded in the results, the run goes on
        return {"error": f"{type(error).__name__}: {error}"[:800]}


def peak_mib(baseline: int) -> float:
    return round((torch.cuda.max_memory_allocated() - baseline) / 2**20, 1)


def kernel_profile(engine: T2SEngine, request: T2SRequest) -> dict:
    """CUDA kernels of one eager decode step at batch 1: how many, their summed time, the costliest."""
    request_id = engine.submit(request)
    engine.admit()
    engine.decode_step(1, engine.length_buckets[-1], True)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        engine.decode_step(1, engine.length_buckets[-1], True)
        torch.cuda.synchronize()
    engine.run()
    engine.result(request_id)
    kernels = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name[:60], []).append(event.device_time)
    costliest = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:8]
    return {
        "kernels": len(kernels),
        "kernel_time_us": round(sum(event.device_time for event in kernels), 1),
        "costliest": [{"kernel": name, "count": len(times), "total_us": round(sum(times), 1)} for name, times in costliest],
    }


def cuda_bench(args: argparse.Namespace, eager: Text2SemanticModel, state_dict: dict, result: dict) -> None:
    config, tokens = eager.config, args.tokens
    max_len = ((PHONEMES + PROMPT_TOKENS + tokens + 15) // 16) * 16
    request = make_request(config, tokens, seed=1)
    rows = result["batch1"] = {}

    def engine_for(dtype: torch.dtype, fused: bool = False, sampling: bool = False, max_batch: int = 1,
                   persistent: bool = False, weights: T2SWeights | None = None, prefill_graphs: bool = True,
                   **knobs) -> T2SEngine:
        weights = weights or T2SWeights.from_state_dict(config, state_dict, dtype, "cuda")
        if persistent:  # imported here: Triton is on the GPU machine only, not in the CPU-only install
            from models.gpt_sovits.engine_persistent import PersistentT2SEngine

            engine = PersistentT2SEngine(weights, max_batch=max_batch, max_len=max_len, length_buckets=[max_len], **knobs)
        elif fused:
            from models.gpt_sovits.engine_triton import TritonT2SEngine

            engine = TritonT2SEngine(weights, max_batch=max_batch, max_len=max_len, length_buckets=[max_len], **knobs)
        else:
            engine = T2SEngine(weights, max_batch=max_batch, max_len=max_len)
        engine.capture_graphs(greedy_modes=(False,) if sampling else (True,), prefill=prefill_graphs)
        return engine

    def measured(name: str, build, request: T2SRequest, reference: torch.Tensor | None) -> T2SEngine | None:
        baseline = fresh_memory()
        try:
            engine = build()
            row = bench_engine(engine, request, "cuda", args.repeats)
            row["vram_peak_mib"] = peak_mib(baseline)
            tokens_made = row.pop("tokens")
            if reference is not None:
                row["greedy_agreement_with_eager_fp32"] = agreement(tokens_made, reference)
        except Exception as error:  # noqa: BLE001 - a kernel that fails to build there is a result too
            engine, row = None, {"error": f"{type(error).__name__}: {error}"[:800]}
        rows[name] = row
        write(result, args.out)
        return engine

    if args.only_streams:
        stream_rounds(args, config, engine_for, result)
        return
    baseline = fresh_memory()
    eager.cuda()
    time_eager(eager, make_request(config, 20, seed=99), "cuda")  # warm
    eager_s, eager_tokens = time_eager(eager, request, "cuda")
    rows["eager_fp32"] = {"end_to_end_tokens_per_s": round(tokens / eager_s, 1), "vram_peak_mib": peak_mib(baseline)}
    eager.cpu()  # its VRAM is free for the engines' rows
    write(result, args.out)

    for name, dtype in (("engine_fp32_graphs", torch.float32), ("engine_fp16_graphs", torch.float16),
                        ("engine_bf16_graphs", torch.bfloat16)):
        engine = measured(name, lambda dtype=dtype: engine_for(dtype), request, eager_tokens)
        if engine is not None and dtype == torch.float16:
            result["time_to_first_25_tokens_fp16_b1"] = guarded(time_to_first_tokens, engine, request, args.repeats)
            result["kernel_profile_fp16_b1"] = guarded(kernel_profile, engine, request)
        del engine
    write(result, args.out)

    # The fused kernels' knobs, tried on this machine at FP16 batch 1; the fastest is used below.
    sweep = result["fused_sweep_fp16_b1"] = []
    best = None
    for programs, warps, block in ((128, 4, 128), (256, 4, 128), (128, 8, 128), (128, 4, 64), (64, 4, 256),
                                   (256, 2, 64)):
        knobs = {"linear_programs": programs, "num_warps": warps, "attention_block": block}
        fresh_memory()
        try:
            engine = engine_for(torch.float16, fused=True, **knobs)
            speed = bench_engine(engine, request, "cuda", 3)["decode_tokens_per_s"]
            del engine
        except Exception as error:  # noqa: BLE001 - a knob set that fails to build is skipped, and said
            speed, knobs["error"] = 0.0, f"{type(error).__name__}: {error}"[:300]
        sweep.append({**knobs, "decode_tokens_per_s": speed})
        if speed and (best is None or speed > best[1]):
            best = ({key: value for key, value in knobs.items() if key != "error"}, speed)
        write(result, args.out)
    if best is not None:
        knobs = best[0]
        result["fused_knobs"] = knobs
        for name, dtype in (("engine_fp16_fused_graphs", torch.float16), ("engine_bf16_fused_graphs", torch.bfloat16),
                            ("engine_fp32_fused_graphs", torch.float32)):
            engine = measured(name, lambda dtype=dtype: engine_for(dtype, fused=True, **knobs), request, eager_tokens)
            if engine is not None and dtype == torch.float16:
                result["time_to_first_25_tokens_fp16_fused_b1"] = guarded(
                    time_to_first_tokens, engine, request, args.repeats)
                result["kernel_profile_fp16_fused_b1"] = guarded(kernel_profile, engine, request)
            del engine
        write(result, args.out)

    # The whole batch-1 step as one persistent kernel (engine_persistent.py), both grid barriers;
    # unfolded, the FFN folded, and the FFN and out phases folded (the default: float atomics). The
    # row names keep the meaning they had in earlier sessions' JSONs.
    unfolded = {"fold_ffn": False, "fold_out": False}
    for name, dtype, knobs in (("engine_fp16_persistent_graphs", torch.float16, unfolded),
                               ("engine_fp16_persistent_folded_ffn_graphs", torch.float16, {"fold_out": False}),
                               ("engine_fp16_persistent_folded_ffn_out_graphs", torch.float16, {}),
                               ("engine_fp16_persistent_portable_barrier_graphs", torch.float16,
                                {**unfolded, "asm_barrier": False}),
                               ("engine_bf16_persistent_graphs", torch.bfloat16, unfolded),
                               ("engine_fp32_persistent_graphs", torch.float32, unfolded)):
        engine = measured(name, lambda dtype=dtype, knobs=knobs: engine_for(dtype, persistent=True, **knobs), request,
                          eager_tokens)
        if engine is not None:
            rows[name]["barrier_timed_out"] = engine.barrier_timed_out()
            if name == "engine_fp16_persistent_folded_ffn_out_graphs":  # the engine the server runs
                result["time_to_first_25_tokens_fp16_persistent_b1"] = guarded(
                    time_to_first_tokens, engine, request, args.repeats)
                result["kernel_profile_fp16_persistent_b1"] = guarded(kernel_profile, engine, request)
        del engine
    write(result, args.out)

    # The batch-1 step as one CUDA C++ kernel of thread-block clusters (engine_cluster.py; opt-in, its
    # defaults), beside the persistent Triton step above. A GPU that cannot hold a cluster a head records
    # the reason in the row instead.
    def cluster_engine() -> T2SEngine:
        from models.gpt_sovits.engine_cluster import ClusterT2SEngine

        weights = T2SWeights.from_state_dict(config, state_dict, torch.float16, "cuda")
        engine = ClusterT2SEngine(weights, max_batch=1, max_len=max_len, length_buckets=[max_len])
        engine.capture_graphs(greedy_modes=(True,))
        return engine

    engine = measured("engine_fp16_cluster_graphs", cluster_engine, request, eager_tokens)
    if engine is not None:
        rows["engine_fp16_cluster_graphs"].update(barrier_timed_out=engine.barrier_timed_out(),
                                                  ctas_a_head=engine.cluster)
    del engine
    write(result, args.out)

    peaks = {name: rows[name].get("vram_peak_mib") for name in rows}
    if peaks.get("engine_fp32_graphs") and peaks.get("engine_fp16_graphs"):
        result["vram_fp16_over_fp32_engine"] = round(peaks["engine_fp16_graphs"] / peaks["engine_fp32_graphs"], 3)
    if peaks.get("engine_fp32_persistent_graphs") and peaks.get("engine_fp16_persistent_graphs"):
        result["vram_fp16_over_fp32_persistent"] = round(
            peaks["engine_fp16_persistent_graphs"] / peaks["engine_fp32_persistent_graphs"], 3)
    if peaks.get("engine_fp32_fused_graphs") and peaks.get("engine_fp16_fused_graphs"):
        result["vram_fp16_over_fp32_fused"] = round(peaks["engine_fp16_fused_graphs"] / peaks["engine_fp32_fused_graphs"], 3)

    streams = result["continuous_batching_fp16"] = {}
    # cuBLAS step; the fused kernels at 64 rows; cuBLAS products with the attention kernel over
    # each row's valid keys (the Triton engine's step above fused_max_batch rows).
    for name, fused, wide in (("cublas", False, False), ("fused", True, False), ("cublas_triton_attention", True, True)):
        if fused and best is None:
            continue
        baseline = fresh_memory()
        try:
            knobs = {**best[0], "fused_max_batch": 1 if wide else STREAMS} if fused else {}
            engine = engine_for(torch.float16, fused=fused, max_batch=STREAMS, **knobs)
            streams[name] = continuous_batching(engine, config, tokens, args.stream_requests)
            streams[name]["vram_peak_mib"] = peak_mib(baseline)
            del engine
        except Exception as error:  # noqa: BLE001 - recorded in the results, the run goes on
            streams[name] = {"error": f"{type(error).__name__}: {error}"[:800]}
        write(result, args.out)

    knobs = best[0] if best is not None else None
    try:  # sampling inside a graph needs the generator registered with it (torch >= 2.6)
        engine = measured("engine_fp16_graphs_top_k15", lambda: engine_for(torch.float16, sampling=True),
                          make_request(config, tokens, seed=1, top_k=15), None)
        del engine
        if knobs is not None:
            engine = measured("engine_fp16_fused_graphs_top_k15",
                              lambda: engine_for(torch.float16, fused=True, sampling=True, **knobs),
                              make_request(config, tokens, seed=1, top_k=15), None)
            del engine
    finally:
        write(result, args.out)


def cpu_bench(args: argparse.Namespace, eager: Text2SemanticModel, state_dict: dict, result: dict) -> None:
    config, tokens = eager.config, args.tokens
    request = make_request(config, tokens, seed=1)
    warm_request = make_request(config, 5, seed=99)
    rows = result["batch1"] = {}
    rows["eager_fp32"], fp32_tokens = cpu_row(lambda r: decode_eager(eager, r), request, warm_request, args.repeats)
    write(result, args.out)
    # The int8_dynamic variant as the stage builds it and the server rebuilds it (the family's recipe:
    # every Linear layer but the output head, whose logits choose every token)
    int8 = copy.deepcopy(eager)
    quantize_linears(int8, linear_names(int8, INT8_KEEP_FLOAT)[0])
    rows["eager_dynamic_int8"], int8_tokens = cpu_row(lambda r: decode_eager(int8, r), request, warm_request,
                                                      args.repeats)
    rows["eager_dynamic_int8"]["greedy_agreement_with_eager_fp32"] = agreement(int8_tokens, fp32_tokens)
    write(result, args.out)
    # For comparison: torch.ao's deprecated quantize_dynamic on the same layers (one activation scale
    # per tensor, so a batch's rows move each other; the project does not use it)
    ao_int8 = copy.deepcopy(eager)
    ao_names = linear_names(ao_int8, INT8_KEEP_FLOAT)[0]
    torch.ao.quantization.quantize_dynamic(ao_int8, {name: torch.ao.quantization.per_channel_dynamic_qconfig
                                                     for name in ao_names}, dtype=torch.qint8, inplace=True)
    rows["eager_torch_ao_dynamic_int8"], ao_tokens = cpu_row(lambda r: decode_eager(ao_int8, r), request,
                                                             warm_request, args.repeats)
    rows["eager_torch_ao_dynamic_int8"]["greedy_agreement_with_eager_fp32"] = agreement(ao_tokens, fp32_tokens)
    write(result, args.out)
    max_len = ((PHONEMES + PROMPT_TOKENS + tokens + 15) // 16) * 16
    served_paths = (("engine_fp32_eager_steps", T2SWeights.from_state_dict(config, state_dict, torch.float32, "cpu")),
                    ("engine_dynamic_int8_eager_steps", T2SWeights.from_model(int8)))
    for name, weights in served_paths:
        row = bench_engine(T2SEngine(weights, max_batch=1, max_len=max_len), request, "cpu", repeats=args.repeats)
        tokens_made = row.pop("tokens")
        row["greedy_agreement_with_eager_fp32"] = agreement(tokens_made, fp32_tokens)
        if weights.int8_projections:
            row["greedy_agreement_with_eager_dynamic_int8"] = agreement(tokens_made, int8_tokens)
        rows[name] = row
        write(result, args.out)
    rows.update(onnxruntime_rows(eager, request, warm_request, fp32_tokens, args.threads, args.repeats))
    write(result, args.out)


def onnxruntime_rows(eager: Text2SemanticModel, request: T2SRequest, warm_request: T2SRequest,
                     fp32_tokens: torch.Tensor, threads: int, repeats: int) -> dict:
    """The prefill and decode-step graphs exported from ``eager`` and decoded in onnxruntime (CPU), as
    exported (FP32) and with onnxruntime's dynamic INT8 on their MatMul weights."""
    # Imported here, not at the top: the exporter's and quantizer's packages are absent on the bare
    # GPU machine, whose sections never reach these rows.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from export.onnx_export import export_graph
    from models.gpt_sovits.onnx_contract import DECODE_STEP, PREFILL, t2s_contracts
    from models.gpt_sovits.onnx_decode import CACHE_BUCKET, OnnxT2SDecoder

    max_len = -(-(PHONEMES + PROMPT_TOKENS + request.max_steps) // CACHE_BUCKET) * CACHE_BUCKET

    def measured(decoder: OnnxT2SDecoder) -> dict:
        row, tokens = cpu_row(lambda r: decoder.decode(r.phoneme_ids, r.bert_features, r.prompt_tokens,
                                                       request_sampling(r), eos_from_step=r.eos_from_step),
                              request, warm_request, repeats)
        return {**row, "greedy_agreement_with_eager_fp32": agreement(tokens, fp32_tokens)}

    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        contracts = t2s_contracts(eager, max_len=max_len)
        fp32 = {name: export_graph(contracts[name], Path(folder) / f"{name}.onnx") for name in (PREFILL, DECODE_STEP)}
        export_s = time.perf_counter() - started
        int8 = {name: Path(folder) / f"{name}_int8.onnx" for name in fp32}
        for name, path in fp32.items():
            quantize_dynamic(path, int8[name], weight_type=QuantType.QInt8)
        for row, paths in (("onnxruntime_fp32", fp32), ("onnxruntime_dynamic_int8", int8)):
            decoder = OnnxT2SDecoder(paths[PREFILL], paths[DECODE_STEP], threads, eager.config.eos_id)
            rows[row] = {**measured(decoder), "max_len": max_len,
                         "graph_mib": round(sum(p.stat().st_size for p in paths.values()) / 2**20, 1)}
    rows["onnxruntime_fp32"]["export_s"] = round(export_s, 1)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tokens", type=int, default=500, help="tokens decoded per request (EOS suppressed)")
    parser.add_argument("--repeats", type=int, default=5, help="timed warm runs; the median is reported")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (--device cpu)")
    parser.add_argument("--stream-requests", type=int, default=5 * STREAMS,
                        help="requests through the 64 slots in the continuous-batching run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random full-size weights")
    parser.add_argument("--only-streams", action="store_true", help="CUDA: only the continuous-batching rows "
                        "--stream-rows names, in --rounds interleaved rounds")
    parser.add_argument("--stream-rows", nargs="+", default=list(STREAM_ROWS), choices=list(STREAM_ROWS),
                        help="rows of --only-streams (the first is the reference for token agreement)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --only-streams")
    parser.add_argument("--out", type=Path, required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)

    manifest = json.loads(MANIFEST_PATH.read_text())
    eager = t2s_from_manifest(MANIFEST_PATH)  # the eager FP32 port, its keys and shapes checked against the manifest
    config = eager.config
    state_dict = random_state_dict(config, seed=args.seed)
    load_state_dict_strictly(eager, state_dict, f"random weights (seed {args.seed})")
    result = {
        "what": "GPT-SoVITS v2 T2S decode, full-size random weights from the official manifest",
        "command": "PYTHONPATH=. python scripts/bench_gpt_sovits_t2s.py " + " ".join(
            f"--{key.replace('_', '-')} {value}" for key, value in vars(args).items() if key != "out"),
        "provenance": origin,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine(),
        "config": {"layers": config.num_layers, "hidden_dim": config.hidden_dim, "heads": config.num_heads,
                   "vocab_size": config.vocab_size, "parameters": manifest["total_parameters"]},
        "request": {"phonemes": PHONEMES, "prompt_tokens": PROMPT_TOKENS, "decoded_tokens": args.tokens,
                    "sampling": "greedy (top_k=1), repetition penalty 1.35, EOS suppressed"},
    }
    if args.device == "cuda":
        result["device_count"] = torch.cuda.device_count()
        cuda_bench(args, eager, state_dict, result)
    else:
        torch.set_num_threads(args.threads)
        result["threads"] = args.threads
        # Other work on a shared machine slows every row alike; the load says how much there was.
        result["load_average_1m_at_start"] = round(os.getloadavg()[0], 2)
        cpu_bench(args, eager, state_dict, result)
        result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    write(result, args.out)
    print(json.dumps(result, indent=1, default=lambda value: value.tolist()))


if __name__ == "__main__":
    main()
