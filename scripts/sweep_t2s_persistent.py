"""Sweep the persistent T2S step's knobs on a GPU, beside the engine's other batch-1 steps.

    PROGRAMS=128,132 WARPS=8,4 ASM=1,0 PYTHONPATH=. python scripts/sweep_t2s_persistent.py \\
        --out $OUT/t2s_persistent_sweep.json
    FOLDS=ffn,ffn+out PYTHONPATH=. python scripts/sweep_t2s_persistent.py --out $OUT/t2s_folds.json

``FOLDS``: which phases are folded away (engine_persistent.py's ``fold_ffn`` / ``fold_out``), each
set one row: ``none``, ``ffn``, ``out`` or ``ffn+out`` (default ``none``). The other knobs, each a
comma list of values and each row one combination:

- ``PREFETCH`` (default ``0``): the engine's ``prefetch_out``, only with the out phase folded;
- ``REPLICAS`` (unset: the engine's default, 8 rows where a phase is folded): ``sum_replicas``;
- ``LATE`` (default ``0``): ``late_key_score``, only with the out phase folded;
- ``SPLIT`` (default ``0``): ``split_out``, only with the out phase folded and neither of the two above;
- ``RELAXED`` (default ``0``): ``relaxed_polls``, only with the PTX barrier;
- ``OUT_L2`` (default ``1``): ``out_in_l2`` where the out phase is folded;
- ``PREFETCH_L2`` (default ``0``): ``prefetch_l2``, only with both folds;
- ``ARRIVE`` (default ``1``): ``arrive_first`` where the barrier is the PTX one;
- ``HOIST`` (default ``1``): ``hoist_loads``;
- ``ONE_PASS`` (default ``0``): ``one_pass_norm``, only with ``HOIST=1``.

``CLUSTER=1``: after the persistent rows, a row of the CUDA C++ cluster step
(``engine_cluster.ClusterT2SEngine``) for each ``CLUSTER_REPLICAS`` value (default: ``REPLICAS``) and
each ``COPIES`` value (its ``copies``: ``before``, ``after`` or ``bulk``, the default) and each
``CLUSTER_SIZE`` value (CTAs a head; unset: the engine's choice), its tokens against the fused FP16
step's like every FP16 row's; with ``TIMELINE=1`` each is measured once more with the kernel stamping
its phases (``ClusterT2SEngine.stamp_summary``).

``KERNELS=1``: each persistent row also gets the GPU time per token of every kernel and memset of
one whole decode (torch.profiler), beside the time a token takes: what the step spends outside the
persistent kernel. ``TIMELINE=1``: each persistent row is measured once more with the kernel
stamping its barriers and attend work (``timeline=True``), and the decode's last step is summarized
per phase (models/gpt_sovits/step_timeline.py); the stamps go beside ``--out`` as
``<stem>_stamps.json``.

    FOLDS=ffn+out PROGRAMS=132 PREFETCH=0,1 REPLICAS=1,8 LATE=0,1 PYTHONPATH=. \
        python scripts/sweep_t2s_persistent.py --out $OUT/t2s_prefetch.json

Full-size random weights (the official manifest's shapes), one request of 30 phones + 30 prompt
tokens and 500 greedy tokens (EOS suppressed), median of 5 warm runs after CUDA-graph capture.
Rows: the cuBLAS engine in FP32 (the token reference), the persistent step in FP32, the fused step
in FP16 (the FP16 reference), then the persistent step in FP16 for every (programs, warps, barrier)
set. Torch and Triton only, for a bare GPU machine; ``scripts/bench_gpt_sovits_t2s.py`` is the
full benchmark.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from core.paths import REPO_ROOT
from core.revision import provenance
from models.gpt_sovits.engine import T2SEngine, T2SRequest
from models.gpt_sovits.engine_cluster import COPIES, ClusterT2SEngine
from models.gpt_sovits.engine_persistent import PersistentT2SEngine
from models.gpt_sovits.engine_triton import TritonT2SEngine
from models.gpt_sovits.engine_weights import (
    MANIFEST_PATH,
    T2SWeights,
    random_state_dict,
)
from models.gpt_sovits.step_timeline import summarize
from models.gpt_sovits.t2s_checkpoint import t2s_from_manifest

PHONES, PROMPT_TOKENS, TOKENS, REPEATS = 30, 30, 500, 5


def decode_seconds(engine: T2SEngine, request: T2SRequest) -> tuple[float, torch.Tensor]:
    """(seconds of decode steps after the prefill, tokens) of one request alone."""
    request_id = engine.submit(request)
    engine.admit()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_work():
        engine.advance(engine.sync_every)
        engine.collect()
    return time.perf_counter() - start, engine.result(request_id).tokens


def step_kernels(engine: T2SEngine, request: T2SRequest) -> dict:
    """GPU microseconds per token of each kernel (and memset) over one whole decode, warm, and their
    sum: what a token's time holds beside the gaps between them."""
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        decode_seconds(engine, request)
        torch.cuda.synchronize()
    steps = TOKENS - 1
    per_step = {event.key[:100]: {"us_per_step": round(event.device_time_total / steps, 3),
                                  "calls_per_step": round(event.count / steps, 3)}
                for event in trace.key_averages() if event.device_time_total > 0}
    ordered = dict(sorted(per_step.items(), key=lambda item: -item[1]["us_per_step"]))
    return {"kernels": ordered, "device_us_per_step": round(sum(row["us_per_step"] for row in ordered.values()), 2)}


def measure(engine: T2SEngine, request: T2SRequest, reference: torch.Tensor | None) -> tuple[dict, torch.Tensor]:
    engine.capture_graphs(greedy_modes=(True,))
    decode_seconds(engine, request)  # warm
    runs = [decode_seconds(engine, request) for _ in range(REPEATS)]
    seconds = statistics.median(run[0] for run in runs)
    tokens = runs[-1][1]
    row = {"tokens_per_s": round((TOKENS - 1) / seconds, 1), "step_us": round(1e6 * seconds / (TOKENS - 1), 2),
           "runs_s": [round(run[0], 5) for run in runs]}
    if reference is not None:
        equal = tokens == reference
        row["equal_fraction"] = round(float(equal.float().mean()), 4)
        row["first_diff"] = None if bool(equal.all()) else int((~equal).nonzero()[0])
    if isinstance(engine, PersistentT2SEngine):
        row["barrier_timed_out"] = engine.barrier_timed_out()
        if os.environ.get("KERNELS") == "1":
            row.update(step_kernels(engine, request))
    return row, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    programs_list = [int(value) for value in os.environ.get("PROGRAMS", "128").split(",")]
    warps_list = [int(value) for value in os.environ.get("WARPS", "8").split(",")]
    asm_list = [value == "1" for value in os.environ.get("ASM", "1").split(",")]
    folds_list = os.environ.get("FOLDS", "none").split(",")
    prefetch_list = [value == "1" for value in os.environ.get("PREFETCH", "0").split(",")]
    # REPLICAS unset: the engine's default (None: DEFAULT_SUM_REPLICAS where a phase is folded)
    replicas_list = [int(value) if value else None for value in os.environ.get("REPLICAS", "").split(",")]
    late_list = [value == "1" for value in os.environ.get("LATE", "0").split(",")]
    split_list = [value == "1" for value in os.environ.get("SPLIT", "0").split(",")]
    relaxed_list = [value == "1" for value in os.environ.get("RELAXED", "0").split(",")]
    l2_list = [value == "1" for value in os.environ.get("OUT_L2", "1").split(",")]
    arrive_list = [value == "1" for value in os.environ.get("ARRIVE", "1").split(",")]
    l2_prefetch_list = [value == "1" for value in os.environ.get("PREFETCH_L2", "0").split(",")]
    hoist_list = [value == "1" for value in os.environ.get("HOIST", "1").split(",")]
    one_pass_list = [value == "1" for value in os.environ.get("ONE_PASS", "0").split(",")]
    if unknown := sorted(set(folds_list) - {"none", "ffn", "out", "ffn+out"}):
        parser.error(f"FOLDS: unknown {unknown}; use none, ffn, out or ffn+out")

    config = t2s_from_manifest(MANIFEST_PATH).config
    state_dict = random_state_dict(config, seed=0)
    generator = torch.Generator().manual_seed(1)
    request = T2SRequest(torch.randint(0, config.phoneme_vocab_size, (PHONES,), generator=generator),
                         0.5 * torch.randn(config.bert_feature_dim, PHONES, generator=generator),
                         torch.randint(0, config.vocab_size - 1, (PROMPT_TOKENS,), generator=generator),
                         top_k=1, max_steps=TOKENS, eos_from_step=TOKENS)
    max_len = ((PHONES + PROMPT_TOKENS + TOKENS + 15) // 16) * 16
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "provenance": provenance(REPO_ROOT, sys.argv)}

    raw: dict[str, list] = {}  # TIMELINE: each row's stamps, ns after its first
    stamps_path = args.out.with_name(f"{args.out.stem}_stamps.json")

    def engine(kind: type, dtype: torch.dtype, **knobs) -> T2SEngine:
        weights = T2SWeights.from_state_dict(config, state_dict, dtype, "cuda")
        return kind(weights, max_batch=1, max_len=max_len, length_buckets=[max_len], **knobs)

    result["eager_cuda_graphs_fp32"], reference32 = measure(engine(T2SEngine, torch.float32), request, None)
    result["persistent_fp32"], _ = measure(engine(PersistentT2SEngine, torch.float32), request, reference32)
    result["fused_fp16"], reference16 = measure(engine(TritonT2SEngine, torch.float16), request, reference32)
    for (asm, folds, programs, warps, prefetch, replicas, late, split, relaxed, out_l2, l2_prefetch,
         arrive, hoist, one_pass) in itertools.product(asm_list, folds_list, programs_list, warps_list,
                                                       prefetch_list, replicas_list, late_list, split_list,
                                                       relaxed_list, l2_list, l2_prefetch_list, arrive_list,
                                                       hoist_list, one_pass_list):
        out_l2 = out_l2 and "out" in folds  # the hint is the folded out projection's
        if l2_prefetch and folds != "ffn+out":
            continue  # the L2 prefetch follows the two-phase layer
        if ((prefetch or late or split) and "out" not in folds) or ((replicas or 1) > 1 and folds == "none"):
            continue  # knobs of a folded phase that is not folded here
        arrive = arrive and asm  # the early arrival is the inline-PTX barrier's
        if relaxed and not asm:
            continue  # and so are relaxed polls
        if split and (prefetch or late):
            continue  # split_out replaces both
        if one_pass and not hoist:
            continue  # the one-pass LayerNorm is the hoisted one's
        name = (f"persistent_fp16_p{programs}_w{warps}_asm{int(asm)}" + ("" if folds == "none" else f"_fold_{folds}")
                + ("_prefetch_out" if prefetch else "") + ("" if replicas is None else f"_replicas{replicas}")
                + ("_late_key_score" if late else "") + ("_split_out" if split else "")
                + ("_relaxed_polls" if relaxed else "") + ("_out_in_l2" if out_l2 else "")
                + ("_prefetch_l2" if l2_prefetch else "") + ("_arrive_first" if arrive else "")
                + ("" if hoist else "_loads_not_hoisted") + ("_one_pass_norm" if one_pass else ""))
        knobs = {"programs": programs, "step_warps": warps, "asm_barrier": asm,
                 "fold_ffn": "ffn" in folds, "fold_out": "out" in folds, "prefetch_out": prefetch,
                 "sum_replicas": replicas, "late_key_score": late, "split_out": split, "relaxed_polls": relaxed,
                 "out_in_l2": out_l2, "prefetch_l2": l2_prefetch, "arrive_first": arrive, "hoist_loads": hoist,
                 "one_pass_norm": one_pass}
        result[name], _ = measure(engine(PersistentT2SEngine, torch.float16, **knobs), request, reference16)
        print(name, result[name], flush=True)
        if os.environ.get("TIMELINE") == "1":
            timed = engine(PersistentT2SEngine, torch.float16, timeline=True, **knobs)
            row, _ = measure(timed, request, reference16)
            stamps = timed.step_timeline().numpy()  # the decode's last step
            row["timeline"] = summarize(stamps, timed.step_layout, timed.program_roles())
            result[f"{name}_timeline"] = row
            raw[name] = (stamps - stamps.min()).tolist()
            stamps_path.write_text(json.dumps(raw))
            print(f"{name}_timeline", json.dumps(row["timeline"]["phases"]), flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    if os.environ.get("CLUSTER") == "1":
        copies = os.environ.get("COPIES", "bulk").split(",")
        if unknown := sorted(set(copies) - set(COPIES)):
            parser.error(f"COPIES: unknown {unknown}; use one of {COPIES}")
        cluster_replicas = [int(value) if value else None
                            for value in os.environ.get("CLUSTER_REPLICAS", os.environ.get("REPLICAS", "")).split(",")]
        sizes = [int(value) if value else None for value in os.environ.get("CLUSTER_SIZE", "").split(",")]
        for replicas, copy, cluster_size in itertools.product(cluster_replicas, copies, sizes):
            name = ("cluster_fp16" + ("" if replicas is None else f"_replicas{replicas}") + f"_copies_{copy}"
                    + ("" if cluster_size is None else f"_ctas{cluster_size}"))
            knobs = {"sum_replicas": replicas, "copies": copy, "cluster": cluster_size}
            cluster = engine(ClusterT2SEngine, torch.float16, **knobs)
            result[name], _ = measure(cluster, request, reference16)
            result[name]["registers"] = cluster.kernel.registers
            result[name]["resident_clusters"] = cluster.resident_clusters
            result[name]["ctas_a_head"] = cluster.cluster
            print(name, result[name], flush=True)
            if os.environ.get("TIMELINE") == "1":
                stamped = engine(ClusterT2SEngine, torch.float16, timeline=True, **knobs)
                row, _ = measure(stamped, request, reference16)
                row["timeline_us"] = stamped.stamp_summary()  # the decode's last step
                result[f"{name}_timeline"] = row
                print(f"{name}_timeline", json.dumps(row["timeline_us"]), flush=True)
            args.out.write_text(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
