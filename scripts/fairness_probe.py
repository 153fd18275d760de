"""Latency of short requests while long ones run: is the server fair between clients?

    python -m serve serve.source=original_onnx serve.port=8011 serve.access_log=false &
    python scripts/fairness_probe.py --url http://127.0.0.1:8011 --out docs/results/cpu_fairness.json

Three 5-word requests alone first; then ``--long`` requests of 4096 characters at once and,
until they all finish, one 5-word request after another (0.2 s apart). Reports P50/P95 of the
short ones under load, the long ones' times, and every failure by status, as a table and as JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx

from core.atomic_io import write_text_atomic
from core.publishing import add_allow_dirty_argument, publication_or_exit

PARAGRAPH = ("The old lighthouse keeper climbed the stairs every evening at dusk. He checked the lamp, wiped the "
             "glass, and wrote a short note in the log. Storms came often in the autumn, and ships passed close "
             "to the rocks. Nobody in the village remembered a night when the light had failed. ")
LONG_TEXT = (PARAGRAPH * 20)[:4096]
SHORT_TEXT = "Please bring the blue cup."


async def speak(client: httpx.AsyncClient, url: str, text: str) -> dict:
    """{"seconds", "status"} of one streamed speech request, read to its end."""
    started = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/audio/speech", json={
            "model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}) as response:
        async for _ in response.aiter_bytes():
            pass
    return {"seconds": time.perf_counter() - started, "status": response.status_code}


async def probe(url: str, long_requests: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        alone = [await speak(client, url, SHORT_TEXT) for _ in range(3)]
        longs = [asyncio.create_task(speak(client, url, LONG_TEXT)) for _ in range(long_requests)]
        await asyncio.sleep(1.0)
        shorts = []
        while not all(task.done() for task in longs):
            shorts.append(await speak(client, url, SHORT_TEXT))
            await asyncio.sleep(0.2)
        long_results = [task.result() for task in longs]
    served = sorted(r["seconds"] for r in shorts if r["status"] == 200)
    summary = {"short_under_load_n": len(served), "short_failures": [r for r in shorts if r["status"] != 200]}
    if served:
        summary.update(short_p50_s=statistics.median(served), short_max_s=served[-1],
                       short_p95_s=statistics.quantiles(served, n=20)[18] if len(served) > 1 else served[0])
    return {"short_alone": alone, "long": long_results, "short_under_load": shorts, **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--long", type=int, default=4, help="4096-character requests running at once")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None)
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, Path(__file__).resolve().parent.parent, args.out, args.allow_dirty)
    report = {"label": args.label, "long_requests": args.long, "long_chars": len(LONG_TEXT),
              "short_text": SHORT_TEXT, **asyncio.run(probe(args.url, args.long)),
              "provenance": origin}
    print(f"short alone: {[round(r['seconds'], 3) for r in report['short_alone']]} s")
    print(f"long: {[(r['status'], round(r['seconds'], 1)) for r in report['long']]}")
    print(f"short under load: n={report['short_under_load_n']} P50={report.get('short_p50_s', float('nan')):.2f} s "
          f"P95={report.get('short_p95_s', float('nan')):.2f} s failures={report['short_failures']}")
    if args.out:
        write_text_atomic(args.out, json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
