"""What EmotiVoice's front end costs a loaded server, in English and in Mandarin, with and without the
Mandarin word cache, side by side on this machine.

The tiny model stands in for the engine, so the server is bound by its host side, as a GPU server is
once its engine is fast (on an H100, Mandarin requests left the GPU 72-80 % busy where English ones kept
it 95 % busy). Each arm starts the real app under uvicorn in this process, loads it from another
process with ``serve.loadtest`` (an untimed level, then the measured one) and differences the front
end's metrics over the measured level: its wall time per sentence (``tts_frontend_seconds``, waits for
the GIL included) and its thread's CPU time (``tts_frontend_cpu_seconds``), whose share of the level's
wall time is what the GIL takes from the event loop and the batcher. The arm without the cache reads
every word afresh, as the front end did before it had one. Arms run in interleaved rounds. Writes one
JSON report.

    python scripts/served_frontend_cost.py --rounds 2 --concurrency 192 --seconds 30 \\
        --out docs/results/cpu_49_served_frontend_cost.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from core.publishing import print_and_save_report  # noqa: E402
from models.emotivoice import mandarin  # noqa: E402
from scripts.served_tiny import (  # noqa: E402
    add_load_arguments,
    metric_samples,
    parse_measuring_arguments,
    run_load,
    serving,
)

# (label, sentence set, Mandarin word cache on)
ARMS = (("eval", "eval", True), ("eval_zh", "eval_zh", True), ("eval_zh_uncached", "eval_zh", False))


@contextmanager
def word_cache(enabled: bool):
    """The Mandarin front end with its word cache emptied, or bypassed for the arm's duration."""
    cached = mandarin.word_phonemes
    cached.cache_clear()
    if not enabled:
        mandarin.word_phonemes = cached.__wrapped__  # mandarin_phonemes looks the name up at each call
    try:
        yield
    finally:
        mandarin.word_phonemes = cached


def frontend_seconds(url: str) -> tuple[float, float, float]:
    """(requests, wall seconds, CPU seconds) of the front end so far."""
    wall = metric_samples(url, "tts_frontend_seconds")
    cpu = metric_samples(url, "tts_frontend_cpu_seconds")
    return (wall["tts_frontend_seconds_count"][""], wall["tts_frontend_seconds_sum"][""],
            cpu["tts_frontend_cpu_seconds_total"][""])


def run_arm(label: str, sentence_set: str, cached: bool, args: argparse.Namespace) -> dict:
    load = {"concurrency": args.concurrency, "sentences_per_request": args.sentences, "sentence_set": sentence_set}
    with word_cache(cached), serving("emotivoice", max_batch_size=args.max_batch) as (url, served):
        with tempfile.TemporaryDirectory() as scratch:
            run_load(url, served, seconds=args.warm_seconds, out=f"{scratch}/warm.json", **load)
            before = frontend_seconds(url)
            run_load(url, served, seconds=args.seconds, out=f"{scratch}/level.json", **load)
            after = frontend_seconds(url)
            level = json.loads(Path(f"{scratch}/level.json").read_text())["levels"][0]
    if not level["requests_ok"]:
        raise SystemExit(f"{label}: no request of the measured level was answered: {level['errors_by_status']}")
    requests, wall_s, cpu_s = (end - start for end, start in zip(after, before))
    sentences = requests * args.sentences
    return {"arm": label, "sentence_set": sentence_set, "word_cache": cached, "wall_s": level["wall_s"],
            "requests_ok": level["requests_ok"], "errors_by_status": level["errors_by_status"],
            "sentences_per_s": level["throughput_rps"] * args.sentences, "latency_ms": level["latency_ms"],
            "frontend_requests": int(requests), "frontend_wall_s": wall_s, "frontend_cpu_s": cpu_s,
            "frontend_wall_ms_per_sentence": wall_s / sentences * 1e3,
            "frontend_cpu_ms_per_sentence": cpu_s / sentences * 1e3,
            "frontend_cpu_share_of_wall": cpu_s / level["wall_s"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=[arm[0] for arm in ARMS], choices=[arm[0] for arm in ARMS])
    add_load_arguments(parser, concurrency=192)
    args, origin = parse_measuring_arguments(parser, argv)
    results = []
    for round_index in range(args.rounds):
        for label, sentence_set, cached in ARMS:
            if label not in args.arms:
                continue
            arm = run_arm(label, sentence_set, cached, args)
            arm["round"] = round_index
            results.append(arm)
            print(f"round {round_index} {label}: {arm['sentences_per_s']:.1f} sentences/s, front end "
                  f"{arm['frontend_cpu_ms_per_sentence']:.3f} ms of CPU a sentence "
                  f"({arm['frontend_wall_ms_per_sentence']:.3f} wall), {arm['frontend_cpu_share_of_wall']:.1%} "
                  "of the level", flush=True)
    report = {
        "tool": "scripts/served_frontend_cost.py", "argv": sys.argv[1:], "provenance": origin,
        "torch": torch.__version__,  # the machine is in the provenance
        "family": "emotivoice", "model": "the tiny model (random weights): the host side is the bottleneck",
        "arms": results}
    print_and_save_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
