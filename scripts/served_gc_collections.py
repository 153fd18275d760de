"""The garbage collector's passes inside a loaded server, at several values of
``serve.gc_full_collection_after``, side by side on this machine.

A family's tiny model stands in for the engine, so the server is bound by its host side (HTTP,
front end, batching), as a one-worker GPU server is, and makes objects at a high rate. Each arm starts
the real app under uvicorn in this process with its warm heap frozen, loads it with ``serve.loadtest``
from another process (whose objects then do not count), and reads ``tts_gc_pause_seconds`` from
/metrics before and after the measured level: collections by generation, and the GIL time they took.
Arms run in interleaved rounds. Writes one JSON report.

    python scripts/served_gc_collections.py --family emotivoice --after 10 100 --rounds 2 \
        --concurrency 192 --seconds 30 --out docs/results/cpu_44_served_gc_collections.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from core.publishing import print_and_save_report  # noqa: E402
from models.registry import FAMILIES  # noqa: E402
from scripts.served_tiny import (  # noqa: E402
    add_load_arguments,
    metric_samples,
    parse_measuring_arguments,
    run_load,
    serving,
)


GENERATIONS = ("0", "1", "2")


def collections(url: str) -> dict[str, dict[str, float]]:
    """{generation: {"count", "seconds"}} of ``tts_gc_pause_seconds`` from the server's /metrics, for every
    generation: one the server has not yet collected has no sample, and counts zero."""
    samples = metric_samples(url, "tts_gc_pause_seconds")
    return {generation: {"count": samples.get("tts_gc_pause_seconds_count", {}).get(generation, 0.0),
                         "seconds": samples.get("tts_gc_pause_seconds_sum", {}).get(generation, 0.0)}
            for generation in GENERATIONS}


def run_arm(family_name: str, after: int, args: argparse.Namespace) -> dict:
    """One server with ``gc_full_collection_after=after`` under one measured load level."""
    load = {"concurrency": args.concurrency, "sentences_per_request": args.sentences}
    with serving(family_name, max_batch_size=args.max_batch, gc_full_collection_after=after) as (url, served):
        with tempfile.TemporaryDirectory() as scratch:
            # An untimed level first: the collections of start-up and the first full pass after the freeze
            # (which waits for a quarter of the frozen heap) fall before the measured level.
            run_load(url, served, seconds=args.warm_seconds, out=f"{scratch}/warm.json", **load)
            before = collections(url)
            run_load(url, served, seconds=args.seconds, out=f"{scratch}/level.json", **load)
            after_level = collections(url)
            level = json.loads(Path(f"{scratch}/level.json").read_text())["levels"][0]
    if not level["requests_ok"]:  # a few failures stay in the report; none answered means no measurement
        raise SystemExit(f"gc_full_collection_after={after}: no request of the measured level was answered: "
                         f"{level['errors_by_status']}")
    by_generation = {generation: {"count": int(after_level[generation]["count"] - before[generation]["count"]),
                                  "seconds": after_level[generation]["seconds"] - before[generation]["seconds"]}
                     for generation in GENERATIONS}
    return {"gc_full_collection_after": after, "wall_s": level["wall_s"], "requests_ok": level["requests_ok"],
            "errors_by_status": level["errors_by_status"], "requests_per_s": level["throughput_rps"],
            "sentences_per_s": level["throughput_rps"] * args.sentences,
            "latency_ms": level["latency_ms"], "collections": by_generation,
            "gil_share_of_full_collections": by_generation["2"]["seconds"] / level["wall_s"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="emotivoice", choices=sorted(FAMILIES))
    parser.add_argument("--after", type=int, nargs="+", default=[10, 100], help="values of gc_full_collection_after")
    add_load_arguments(parser, concurrency=256)
    args, origin = parse_measuring_arguments(parser, argv)
    arms = []
    for round_index in range(args.rounds):
        for after in args.after:
            arm = run_arm(args.family, after, args)
            arm["round"] = round_index
            arms.append(arm)
            full = arm["collections"]["2"]
            print(f"round {round_index} after={after}: {arm['sentences_per_s']:.1f} sentences/s, "
                  f"{full['count']} full collections, {full['seconds'] * 1e3:.1f} ms "
                  f"({arm['gil_share_of_full_collections']:.2%})", flush=True)
    report = {
        "tool": "scripts/served_gc_collections.py", "argv": sys.argv[1:], "provenance": origin,
        "torch": torch.__version__,  # the machine is in the provenance
        "family": args.family, "model": "the family's tiny model (random weights): the host side is the bottleneck",
        "arms": arms}
    print_and_save_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
