"""The server's model path without HTTP: what a served batch costs between the engine and the port.

    python3 scripts/replay_served_batches.py --settings '{"family": "emotivoice", "source": "teacher",
        "device": "cuda", "torch_engine": "compile", "max_batch_size": 1024, "max_batch_phonemes": 65536,
        "length_buckets": [64], "warmup_length_scales": [1.0],
        "engine_options": {"frame_groups": 32, "min_group_rows": 32, "compile_dynamic": true}}' \\
        --sizes 256 512 1024 --repeats 5 --threads 2 --seconds 20 --out $OUT/replay.json

It loads the model as `python -m serve` does (serve.engines.load_served_model; ``--settings`` are
serve.settings.ServeSettings fields as JSON), runs the server's warm-up (serve.speech.warmup_batches) and
times it, then hands batches to the model as the batcher does (serve.batching.synthesize_jobs). The
sentences are the load tester's (serve.loadtest.pick_sentences through the voice's front end; ``--sentence-set
eval_zh`` for the Mandarin ones), drawn at
random into each batch as a queue of mixed requests fills it. It reports, per batch size, the median wall
time and sentences/s of ``--repeats`` batches run one at a time; with ``--threads`` N, N model threads
running batches of the largest size together for ``--seconds`` (as serve.batches_in_flight=N runs them);
and the CUDA graphs captured at each point (models/cuda_graphs.py logs each capture): a capture in a
timed batch is a shape the warm-up missed. ``--profile`` adds the device time of one batch of the
largest size (torch.profiler: kernel time against wall time, and the top kernels). After the warm-up it
reports the heap the garbage collector tracks and one full collection's time, then freezes the heap as the
server does (``gc_freeze``) and times a full collection again.

Why: the HTTP load test gives one number for the whole server; this splits off the model thread, the
only part that touches the GPU, so a gap between the served rate and the engine's bench is placed in the
model path or outside it (HTTP, the batcher, the front end, other workers). Needs torch and the
runtime's packages (serve/gpu_wheels.txt), not a port.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit  # noqa: E402
from serve.batching import SentenceJob, synthesize_jobs  # noqa: E402
from serve.engines import load_served_model  # noqa: E402
from serve.gc_pauses import freeze_warm_heap  # noqa: E402
from serve.loadtest import pick_sentences  # noqa: E402
from serve.settings import ServeSettings  # noqa: E402
from serve.speech import capture_shapes_between, warmup_batches  # noqa: E402


class CaptureCounter(logging.Handler):
    """Counts the graph captures models.cuda_graphs logs, and their seconds: the second argument of
    GraphCache.run's record ("captured %s in %.2f s (%d graphs)")."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.count, self.seconds = 0, 0.0
        # Not ``self.lock``: that is the Handler's own, held around ``emit``; a second plain lock of that
        # name would deadlock the first capture.
        self.counts_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.counts_lock:
            self.count += 1
            self.seconds += float(record.args[1])

    def snapshot(self) -> tuple[int, float]:
        with self.counts_lock:
            return self.count, self.seconds


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def sentence_jobs(served, count: int, rng: random.Random, sentences: list[str]) -> list[SentenceJob]:
    """``count`` of the load tester's ``sentences``, as the voice's front end splits them, drawn at random."""
    utterances = [utterance for text in sentences for utterance in served.model.text_to_utterances(text)]
    return [SentenceJob(tuple(rng.choice(utterances).phoneme_ids), served.family.sampling(seed=rng.randrange(2**31)))
            for _ in range(count)]


def run_batch(served, jobs: list[SentenceJob]) -> None:
    synthesize_jobs(served.model, jobs, served.noise_channels, served.noise_device)


def one_at_a_time(served, pool: list[SentenceJob], sizes: list[int], repeats: int, rng: random.Random,
                  captures: CaptureCounter) -> dict:
    report = {}
    for size in sizes:
        times_s, captured_before = [], captures.snapshot()[0]
        for _ in range(repeats + 1):  # the first round is untimed: it meets any shape the warm-up missed
            jobs = rng.sample(pool, size)
            synchronize(served.noise_device)
            started_s = time.perf_counter()
            run_batch(served, jobs)
            synchronize(served.noise_device)
            times_s.append(time.perf_counter() - started_s)
        median_s = statistics.median(times_s[1:])
        report[str(size)] = {"median_ms": median_s * 1000, "sentences_per_s": size / median_s,
                             "first_round_ms": times_s[0] * 1000,
                             "captures": captures.snapshot()[0] - captured_before}
        print(f"batch {size}: {median_s * 1000:.1f} ms, {size / median_s:.0f} sentences/s "
              f"(first round {times_s[0] * 1000:.0f} ms, {report[str(size)]['captures']} captures)", flush=True)
    return report


def concurrent(served, pool: list[SentenceJob], size: int, threads: int, seconds: float, seed: int) -> dict:
    """``threads`` model threads running batches of ``size`` for ``seconds``: sentences/s over all."""
    done, stop_s = [], time.perf_counter() + seconds

    def loop(index: int) -> None:
        rng = random.Random(seed + index)
        while time.perf_counter() < stop_s:
            run_batch(served, rng.sample(pool, size))
            done.append(size)

    started_s = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall_s = time.perf_counter() - started_s
    return {"threads": threads, "batch": size, "batches": len(done), "wall_s": wall_s,
            "sentences_per_s": sum(done) / wall_s}


def profile_batch(served, jobs: list[SentenceJob], top: int = 15) -> dict:
    """Kernel time against wall time for one batch, and where the kernels' time goes."""
    from torch.profiler import ProfilerActivity, profile

    run_batch(served, jobs)  # shapes met, so the profile holds replays only
    synchronize(served.noise_device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started_s = time.perf_counter()
        run_batch(served, jobs)
        synchronize(served.noise_device)
        wall_s = time.perf_counter() - started_s
    averages = prof.key_averages()
    kernels = sorted((event for event in averages if event.device_time_total > 0),
                     key=lambda event: event.self_device_time_total, reverse=True)
    device_us = sum(event.self_device_time_total for event in kernels)
    cpu_ops = sorted(averages, key=lambda event: event.self_cpu_time_total, reverse=True)
    return {"batch": len(jobs), "wall_ms": wall_s * 1000, "kernel_ms": device_us / 1000,
            "top_kernels": [{"name": event.key[:120], "ms": event.self_device_time_total / 1000, "calls": event.count}
                            for event in kernels[:top]],
            "top_host_ops": [{"name": event.key[:120], "self_ms": event.self_cpu_time_total / 1000,
                              "calls": event.count} for event in cpu_ops[:top]]}


def full_collection_ms() -> float:
    """One full garbage collection's wall time: what a server pauses for when one falls due (serve/gc_pauses.py)."""
    started_s = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - started_s) * 1e3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", required=True, help="serve.settings.ServeSettings fields as JSON")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="also N model threads at the largest size")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentence-set", default="eval", help="the load tester's (serve.loadtest --sentence-set)")
    parser.add_argument("--min-words", type=int, help="in unspaced text (Chinese), characters (default: the set's)")
    parser.add_argument("--max-words", type=int, help="(default: the set's)")
    parser.add_argument("--out", type=Path, required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    settings = ServeSettings.from_json(args.settings)
    try:  # a sentence set that does not load is refused before the model loads
        sentences = pick_sentences(args.min_words, args.max_words, args.sentence_set)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    if max(args.sizes) > settings.max_batch_size:
        parser.error(f"--sizes up to {max(args.sizes)} but the settings' max_batch_size is {settings.max_batch_size}")
    captures = CaptureCounter()
    capture_log = logging.getLogger("models.cuda_graphs")
    capture_log.setLevel(logging.INFO)
    capture_log.addHandler(captures)
    echo = logging.StreamHandler()  # each capture's key and time on stderr too
    echo.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    capture_log.addHandler(echo)

    report = {"tool": "scripts/replay_served_batches.py", "provenance": origin,
              "settings": json.loads(args.settings), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if settings.device.startswith("cuda") else "cpu"}
    started_s = time.perf_counter()
    served = load_served_model(settings)
    report["load_s"] = time.perf_counter() - started_s
    batches = warmup_batches(served, settings)
    started_s = time.perf_counter()
    for index, batch in enumerate(batches):
        batch_started_s = time.perf_counter()
        run_batch(served, batch)
        synchronize(served.noise_device)
        # One line a batch: a warm-up that runs long shows which shapes took the time.
        lengths = [len(job.phoneme_ids) for job in batch]
        print(f"warm-up batch {index + 1}/{len(batches)}: {len(batch)} rows, longest {max(lengths)}, "
              f"{len(set(lengths))} lengths, {time.perf_counter() - batch_started_s:.1f} s, "
              f"{captures.snapshot()[0]} captures so far", flush=True)
    between = capture_shapes_between(served, settings)  # as the server does after its batches
    synchronize(served.noise_device)
    captured, capture_s = captures.snapshot()
    report["warmup"] = {"batches": len(batches), "rows": sum(map(len, batches)), "s": time.perf_counter() - started_s,
                        "captures": captured, "capture_s": capture_s, "shapes_captured_between": between}
    report["warmup"]["gc"] = {"tracked_objects": len(gc.get_objects()), "full_collection_ms": full_collection_ms()}
    if settings.gc_freeze:  # as the server does before it answers ready
        report["warmup"]["gc"]["frozen_objects"] = freeze_warm_heap()
        report["warmup"]["gc"]["full_collection_ms_frozen"] = full_collection_ms()
    print(f"warm-up: {report['warmup']}", flush=True)

    rng = random.Random(args.seed)
    pool = sentence_jobs(served, 4 * max(args.sizes), rng, sentences)
    report["sentence_symbols_mean"] = statistics.mean(len(job.phoneme_ids) for job in pool)
    report["one_at_a_time"] = one_at_a_time(served, pool, args.sizes, args.repeats, rng, captures)
    if args.threads:
        report["concurrent"] = concurrent(served, pool, max(args.sizes), args.threads, args.seconds, args.seed)
        print(f"concurrent: {report['concurrent']}", flush=True)
    if args.profile:
        report["profile"] = profile_batch(served, rng.sample(pool, max(args.sizes)))
        print(f"profile: wall {report['profile']['wall_ms']:.1f} ms, kernels {report['profile']['kernel_ms']:.1f} ms",
              flush=True)
    report["captures_total"] = captures.snapshot()[0]
    print_and_save_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
