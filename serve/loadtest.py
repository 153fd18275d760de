"""Load-test a speech server on this machine: throughput, latency percentiles, time to first audio.

    python -m serve.loadtest --url http://127.0.0.1:8000 --concurrency 1,4,16 --requests 200 \
        --max-seconds 60 --stream audio --out outputs/loadtest/batched.json
    python -m serve.loadtest --url http://127.0.0.1:8000 --concurrency 1,4,16 --requests 200 \
        --max-seconds 60 --baseline outputs/loadtest/unbatched.json --out outputs/loadtest/batched.json
    .venv-pytriton/bin/python -m serve.loadtest --triton --url http://127.0.0.1:8010 --triton-model tts \
        --concurrency 1,4,16 --requests 200 --max-seconds 60 --out outputs/loadtest/pytriton.json

Each concurrency level sends at most ``--requests`` requests and starts none after
``--max-seconds`` (those in flight then finish, within ``--timeout-s``). Inputs are the project's
held-out evaluation sentences of 8 to 12 words, in turn. HTTP mode posts OpenAI-style
``/v1/audio/speech`` requests; ``--stream audio|sse`` asks for streamed audio. ``--triton`` calls a
PyTriton ``tts`` model (serve/pytriton_server.py) with tritonclient instead.

Measured per request: latency (request sent to last byte) and time to first audio: the first
byte after the WAV header (``audio``, or the whole body when not streaming), the first
``speech.audio.delta`` that carries audio (``sse``), or the whole call (Triton, which does not
stream). Non-2xx answers are counted by status, transport failures by exception name.
The report (JSON, written atomically) holds every level and the issue's targets; a table is printed.
Only loopback hosts are accepted: this tool is not for loading other people's servers.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import ipaddress
import json
import socket
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from compress.atomic_io import write_text_atomic
from texts import load_sentences

WAV_HEADER_BYTES = 44  # a streamed 16-bit PCM WAV's RIFF header before the first sample
STREAM_MODES = ("none", "audio", "sse")
RESPONSE_FORMATS = ("wav", "pcm", "flac")
# Targets from issue #5, reported beside the figures (they only mean something on the machine named).
TARGETS = {
    "h200_throughput_rps_min": 500.0,
    "h200_latency_p95_ms_max": 100.0,
    "ttfa_c1_streaming_ms_max": 20.0,
    "two_core_batching_throughput_ratio_min": 2.0,
}


class LoopbackOnlyError(ValueError):
    """The URL points somewhere other than this machine."""


def check_loopback(url: str) -> tuple[str, int]:
    """(host, port) of ``url`` when every address it resolves to is loopback; LoopbackOnlyError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r}: give http://HOST:PORT, e.g. http://127.0.0.1:8000")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)}
    except socket.gaierror as error:
        raise LoopbackOnlyError(f"--url host {parts.hostname!r} does not resolve ({error}); "
                                "use 127.0.0.1, ::1 or localhost") from error
    outside = sorted(a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside:
        raise LoopbackOnlyError(
            f"--url host {parts.hostname!r} resolves to non-loopback {outside}: the load test only drives a "
            "server on this machine (127.0.0.1, ::1 or localhost)")
    return parts.hostname, port


def pick_sentences(min_words: int = 8, max_words: int = 12, name: str = "eval") -> list[str]:
    """Sentences of ``name`` with ``min_words``..``max_words`` words: short requests, as a chat reply is."""
    chosen = [s for s in load_sentences(name) if min_words <= len(s.split()) <= max_words]
    if not chosen:
        raise ValueError(f"sentence set {name!r} has no sentence of {min_words}..{max_words} words; "
                         "widen --min-words/--max-words")
    return chosen


@dataclass
class Outcome:
    """One request as the client saw it."""

    status: str  # "200", "503", ... or "error:<ExceptionName>"
    latency_s: float
    first_audio_s: float | None = None
    audio_bytes: int = 0
    batch_size: int | None = None  # Triton mode: requests the server ran together with this one

    @property
    def ok(self) -> bool:
        return self.status.startswith("2")


def percentiles_ms(values_s: list[float]) -> dict[str, float | None]:
    """p50/p95/p99/mean/max in ms; linear interpolation between closest ranks (numpy's default)."""
    if not values_s:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    values_ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    p50, p95, p99 = np.percentile(values_ms, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99),
            "mean": float(values_ms.mean()), "max": float(values_ms.max())}


@dataclass
class LevelReport:
    concurrency: int
    requests_sent: int
    requests_ok: int
    errors_by_status: dict[str, int]
    wall_s: float
    throughput_rps: float  # successful requests per second of wall time
    latency_ms: dict[str, float | None]
    ttfa_ms: dict[str, float | None]
    audio_bytes_total: int
    stopped_by: str  # "requests" or "time"
    observed_batch_size: dict[str, float | None] = field(default_factory=dict)


def summarize(concurrency: int, outcomes: list[Outcome], wall_s: float, stopped_by: str) -> LevelReport:
    ok = [o for o in outcomes if o.ok]
    errors = Counter(o.status for o in outcomes if not o.ok)
    batches = [o.batch_size for o in ok if o.batch_size is not None]
    return LevelReport(
        concurrency=concurrency,
        requests_sent=len(outcomes),
        requests_ok=len(ok),
        errors_by_status=dict(sorted(errors.items())),
        wall_s=wall_s,
        throughput_rps=len(ok) / wall_s if wall_s > 0 else 0.0,
        latency_ms=percentiles_ms([o.latency_s for o in ok]),
        ttfa_ms=percentiles_ms([o.first_audio_s for o in ok if o.first_audio_s is not None]),
        audio_bytes_total=sum(o.audio_bytes for o in ok),
        stopped_by=stopped_by,
        observed_batch_size={"mean": float(np.mean(batches)), "max": float(max(batches))} if batches else {},
    )


class HttpSpeechClient:
    """POST /v1/audio/speech through httpx, reading the body as it arrives."""

    def __init__(self, url: str, concurrency: int, model: str, voice: str, response_format: str,
                 stream: str, timeout_s: float):
        import httpx

        self.url = url.rstrip("/")
        self.body = {"model": model, "voice": voice, "response_format": response_format}
        if stream != "none":
            self.body["stream_format"] = stream
        self.stream = stream
        self.header_bytes = WAV_HEADER_BYTES if response_format == "wav" else 0
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.AsyncClient(timeout=timeout_s, limits=limits)

    async def ready(self) -> bool:
        try:
            return (await self.client.get(f"{self.url}/readyz")).status_code == 200
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False

    async def speak(self, text: str, seed: int) -> Outcome:
        start = time.perf_counter()
        first_audio_s, audio_bytes = None, 0
        try:
            async with self.client.stream("POST", f"{self.url}/v1/audio/speech",
                                          json={**self.body, "input": text, "seed": seed}) as response:
                if response.status_code >= 300:
                    await response.aread()
                    return Outcome(str(response.status_code), time.perf_counter() - start)
                if self.stream == "sse":
                    async for line in response.aiter_lines():
                        audio_bytes += _sse_audio_bytes(line)
                        if first_audio_s is None and audio_bytes > self.header_bytes:
                            first_audio_s = time.perf_counter() - start
                else:
                    async for chunk in response.aiter_raw():
                        audio_bytes += len(chunk)
                        if first_audio_s is None and audio_bytes > self.header_bytes:
                            first_audio_s = time.perf_counter() - start
                return Outcome(str(response.status_code), time.perf_counter() - start, first_audio_s, audio_bytes)
        except Exception as error:  # noqa: BLE001 - a transport failure is a result to count
            return Outcome(f"error:{type(error).__name__}", time.perf_counter() - start)

    async def close(self) -> None:
        await self.client.aclose()


def _sse_audio_bytes(line: str) -> int:
    """Audio bytes carried by one SSE line (``data: {"type": "speech.audio.delta", "audio": b64}``)."""
    if not line.startswith("data:"):
        return 0
    try:
        event = json.loads(line[5:].strip())
    except json.JSONDecodeError:
        return 0
    if event.get("type") != "speech.audio.delta" or not event.get("audio"):
        return 0
    return len(base64.b64decode(event["audio"]))


class TritonSpeechClient:
    """The PyTriton ``tts`` model (text in, audio out) through tritonclient's asyncio HTTP client."""

    def __init__(self, url: str, model: str, timeout_s: float):
        import tritonclient.http.aio as triton_http

        parts = urlsplit(url)
        self.model = model
        self.timeout_s = timeout_s
        self.client = triton_http.InferenceServerClient(f"{parts.hostname}:{parts.port}",
                                                        conn_timeout=timeout_s)

    async def ready(self) -> bool:
        try:
            return await self.client.is_model_ready(self.model)
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False

    async def speak(self, text: str, seed: int) -> Outcome:
        import tritonclient.http as triton_http
        from tritonclient.utils import InferenceServerException

        text_input = triton_http.InferInput("text", [1, 1], "BYTES")
        text_input.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=object))
        seed_input = triton_http.InferInput("seed", [1, 1], "INT64")
        seed_input.set_data_from_numpy(np.array([[seed]], dtype=np.int64))
        start = time.perf_counter()
        try:
            result = await self.client.infer(self.model, [text_input, seed_input])
        except InferenceServerException as error:
            return Outcome(str(error.status() or "error:InferenceServerException"), time.perf_counter() - start)
        except Exception as error:  # noqa: BLE001 - a transport failure is a result to count
            return Outcome(f"error:{type(error).__name__}", time.perf_counter() - start)
        latency_s = time.perf_counter() - start
        samples = int(result.as_numpy("audio_length")[0, 0])
        batch = result.as_numpy("batch_size")
        return Outcome("200", latency_s, latency_s, samples * 4,
                       int(batch[0, 0]) if batch is not None else None)

    async def close(self) -> None:
        await self.client.close()


async def run_level(client, sentences: list[str], concurrency: int, max_requests: int,
                    max_seconds: float, first_seed: int = 0) -> LevelReport:
    """``concurrency`` workers share at most ``max_requests`` requests; none starts after ``max_seconds``."""
    outcomes: list[Outcome] = []
    issued = 0
    start = time.perf_counter()
    deadline = start + max_seconds
    stopped_by = "requests"

    async def worker():
        nonlocal issued, stopped_by
        while issued < max_requests:
            if time.perf_counter() >= deadline:
                stopped_by = "time"
                return
            index = issued
            issued += 1
            outcomes.append(await client.speak(sentences[index % len(sentences)], first_seed + index))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summarize(concurrency, outcomes, time.perf_counter() - start, stopped_by)


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def compare(levels: list[LevelReport], baseline: dict) -> list[dict]:
    """Per concurrency found in both: throughput ratio (this / baseline) and P95 change."""
    by_concurrency = {level["concurrency"]: level for level in baseline.get("levels", [])}
    rows = []
    for level in levels:
        base = by_concurrency.get(level.concurrency)
        if base is None or not base["throughput_rps"]:
            continue
        p95, base_p95 = level.latency_ms["p95"], base["latency_ms"]["p95"]
        rows.append({
            "concurrency": level.concurrency,
            "throughput_ratio": level.throughput_rps / base["throughput_rps"],
            "p95_ms": p95, "baseline_p95_ms": base_p95,
            "p95_equal_or_better": p95 is not None and base_p95 is not None and p95 <= base_p95,
        })
    return rows


def target_checks(levels: list[LevelReport], stream: str, comparison: list[dict]) -> dict:
    """The issue's targets against these figures; which machine they apply to is the reader's call."""
    checks = {"targets": TARGETS}
    best = max(levels, key=lambda level: level.throughput_rps, default=None)
    if best is not None and best.latency_ms["p95"] is not None:
        checks["h200_throughput_and_p95_met"] = (best.throughput_rps >= TARGETS["h200_throughput_rps_min"]
                                                 and best.latency_ms["p95"] <= TARGETS["h200_latency_p95_ms_max"])
    single = next((level for level in levels if level.concurrency == 1), None)
    if stream != "none" and single is not None and single.ttfa_ms["p50"] is not None:
        checks["ttfa_c1_streaming_p50_ms"] = single.ttfa_ms["p50"]
        checks["ttfa_c1_streaming_met"] = single.ttfa_ms["p50"] <= TARGETS["ttfa_c1_streaming_ms_max"]
    if comparison:
        best_ratio = max(comparison, key=lambda row: row["throughput_ratio"])
        ratio_min = TARGETS["two_core_batching_throughput_ratio_min"]
        checks["batching_ratio_met"] = best_ratio["throughput_ratio"] >= ratio_min and best_ratio["p95_equal_or_better"]
    return checks


async def run_loadtest(make_client, sentences: list[str], concurrency_levels: list[int], max_requests: int,
                       max_seconds: float, warmup_requests: int, ready_timeout_s: float) -> list[LevelReport]:
    """Wait for readiness, warm up, then run each level with ``make_client()`` (made inside the loop)."""
    client = make_client()
    try:
        ready_by = time.perf_counter() + ready_timeout_s
        while not await client.ready():
            if time.perf_counter() > ready_by:
                raise TimeoutError(f"server not ready after {ready_timeout_s:.0f} s (GET /readyz or Triton "
                                   "model readiness): is it running at --url?")
            await asyncio.sleep(0.5)
        for index in range(warmup_requests):
            await client.speak(sentences[index % len(sentences)], index)
        return [await run_level(client, sentences, concurrency, max_requests, max_seconds)
                for concurrency in concurrency_levels]
    finally:
        await client.close()


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"load test: {report['url']} ({report['mode']}, stream={report['stream']})")
    for column in ("conc", "ok/sent", "req/s", "p50 ms", "p95 ms", "p99 ms", "TTFA p50", "errors"):
        table.add_column(column, justify="right", no_wrap=True)

    def ms(value):
        return "-" if value is None else f"{value:.1f}"

    for level in report["levels"]:
        table.add_row(str(level["concurrency"]), f"{level['requests_ok']}/{level['requests_sent']}",
                      f"{level['throughput_rps']:.1f}", ms(level["latency_ms"]["p50"]),
                      ms(level["latency_ms"]["p95"]), ms(level["latency_ms"]["p99"]),
                      ms(level["ttfa_ms"]["p50"]),
                      ", ".join(f"{k}: {v}" for k, v in level["errors_by_status"].items()) or "-")
    Console().print(table)


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency {text!r}: give positive integers joined by commas, e.g. 1,4,16")
    return levels


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server, on loopback")
    parser.add_argument("--concurrency", default="1,4,16", help="levels, e.g. 1,4,16")
    parser.add_argument("--requests", type=int, default=200, help="at most this many requests per level")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="no new request after this, per level")
    parser.add_argument("--stream", default="none", choices=STREAM_MODES)
    parser.add_argument("--response-format", default="wav", choices=RESPONSE_FORMATS)
    parser.add_argument("--model", default="tts-1", help="the `model` field of HTTP requests")
    parser.add_argument("--voice", default="alloy", help="a voice id or alias the server knows")
    parser.add_argument("--triton", action="store_true", help="drive a PyTriton model with tritonclient")
    parser.add_argument("--triton-model", default="tts", help="the Triton model name (serve/pytriton_server.py)")
    parser.add_argument("--warmup", type=int, default=4, help="requests sent and discarded before measuring")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per request")
    parser.add_argument("--ready-timeout-s", type=float, default=60.0)
    parser.add_argument("--min-words", type=int, default=8)
    parser.add_argument("--max-words", type=int, default=12)
    parser.add_argument("--baseline", type=Path, help="an earlier report (e.g. without batching) to compare with")
    parser.add_argument("--label", default="", help="a name for this run in the report, e.g. batched")
    parser.add_argument("--out", type=Path, default=Path("outputs/loadtest/report.json"))
    parser.add_argument("--no-table", action="store_true")
    args = parser.parse_args(argv)
    try:
        levels = parse_levels(args.concurrency)
        check_loopback(args.url)
    except ValueError as error:
        parser.error(str(error))
    if args.requests < 1 or args.max_seconds <= 0:
        parser.error("--requests must be >= 1 and --max-seconds > 0")
    if args.triton and args.stream != "none":
        parser.error("--triton does not stream: leave --stream at none")
    sentences = pick_sentences(args.min_words, args.max_words)
    started_unix_s = time.time()
    if args.triton:
        def make_client():
            return TritonSpeechClient(args.url, args.triton_model, args.timeout_s)
    else:
        def make_client():
            return HttpSpeechClient(args.url, max(levels), args.model, args.voice, args.response_format,
                                    args.stream, args.timeout_s)
    reports = asyncio.run(run_loadtest(make_client, sentences, levels, args.requests, args.max_seconds,
                                       args.warmup, args.ready_timeout_s))
    comparison = compare(reports, json.loads(args.baseline.read_text(encoding="utf-8"))) if args.baseline else []
    report = {
        "tool": "serve.loadtest", "label": args.label, "url": args.url,
        "mode": "triton" if args.triton else "http", "stream": args.stream,
        "response_format": args.response_format, "git_revision": git_revision(),
        "started_unix_s": started_unix_s, "settings": {k: str(v) for k, v in vars(args).items()},
        "sentences": len(sentences),
        "levels": [asdict(level) for level in reports],
        "comparison_with_baseline": comparison,
        "target_checks": target_checks(reports, args.stream, comparison),
    }
    write_text_atomic(args.out, json.dumps(report, indent=2))
    if not args.no_table:
        print_table(report)
        print(f"report: {args.out}")
    return report


if __name__ == "__main__":
    main()
