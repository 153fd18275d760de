"""Where the 64-stream T2S engine's admission time goes: one admission (the prefill of a group of new
requests into free slots, as one CUDA graph or eagerly) by group size, with its CUDA kernel count,
and one full-slot decode step (CUDA graphs; the wide step's kernels folded or not) with its kernel
table, on full-size random weights. GPU machine only (torch + numpy):

    PYTHONPATH=. python3 scripts/gpt_sovits_admission_cost.py --out $OUT/gpt_sovits_admission.json

The results record their provenance (core/publishing.py): on the GPU machine, whose copy of the tree
differs from the ``.git`` it carries, add ``--allow-dirty``, which records the diff's hash.

Why it exists: the continuous-batching run (scripts/bench_gpt_sovits_t2s.py --only-streams) makes
about two thirds of the tokens per second that the same step makes with every slot full; this
splits that gap between admission and the schedule's tail. ``--schedule`` (no GPU) counts the
decode steps the engine's admission rule takes for that run's requests (FIFO into the lowest free
slots, stop flags read every ``sync_every`` steps): at the full-slot step time, the most that
schedule can make per second whatever admission costs.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch

from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from models.gpt_sovits.engine_triton import TritonT2SEngine
from models.gpt_sovits.engine_weights import MANIFEST_PATH, T2SWeights, random_state_dict
from models.gpt_sovits.t2s_checkpoint import t2s_from_manifest
from scripts.bench_gpt_sovits_t2s import PHONEMES, PROMPT_TOKENS, STREAMS, make_request, stream_request_lengths

GROUP_SIZES = (1, 2, 4, 8, 16, 32)
BENCH_REQUESTS, BENCH_TOKENS, SYNC_EVERY = 5 * STREAMS, 500, 16  # bench_gpt_sovits_t2s's continuous-batching run
REPEATS = 6  # the first of each size is a warm-up
STEP_ROUNDS = 5


def schedule_steps(lengths: list[int], slots: int = STREAMS, sync_every: int = SYNC_EVERY) -> int:
    """Decode steps to finish ``lengths`` (tokens per request, in arrival order) under the engine's
    rule (T2SEngine.run): admit into free slots, run ``sync_every`` steps, free the rows that
    finished. A request's first token comes from its prefill, the rest one a step."""
    waiting, left, steps = list(lengths), [None] * slots, 0
    while waiting or any(remaining is not None for remaining in left):
        for slot in range(slots):
            if left[slot] is None and waiting:
                left[slot] = waiting.pop(0) - 1
        steps += sync_every
        left = [None if remaining is None or remaining <= sync_every else remaining - sync_every for remaining in left]
    return steps


def prefill_as_admitted(engine: TritonT2SEngine, slots: list[int], requests: list) -> None:
    """Prefill ``requests`` into ``slots`` in groups of ``prefill_batch``, as ``admit`` does."""
    for first in range(0, len(requests), engine.prefill_batch):
        engine.prefill(slots[first : first + engine.prefill_batch], requests[first : first + engine.prefill_batch])


def cuda_kernels(engine: TritonT2SEngine, slots: list[int], requests: list) -> int:
    """CUDA kernels one admission's prefills of ``requests`` into ``slots`` launch."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        prefill_as_admitted(engine, slots, requests)
        torch.cuda.synchronize()
    return sum(event.count for event in profile.key_averages() if event.device_type == torch.autograd.DeviceType.CUDA)


def admission_costs(engine: TritonT2SEngine, config) -> dict:
    rows = {}
    for group in GROUP_SIZES:
        admit_s, prefill_s = [], []
        for _ in range(REPEATS):
            for index in range(group):
                engine.submit(make_request(config, 300, seed=5000 + index))
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.admit()  # slot bookkeeping + prefill
            torch.cuda.synchronize()
            admit_s.append(time.perf_counter() - start)
            slots = engine.occupied_slots()
            requests = [make_request(config, 300, seed=5000 + index) for index in range(group)]
            start = time.perf_counter()
            prefill_as_admitted(engine, slots, requests)  # the same group's prefills alone
            torch.cuda.synchronize()
            prefill_s.append(time.perf_counter() - start)
            engine.done.fill_(True)
            engine.collect()
        kernels = cuda_kernels(engine, slots, requests)
        engine.done.fill_(True)
        engine.collect()
        rows[str(group)] = {"admit_ms": round(1000 * statistics.median(admit_s[1:]), 2),
                            "prefill_ms": round(1000 * statistics.median(prefill_s[1:]), 2),
                            "cuda_kernels_per_prefill": kernels}
        print(group, rows[str(group)], flush=True)
    return rows


@contextlib.contextmanager
def every_slot_full(engine: TritonT2SEngine, config):
    """Every slot holding a ``BENCH_TOKENS``-token request, admitted; the slots freed on exit."""
    for index in range(STREAMS):
        engine.submit(make_request(config, BENCH_TOKENS, seed=7000 + index))
    engine.admit()
    torch.cuda.synchronize()
    try:
        yield
    finally:
        engine.done.fill_(True)
        engine.collect()


def timed_steps(engine: TritonT2SEngine, steps: int) -> float:
    """Seconds for ``steps`` decode steps over the occupied slots, queue drained at both ends."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.advance(steps)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def full_slot_step_ms(engine: TritonT2SEngine, config, steps: int = 160) -> float:
    with every_slot_full(engine, config):
        return round(1000 * timed_steps(engine, steps) / steps, 3)


def step_kernel_table(engine: TritonT2SEngine, config, steps: int = 20, top: int = 12) -> dict:
    """GPU time by kernel over ``steps`` full-slot graph replays: is the step kernel- or gap-bound?"""
    with every_slot_full(engine, config):
        engine.advance(2)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            elapsed = timed_steps(engine, steps)
    kernels = [event for event in profile.key_averages() if event.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda event: event.self_device_time_total, reverse=True)
    return {"steps": steps, "wall_ms_per_step_profiled": round(1000 * elapsed / steps, 3),
            "kernel_us_per_step": round(sum(event.self_device_time_total for event in kernels) / steps, 1),
            "kernels_per_step": round(sum(event.count for event in kernels) / steps, 1),
            "top": [{"name": event.key[:90], "us_per_step": round(event.self_device_time_total / steps, 1),
                     "calls_per_step": round(event.count / steps, 1)} for event in kernels[:top]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--schedule", action="store_true", help="only count the benchmark run's decode steps (no GPU)")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    lengths = [int(length) for length in stream_request_lengths(BENCH_TOKENS, BENCH_REQUESTS)]
    steps = schedule_steps(lengths)
    schedule = {"requests": BENCH_REQUESTS, "tokens": sum(lengths), "decode_steps": steps,
                "tokens_per_step": round(sum(lengths) / steps, 2)}
    if args.schedule:
        print_and_save_report({"provenance": origin, "schedule_of_the_continuous_batching_run": schedule}, args.out)
        return
    config = t2s_from_manifest(MANIFEST_PATH).config
    weights = T2SWeights.from_state_dict(config, random_state_dict(config, seed=0), torch.float16, "cuda")
    max_len = ((PHONEMES + PROMPT_TOKENS + BENCH_TOKENS + 15) // 16) * 16
    # The engine's 64-stream step (cuBLAS products, the attention kernel over valid keys) with its
    # admissions as CUDA graphs, beside the same engine as it was: eager prefills, unfolded step.
    engines = {}
    for name, knobs, prefill in (("graphs_folded", {}, True), ("eager_unfolded", {"fused_wide_step": False}, False)):
        engines[name] = TritonT2SEngine(weights, max_batch=STREAMS, max_len=max_len, length_buckets=[max_len],
                                        fused_max_batch=1, **knobs)
        engines[name].capture_graphs(greedy_modes=(True,), prefill=prefill)
    result = {"what": "GPT-SoVITS T2S admission cost by group size (300-token requests, 60-position prefill) and "
                      "the 64-row step, FP16; graphs_folded: prefill graphs + folded wide step; eager_unfolded: the "
                      "unfolded step with eager prefills (the eager path of this tree)",
              "provenance": origin,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "admission": {name: admission_costs(engine, config) for name, engine in engines.items()},
              "schedule_of_the_continuous_batching_run": schedule}
    rounds = {name: [] for name in engines}
    for _ in range(STEP_ROUNDS):  # alternated, so a drift of the machine falls on both
        for name, engine in engines.items():
            rounds[name].append(full_slot_step_ms(engine, config))
    result["decode_step_ms_64_rows"] = {name: {"median": statistics.median(values), "rounds": values}
                                        for name, values in rounds.items()}
    result["decode_step_kernels_64_rows"] = {name: step_kernel_table(engine, config) for name, engine in engines.items()}
    print_and_save_report(result, args.out)


if __name__ == "__main__":
    main()
