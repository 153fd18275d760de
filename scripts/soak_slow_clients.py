"""Slow, incomplete and abandoning clients alongside normal traffic: does the server keep serving?

    python scripts/soak_slow_clients.py --seconds 120 --hostile 64 --normal 2 \
        --out docs/results/cpu_8_slow_client_soak.json [--serve-override serve.header_read_timeout_s=5 ...]
    python scripts/soak_slow_clients.py --only abandoner --hostile 4 --normal 0 --seconds 150 \
        --baseline-seconds 0 --incomplete-seconds 0     # one kind of client alone: whose memory is it?

Starts `python -m serve serve.source=original_onnx` on a free loopback port (default limits unless
``--serve-override`` changes them), then runs three phases, each with ``--normal`` loops of short
speech requests (one after another per loop):

1. ``baseline`` (``--baseline-seconds``): the normal requests alone;
2. ``incomplete_only`` (``--incomplete-seconds``): with ``--hostile`` incomplete connections, each
   opening a new one as soon as its last one ended: ``silent`` (connects, sends nothing),
   ``partial_head`` (half a request head), ``trickle_head`` (a head at one byte a second),
   ``stalled_body`` (95 of 10,000 declared JSON bytes), ``stalled_upload`` (99 bytes of a
   multipart upload). None of them asks for synthesis: normal latency should not move.
3. ``soak`` (``--seconds``): as 2, with 2 of them ``never_reader`` (a real 4,000-character SSE
   request on a 4 KB receive buffer, not read for 90 s, then read to its end: a server that drops
   slow readers has cut it short) and 4 ``abandoner`` (the same request, closed once the response
   starts). These ask for real synthesis, which on a small CPU slows the normal requests by the work
   itself; what must not happen is an error, a lockout, or work kept for clients that are gone.

Reports, as a table and as JSON (written atomically): per phase, the normal requests' count, P50/P99
latency and errors by status; per hostile kind, its connections, how long the server held them
(P50/max) and how they ended; every 5 s the server's resident memory, its batcher queue depth and
the machine's load average; at the end its refusal and disconnect counters, audio made and requests
in flight. Verdict ``ok``: no normal request failed, the server closed every incomplete connection
within its deadline plus ``SLACK_S``, dropped every never-reader, and held no request in flight at
the end. ``--only KIND`` makes the last phase's ``--hostile`` connections all of one kind (with
``--normal 0``, that kind alone), to tell which client a change in the server's memory comes with.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from core.atomic_io import write_text_atomic
from core.revision import provenance

REPO_ROOT = Path(__file__).resolve().parent.parent
NORMAL_TEXT = "Please bring the blue cup."
# About 4,000 characters, near serve.max_input_chars: some 200 s of audio, 12 MB of SSE, well past what
# loopback's kernel buffers hold for a client that never reads (about 2.8 MB, tests/serve/test_serve_deadlines.py).
LONG_TEXT = " ".join(["The lamp was lit at dusk."] * 150)
NEVER_READ_S = 90.0  # a never-reader reads nothing this long: synthesis, the kernel's buffers filling, then the grace
PARTIAL_HEAD = b"POST /v1/audio/speech HTTP/1.1\r\nHost: soak\r\nContent-Type: appl"
TRICKLED_HEAD = b"POST /v1/audio/speech HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n" + b"X-Pad: " + \
    b"p" * 200
STALLED_BODY = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10000\r\n\r\n" + b'{"model": "tts-1", "voice": "alloy", "input": "' + b"a" * 47)
STALLED_UPLOAD = (b"POST /v1/voices HTTP/1.1\r\nHost: soak\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n"
                  b"Content-Length: 10000\r\n\r\n" + b'--XyZ\r\nContent-Disposition: form-data; name="file"; '
                  b'filename="a.wav"\r\n\r\nRIFF' + b"\0" * 24)
# Which setting bounds each incomplete kind (the server's own defaults when not overridden).
INCOMPLETE_KINDS = {"silent": "header_read_timeout_s", "partial_head": "header_read_timeout_s",
                    "trickle_head": "header_read_timeout_s", "stalled_body": "body_read_timeout_s",
                    "stalled_upload": "body_read_timeout_s"}
SLACK_S = 5.0  # how late past its deadline a cut may be seen: the server's and this script's event loops on a loaded CPU
DEFAULT_LIMITS_S = {"header_read_timeout_s": 10.0, "body_read_timeout_s": 30.0, "slow_client_grace_s": 10.0}


def speech_request(text: str, **fields) -> bytes:
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": text, **fields}).encode()
    return (b"POST /v1/audio/speech HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    data = b""
    try:
        while chunk := await reader.read(65536):
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return data


async def hostile_connection(kind: str, host: str, port: int, limits_s: dict, stop_at_s: float) -> dict:
    """One misbehaving connection, from connect until the server ended it (or the soak did)."""
    started_s = time.monotonic()
    if kind == "never_reader":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window advertised
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    else:
        reader, writer = await asyncio.open_connection(host, port)
    ended = "closed_by_server"
    try:
        if kind == "trickle_head":
            for index in range(len(TRICKLED_HEAD)):
                writer.write(TRICKLED_HEAD[index:index + 1])
                await writer.drain()
                if await _closed_within(reader, 1.0):
                    return {"kind": kind, "held_s": time.monotonic() - started_s, "ended": ended}
        elif kind == "never_reader":
            writer.write(speech_request(LONG_TEXT, stream_format="sse", response_format="pcm"))
            await writer.drain()
            if stop_at_s - time.monotonic() < NEVER_READ_S:  # the soak ends first: not judged
                await asyncio.sleep(max(0.0, stop_at_s - time.monotonic()))
                return {"kind": kind, "held_s": None, "ended": "open_at_end"}
            await asyncio.sleep(NEVER_READ_S)
            data = await asyncio.wait_for(read_until_closed(reader), timeout=120)
            ended = "completed" if b"speech.audio.done" in data else "dropped_by_server"
            return {"kind": kind, "held_s": time.monotonic() - started_s, "ended": ended}
        elif kind == "abandoner":
            writer.write(speech_request(LONG_TEXT))
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), timeout=60)
            return {"kind": kind, "held_s": time.monotonic() - started_s, "ended": "abandoned",
                    "status": int(status_line.split()[1]) if status_line else None}
        else:
            opening = {"silent": b"", "partial_head": PARTIAL_HEAD, "stalled_body": STALLED_BODY,
                       "stalled_upload": STALLED_UPLOAD}[kind]
            writer.write(opening)
            await writer.drain()
        remaining_s = stop_at_s - time.monotonic()
        try:
            await asyncio.wait_for(read_until_closed(reader), timeout=max(remaining_s, 0.01))
        except TimeoutError:
            ended = "open_at_end"
        return {"kind": kind, "held_s": time.monotonic() - started_s, "ended": ended}
    finally:
        writer.close()


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(65536), timeout=seconds)
    except TimeoutError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    if data:  # the server's answer (a 408); the close follows
        await read_until_closed(reader)
    return True


async def hostile_loop(kind: str, host: str, port: int, limits_s: dict, stop_at_s: float, results: list) -> None:
    while time.monotonic() < stop_at_s:
        try:
            results.append(await hostile_connection(kind, host, port, limits_s, stop_at_s))
        except (TimeoutError, OSError) as error:
            results.append({"kind": kind, "held_s": None, "ended": f"client_error:{type(error).__name__}"})
            await asyncio.sleep(0.5)


async def normal_loop(client: httpx.AsyncClient, url: str, stop_at_s: float, results: list) -> None:
    while time.monotonic() < stop_at_s:
        started_s = time.monotonic()
        try:
            response = await client.post(f"{url}/v1/audio/speech", timeout=60, json={
                "model": "tts-1", "voice": "alloy", "input": NORMAL_TEXT})
            outcome = str(response.status_code) if response.content[:4] == b"RIFF" or response.status_code != 200 \
                else "200_not_audio"
        except httpx.HTTPError as error:
            outcome = type(error).__name__
        results.append({"seconds": time.monotonic() - started_s, "outcome": outcome})


def summarize_normal(results: list[dict]) -> dict:
    served = [r["seconds"] for r in results if r["outcome"] == "200"]
    return {"requests": len(results), "ok": len(served), "errors": dict(Counter(r["outcome"] for r in results
                                                                              if r["outcome"] != "200")),
            "p50_s": percentile(served, 0.5), "p99_s": percentile(served, 0.99), "max_s": max(served, default=None)}


def summarize_hostile(results: list[dict], limits_s: dict) -> dict:
    """Per kind: connections, how they ended, how long the server held them, and how many an incomplete
    kind held past its deadline (``past_deadline``)."""
    by_kind: dict[str, dict] = {}
    for kind in sorted({r["kind"] for r in results}):
        rows = [r for r in results if r["kind"] == kind]
        held = [r["held_s"] for r in rows if r["held_s"] is not None]
        by_kind[kind] = {"connections": len(rows), "ended": dict(Counter(r["ended"] for r in rows)),
                         "held_p50_s": percentile(held, 0.5), "held_max_s": max(held, default=None)}
        if kind in INCOMPLETE_KINDS:
            by_kind[kind]["deadline_s"] = limits_s[INCOMPLETE_KINDS[kind]]
            by_kind[kind]["held_past_deadline_plus_slack"] = sum(
                value > limits_s[INCOMPLETE_KINDS[kind]] + SLACK_S for value in held)
        statuses = [r.get("status") for r in rows if "status" in r]
        if statuses:
            by_kind[kind]["statuses"] = dict(Counter(str(s) for s in statuses))
    return by_kind


def server_counters(url: str) -> dict:
    counters = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(("tts_rejected_requests_total", "tts_disconnected_responses_total",
                            "tts_requests_in_flight", "tts_audio_seconds_total", "tts_http_requests_total")):
            name, value = line.rsplit(" ", 1)
            counters[name] = float(value)
    return counters


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def sample_server(url: str, pid: int, stop_at_s: float, samples: list, started_s: float) -> None:
    """Resident memory, batcher queue depth and the machine's 1-minute load average every 5 s."""
    async with httpx.AsyncClient() as client:
        while time.monotonic() < stop_at_s:
            metrics = (await client.get(f"{url}/metrics", timeout=10)).text
            depth = next((float(line.split()[-1]) for line in metrics.splitlines()
                          if line.startswith("tts_batcher_queue_depth ")), None)
            samples.append({"t_s": round(time.monotonic() - started_s, 1), "rss_mib": round(rss_mib(pid), 1),
                            "queue_depth": depth, "load_average_1min": os.getloadavg()[0]})
            await asyncio.sleep(5)


def hostile_kinds(count: int, with_synthesis: bool) -> list[str]:
    """``count`` kinds: with ``with_synthesis``, 2 never-readers and 4 abandoners at most (each asks for a long
    synthesis, which on 2 CPU cores competes with the normal requests); the rest spread over the incomplete
    kinds, which ask for no synthesis at all."""
    heavy = (["never_reader"] * 2 + ["abandoner"] * 4)[:count // 4] if with_synthesis else []
    light = list(INCOMPLETE_KINDS)
    return heavy + [light[index % len(light)] for index in range(count - len(heavy))]


async def run_phase(url: str, normal_loops: int, kinds: list[str], seconds: float, limits_s: dict) -> dict:
    host, port = url.removeprefix("http://").split(":")
    stop_at_s = time.monotonic() + seconds
    normal: list[dict] = []
    hostile: list[dict] = []
    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(normal_loop(client, url, stop_at_s, normal) for _ in range(normal_loops)),
                             *(hostile_loop(kind, host, int(port), limits_s, stop_at_s, hostile) for kind in kinds))
    return {"seconds": seconds, "hostile_kinds": dict(Counter(kinds)), "normal": summarize_normal(normal),
            "hostile": summarize_hostile(hostile, limits_s)}


async def soak(url: str, pid: int, args, limits_s: dict) -> dict:
    """Three phases: normal traffic alone, with incomplete clients only, with every kind (``args.only``: that one)."""
    started_s = time.monotonic()
    samples: list[dict] = []
    total_s = args.baseline_seconds + args.incomplete_seconds + args.seconds
    sampler = asyncio.create_task(sample_server(url, pid, started_s + total_s, samples, started_s))
    phases = {"baseline": await run_phase(url, args.normal, [], args.baseline_seconds, limits_s),
              "incomplete_only": await run_phase(url, args.normal, hostile_kinds(args.hostile, False),
                                                 args.incomplete_seconds, limits_s),
              "soak": await run_phase(url, args.normal, [args.only] * args.hostile if args.only
                                      else hostile_kinds(args.hostile, True), args.seconds, limits_s)}
    await sampler
    await asyncio.sleep(2.0)  # the last abandoned and dropped requests' synthesis winds down
    return {"phases": phases, "server_samples": samples, "server_counters": server_counters(url)}


def verdict(report: dict) -> list[str]:
    """What failed ([] when the soak passed). A connection still open when its phase ended is judged only by
    how long it had been held."""
    failures = []
    for name, phase in report["phases"].items():
        normal = phase["normal"]
        if normal["errors"] or not normal["ok"]:
            failures.append(f"{name}: normal requests failed: {normal['errors']}")
        for kind, row in phase["hostile"].items():
            if kind in INCOMPLETE_KINDS and (row["held_past_deadline_plus_slack"]
                                             or set(row["ended"]) - {"closed_by_server", "open_at_end"}):
                failures.append(f"{name}: {kind}: {row['ended']}, {row['held_past_deadline_plus_slack']} held past "
                                f"{row['deadline_s']:g} s + {SLACK_S:g} s")
            if kind == "never_reader" and (row["ended"].get("completed") or not row["ended"].get("dropped_by_server")):
                failures.append(f"{name}: never_reader: {row['ended']} (each should be dropped_by_server)")
    if report["server_counters"].get("tts_requests_in_flight", 0) != 0:
        failures.append(f"requests still in flight at the end: {report['server_counters']['tts_requests_in_flight']}")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0, help="the last phase: every kind of client")
    parser.add_argument("--baseline-seconds", type=float, default=20.0, help="the first phase: normal traffic alone")
    parser.add_argument("--incomplete-seconds", type=float, default=40.0,
                        help="the second phase: normal traffic and incomplete clients only (no synthesis asked)")
    parser.add_argument("--hostile", type=int, default=64, help="misbehaving connections open at once")
    parser.add_argument("--normal", type=int, default=2, help="normal request loops")
    parser.add_argument("--only", choices=["never_reader", "abandoner", *INCOMPLETE_KINDS], default=None,
                        help="the last phase's hostile connections all of this kind")
    parser.add_argument("--serve-override", action="append", default=[], help="a `python -m serve` override")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    limits_s = dict(DEFAULT_LIMITS_S)
    for override in args.serve_override:
        key, _, value = override.removeprefix("serve.").partition("=")
        if key in limits_s:
            limits_s[key] = float(value)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = Path(tempfile.mkdtemp(prefix="soak_slow_clients_"))
    command = [sys.executable, "-m", "serve", "serve.source=original_onnx", f"serve.port={port}",
               "serve.access_log=false", *args.serve_override, f"hydra.run.dir={workdir / 'hydra'}",
               f"paths.output_dir={workdir / 'outputs'}"]
    log_path = workdir / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline_s = time.monotonic() + 180
        while "ready:" not in log_path.read_text():
            if server.poll() is not None or time.monotonic() > deadline_s:
                raise SystemExit(f"server did not become ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        report = asyncio.run(soak(url, server.pid, args, limits_s))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    log_text = log_path.read_text()
    report = {"server_command": " ".join(command[1:]), "limits_s": limits_s, "normal_loops": args.normal,
              "normal_text": NORMAL_TEXT, "hostile_connections": args.hostile, **report,
              "server_log_tracebacks": log_text.count("Traceback"),
              "server_log_errors": sum(" ERROR " in line for line in log_text.splitlines())}
    report["failures"] = verdict(report)
    if report["server_log_tracebacks"]:
        report["failures"].append(f"{report['server_log_tracebacks']} tracebacks in the server log ({log_path})")
    report["ok"] = not report["failures"]
    report["provenance"] = provenance(REPO_ROOT)

    for name, phase in report["phases"].items():
        row = phase["normal"]
        print(f"{name} ({phase['seconds']:g} s, {sum(phase['hostile_kinds'].values())} hostile): normal "
              f"{row['ok']}/{row['requests']} ok, P50 {row['p50_s'] or float('nan'):.3f} s, "
              f"P99 {row['p99_s'] or float('nan'):.3f} s, errors {row['errors']}")
        for kind, hostile in phase["hostile"].items():
            print(f"  {kind:>15}: {hostile['connections']:4d} connections, held P50 {hostile['held_p50_s'] or 0:.1f} s, "
                  f"max {hostile['held_max_s'] or 0:.1f} s, {hostile['ended']}")
    print(f"RSS MiB: {[sample['rss_mib'] for sample in report['server_samples']]}")
    print(f"queue depth: {[sample['queue_depth'] for sample in report['server_samples']]}")
    print(f"load average: {[sample['load_average_1min'] for sample in report['server_samples']]}")
    print(f"server counters: {report['server_counters']}")
    print("ok" if report["ok"] else f"FAILED: {report['failures']}")
    if args.out:
        write_text_atomic(args.out, json.dumps(report, indent=2))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
