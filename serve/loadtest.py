"""Load-test a speech server on this machine: throughput, latency percentiles, time to first audio.

    python -m serve.loadtest --url http://127.0.0.1:8000 --concurrency 1,4,16 --requests 200 \
        --max-seconds 60 --stream audio --out outputs/loadtest/batched.json
    python -m serve.loadtest --url http://127.0.0.1:8000 --concurrency 1,4,16 --requests 200 \
        --max-seconds 60 --baseline outputs/loadtest/unbatched.json --out outputs/loadtest/batched.json
    python -m serve.loadtest --url http://127.0.0.1:8000 --concurrency 16,64,128 --requests 20000 \
        --max-seconds 60 --processes 8 --out outputs/loadtest/h200.json
    .venv-pytriton/bin/python -m serve.loadtest --triton --url http://127.0.0.1:8010 --triton-model tts \
        --concurrency 1,4,16 --requests 200 --max-seconds 60 --out outputs/loadtest/pytriton.json

Each concurrency level sends at most ``--requests`` requests and starts none after
``--max-seconds`` (those in flight then finish, within ``--timeout-s``). Inputs are the project's
held-out evaluation sentences of 8 to 12 words, in turn (``--sentence-set eval_zh``: the Mandarin ones
of 13 to 19 characters instead; ``--sentences-per-request N``: N of them an input, joined with spaces;
the report's ``sentences_per_s`` counts each). HTTP mode posts OpenAI-style
``/v1/audio/speech`` requests; ``--stream audio|sse`` asks for streamed audio. ``--triton`` calls a
PyTriton ``tts`` model (serve/pytriton_server.py) with tritonclient instead.

Measured per request: latency (request sent to last byte) and time to first audio: the first
byte after the WAV header (``audio``, or the whole body when not streaming), the first
``speech.audio.delta`` that carries audio (``sse``), or the whole call (Triton, which does not
stream). Non-2xx answers are counted by status, transport failures by exception name.
The report (JSON, written atomically) holds every level and the issue's targets; a table is printed.
Only loopback hosts are accepted: this tool is not for loading other people's servers.

One asyncio process can itself cap throughput at hundreds of requests/s, so ``--processes N``
runs each level from N client processes (spawned once, kept across levels): process k gets the
concurrency slots [lo_k, hi_k) of an even split (sizes differ by at most one; levels below N use
only as many processes as slots) and the request indices i with i % concurrency in its slots, so
every index keeps its sentence and seed and each process's share matches its concurrency. They
start together behind a barrier, each honours ``--max-seconds`` from that start, and their
outcomes are summarized as one level whose wall time is the longest process's. Every level
reports ``client_cpu_utilisation``: the busiest client process's CPU seconds over its wall
seconds (near 1.0, that process used a whole core and may be what limits the figures; with
``--processes 1`` the process also holds anything else running in it).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import ipaddress
import json
import multiprocessing
import socket
import time
import unicodedata
from collections import Counter
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.revision import git_revision, provenance, save_diff
from texts import load_sentences

WAV_HEADER_BYTES = 44  # a streamed 16-bit PCM WAV's RIFF header before the first sample
STREAM_MODES = ("none", "audio", "sse")
RESPONSE_FORMATS = ("wav", "pcm", "flac")
# The serving targets, reported beside the figures (they only mean something on the machine named).
TARGETS = {
    "h200_throughput_rps_min": 500.0,
    "h200_latency_p95_ms_max": 100.0,
    "ttfa_c1_streaming_ms_max": 20.0,
    "two_core_batching_throughput_ratio_min": 2.0,
}


CLIENT_CPU_WARN = 0.9  # a client process this busy may be the bottleneck, not the server


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


SCRIPTS_WITHOUT_SPACES = ("CJK UNIFIED", "HIRAGANA", "KATAKANA")  # Chinese and Japanese: words are not spaced


def sentence_length(sentence: str) -> int:
    """Words, or in Chinese or Japanese written without spaces its characters less punctuation (a Latin
    letter or digit among them counts as one too): the unit a 15-character Mandarin sentence and an 8-word
    English one are measured in. Chinese with spaces in it counts its space-separated parts."""
    words = sentence.split()
    unspaced = len(words) == 1 and any(unicodedata.name(ch, "").startswith(SCRIPTS_WITHOUT_SPACES) for ch in sentence)
    if not unspaced:
        return len(words)
    return sum(1 for ch in sentence if not unicodedata.category(ch).startswith(("P", "Z")))


# Each held-out set's lengths when none are given: short requests, as a chat reply is (about 3 s of audio).
SENTENCE_LENGTHS = {"eval": (8, 12), "eval_zh": (13, 19)}


def pick_sentences(min_words: int | None = None, max_words: int | None = None, name: str = "eval") -> list[str]:
    """Sentences of ``name`` with ``min_words``..``max_words`` words (``sentence_length``); a bound left
    out is the set's own (``SENTENCE_LENGTHS``; 8..12 for any other set)."""
    default_min, default_max = SENTENCE_LENGTHS.get(name, SENTENCE_LENGTHS["eval"])
    min_words = default_min if min_words is None else min_words
    max_words = default_max if max_words is None else max_words
    chosen = [s for s in load_sentences(name) if min_words <= sentence_length(s) <= max_words]
    if not chosen:
        raise ValueError(f"sentence set {name!r} has no sentence of {min_words}..{max_words} words; "
                         "widen --min-words/--max-words")
    return chosen


def join_sentences(sentences: list[str], per_request: int) -> list[str]:
    """Request inputs of ``per_request`` consecutive sentences each (wrapping around), one per sentence: the
    server splits them again and batches every sentence on its own, as for an audiobook paragraph."""
    if per_request < 1:
        raise ValueError(f"--sentences-per-request {per_request}: use 1 or more")
    return [" ".join(sentences[(start + k) % len(sentences)] for k in range(per_request))
            for start in range(len(sentences))]


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
    # The busiest client process's CPU seconds / its wall seconds: near 1.0 the client may be the limit.
    client_cpu_utilisation: float | None = None
    # One entry per client process that ran this level: concurrency, requests_sent, wall_s, cpu_s,
    # cpu_utilisation.
    client_processes: list[dict] = field(default_factory=list)


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


@dataclass
class ShareResult:
    """What one client process did in one level."""

    outcomes: list[Outcome]
    wall_s: float
    cpu_s: float
    stopped_by: str
    concurrency: int

    def process_row(self) -> dict:
        return {"concurrency": self.concurrency, "requests_sent": len(self.outcomes), "wall_s": self.wall_s,
                "cpu_s": self.cpu_s, "cpu_utilisation": self.cpu_s / self.wall_s if self.wall_s > 0 else None}


async def run_share(client, sentences: list[str], concurrency: int, indices, max_seconds: float,
                    first_seed: int = 0) -> ShareResult:
    """``concurrency`` workers send the requests ``indices`` (in order); none starts after ``max_seconds``.

    Request ``index`` speaks ``sentences[index % len(sentences)]`` with seed ``first_seed + index``.
    """
    outcomes: list[Outcome] = []
    issued = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    deadline = start + max_seconds
    stopped_by = "requests"

    async def worker():
        nonlocal issued, stopped_by
        while issued < len(indices):
            if time.perf_counter() >= deadline:
                stopped_by = "time"
                return
            index = indices[issued]
            issued += 1
            outcomes.append(await client.speak(sentences[index % len(sentences)], first_seed + index))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall_s = time.perf_counter() - start
    return ShareResult(outcomes, wall_s, time.process_time() - cpu_start, stopped_by, concurrency)


def merge_shares(concurrency: int, shares: list[ShareResult]) -> LevelReport:
    """One level from the client processes' shares: summarize() over all outcomes, wall = the longest."""
    level = summarize(concurrency, [outcome for share in shares for outcome in share.outcomes],
                      max(share.wall_s for share in shares),
                      "time" if any(share.stopped_by == "time" for share in shares) else "requests")
    level.client_processes = [share.process_row() for share in shares]
    utilisations = [row["cpu_utilisation"] for row in level.client_processes if row["cpu_utilisation"] is not None]
    level.client_cpu_utilisation = max(utilisations) if utilisations else None
    return level


async def run_level(client, sentences: list[str], concurrency: int, max_requests: int,
                    max_seconds: float, first_seed: int = 0) -> LevelReport:
    """``concurrency`` workers share at most ``max_requests`` requests; none starts after ``max_seconds``."""
    share = await run_share(client, sentences, concurrency, range(max_requests), max_seconds, first_seed)
    return merge_shares(concurrency, [share])


def split_level(concurrency: int, processes: int, max_requests: int) -> list[tuple[int, list[int]]]:
    """(concurrency, request indices) per client process for one level; processes without a slot are left out.

    The ``concurrency`` slots are split evenly (sizes differ by at most one, summing to ``concurrency``);
    request i belongs to the process holding slot ``i % concurrency``, so the indices partition
    ``range(max_requests)`` in proportion to each process's concurrency.
    """
    used = min(processes, concurrency)
    sizes = [concurrency // used + (1 if k < concurrency % used else 0) for k in range(used)]
    owner = [k for k, size in enumerate(sizes) for _ in range(size)]  # slot -> process
    indices: list[list[int]] = [[] for _ in range(used)]
    for index in range(max_requests):
        indices[owner[index % concurrency]].append(index)
    return list(zip(sizes, indices))


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
    measured = [level for level in levels if level.latency_ms["p95"] is not None]
    if measured:
        # Any level counts: the highest throughput usually comes at a concurrency past the P95 bound.
        meeting = [level.concurrency for level in measured
                   if level.throughput_rps >= TARGETS["h200_throughput_rps_min"]
                   and level.latency_ms["p95"] <= TARGETS["h200_latency_p95_ms_max"] and not level.errors_by_status]
        checks["h200_throughput_and_p95_met"] = bool(meeting)
        checks["h200_levels_meeting_throughput_and_p95"] = meeting
    single = next((level for level in levels if level.concurrency == 1), None)
    if stream != "none" and single is not None and single.ttfa_ms["p50"] is not None:
        checks["ttfa_c1_streaming_p50_ms"] = single.ttfa_ms["p50"]
        checks["ttfa_c1_streaming_met"] = single.ttfa_ms["p50"] <= TARGETS["ttfa_c1_streaming_ms_max"]
    if comparison:
        best_ratio = max(comparison, key=lambda row: row["throughput_ratio"])
        ratio_min = TARGETS["two_core_batching_throughput_ratio_min"]
        checks["batching_ratio_met"] = best_ratio["throughput_ratio"] >= ratio_min and best_ratio["p95_equal_or_better"]
    return checks


async def wait_ready(client, ready_timeout_s: float) -> None:
    ready_by = time.perf_counter() + ready_timeout_s
    while not await client.ready():
        if time.perf_counter() > ready_by:
            raise TimeoutError(f"server not ready after {ready_timeout_s:.0f} s (GET /readyz or Triton "
                               "model readiness): is it running at --url?")
        await asyncio.sleep(0.5)


async def run_loadtest(make_client, sentences: list[str], concurrency_levels: list[int], max_requests: int,
                       max_seconds: float, warmup_requests: int, ready_timeout_s: float) -> list[LevelReport]:
    """Wait for readiness, warm up, then run each level with ``make_client()`` (made inside the loop)."""
    client = make_client()
    try:
        await wait_ready(client, ready_timeout_s)
        for index in range(warmup_requests):
            await client.speak(sentences[index % len(sentences)], index)
        return [await run_level(client, sentences, concurrency, max_requests, max_seconds)
                for concurrency in concurrency_levels]
    finally:
        await client.close()


def make_client(config: dict, concurrency: int):
    """A client from a picklable description (``config``), so spawned processes can build their own."""
    if config["mode"] == "triton":
        return TritonSpeechClient(config["url"], config["triton_model"], config["timeout_s"])
    return HttpSpeechClient(config["url"], concurrency, config["model"], config["voice"],
                            config["response_format"], config["stream"], config["timeout_s"])


def _client_process(conn, barrier, config: dict, concurrency: int, sentences: list[str],
                    ready_timeout_s: float, barrier_timeout_s: float) -> None:
    """A spawned client process: build a client, say "ready", then run each level's share it is sent."""
    try:
        asyncio.run(_client_process_loop(conn, barrier, config, concurrency, sentences, ready_timeout_s,
                                         barrier_timeout_s))
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which stops the run
        try:
            conn.send(("error", f"{type(error).__name__}: {error}"))
        except (OSError, ValueError):
            pass
    finally:
        conn.close()


async def _client_process_loop(conn, barrier, config, concurrency, sentences, ready_timeout_s,
                               barrier_timeout_s) -> None:
    client = make_client(config, concurrency)
    try:
        await wait_ready(client, ready_timeout_s)  # also opens this process's first connection
        conn.send(("ready", None))
        while (job := conn.recv()) is not None:
            share_concurrency, indices, max_seconds = job
            barrier.wait(barrier_timeout_s)  # every process starts the level together
            if not share_concurrency:
                conn.send(("share", None))
                continue
            share = await run_share(client, sentences, share_concurrency, indices, max_seconds)
            share.outcomes = [astuple(outcome) for outcome in share.outcomes]  # plain tuples travel lighter
            conn.send(("share", asdict(share)))
    finally:
        await client.close()


def _receive(conn, process, timeout_s: float, expect: str):
    """The next message from a client process; RuntimeError when it failed, died or went silent."""
    waited_until = time.monotonic() + timeout_s
    while not conn.poll(0.2):
        if not process.is_alive() and not conn.poll(0):
            raise RuntimeError(f"{process.name} exited (code {process.exitcode}) without answering")
        if time.monotonic() > waited_until:
            raise RuntimeError(f"{process.name} sent nothing for {timeout_s:.0f} s")
    try:
        kind, payload = conn.recv()
    except EOFError as error:
        raise RuntimeError(f"{process.name} closed its pipe (code {process.exitcode})") from error
    if kind == "error":
        raise RuntimeError(f"{process.name} failed: {payload}")
    if kind != expect:
        raise RuntimeError(f"{process.name} sent {kind!r}, expected {expect!r}")
    return payload


def run_loadtest_processes(config: dict, sentences: list[str], concurrency_levels: list[int], max_requests: int,
                           max_seconds: float, warmup_requests: int, ready_timeout_s: float,
                           processes: int) -> list[LevelReport]:
    """run_loadtest() with each level split over ``processes`` spawned client processes (see the docstring).

    This process waits for readiness and sends the warm-up requests; the client processes, spawned
    once, run every level and send back their outcomes, which are merged as one process's would be.
    """
    splits = {concurrency: split_level(concurrency, processes, max_requests) for concurrency in concurrency_levels}
    used = max(len(split) for split in splits.values())
    slots = [max((split[k][0] for split in splits.values() if k < len(split)), default=1) for k in range(used)]
    context = multiprocessing.get_context("spawn")
    barrier_timeout_s = ready_timeout_s + 120.0
    barrier = context.Barrier(used)
    workers, conns = [], []
    try:
        for k in range(used):
            parent_end, child_end = context.Pipe()
            worker = context.Process(target=_client_process, name=f"loadtest-client-{k}", daemon=True,
                                     args=(child_end, barrier, config, slots[k], sentences, ready_timeout_s,
                                           barrier_timeout_s))
            worker.start()
            child_end.close()
            workers.append(worker)
            conns.append(parent_end)
        # Readiness and warm-up from here while the client processes start.
        asyncio.run(run_loadtest(lambda: make_client(config, 1), sentences, [], max_requests, max_seconds,
                                 warmup_requests, ready_timeout_s))
        for conn, worker in zip(conns, workers):
            _receive(conn, worker, ready_timeout_s + 120.0, "ready")
        reports = []
        for concurrency in concurrency_levels:
            split = splits[concurrency]
            for k, conn in enumerate(conns):
                conn.send(split[k] + (max_seconds,) if k < len(split) else (0, [], max_seconds))
            level_timeout_s = max_seconds + config["timeout_s"] + barrier_timeout_s + 60.0
            shares = [_receive(conn, worker, level_timeout_s, "share") for conn, worker in zip(conns, workers)]
            reports.append(merge_shares(concurrency, [
                ShareResult(**{**share, "outcomes": [Outcome(*row) for row in share["outcomes"]]})
                for share in shares if share is not None]))
        for conn in conns:
            conn.send(None)
        for worker in workers:
            worker.join(timeout=30)
        return reports
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=10)
        for conn in conns:
            conn.close()


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"load test: {report['url']} ({report['mode']}, stream={report['stream']})")
    for column in ("conc", "ok/sent", "req/s", "p50 ms", "p95 ms", "p99 ms", "TTFA p50", "cpu", "errors"):
        table.add_column(column, justify="right", no_wrap=True)

    def ms(value):
        return "-" if value is None else f"{value:.1f}"

    def percent(value):
        return "-" if value is None else f"{100 * value:.0f}%"

    for level in report["levels"]:
        table.add_row(str(level["concurrency"]), f"{level['requests_ok']}/{level['requests_sent']}",
                      f"{level['throughput_rps']:.1f}", ms(level["latency_ms"]["p50"]),
                      ms(level["latency_ms"]["p95"]), ms(level["latency_ms"]["p99"]),
                      ms(level["ttfa_ms"]["p50"]), percent(level.get("client_cpu_utilisation")),
                      ", ".join(f"{k}: {v}" for k, v in level["errors_by_status"].items()) or "-")
    Console().print(table)
    if report.get("sentences_per_request", 1) > 1:
        Console().print(f"{report['sentences_per_request']} sentences a request; sentences/s by concurrency: "
                        + ", ".join(f"{level}: {rate:.1f}" for level, rate in report["sentences_per_s"].items()))
    busy = [level["concurrency"] for level in report["levels"]
            if (level.get("client_cpu_utilisation") or 0.0) >= CLIENT_CPU_WARN]
    if busy:
        Console().print(f"[yellow]a client process used >= {100 * CLIENT_CPU_WARN:.0f} % of a core at concurrency "
                        f"{', '.join(map(str, busy))}: the client may limit these figures; try more --processes")


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
    parser.add_argument("--processes", type=int, default=1,
                        help="client processes per level (spawned); more when one process cannot keep up")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per request")
    parser.add_argument("--ready-timeout-s", type=float, default=60.0)
    parser.add_argument("--sentences-per-request", type=int, default=1,
                        help="sentences in each request's input; the report gives sentences/s beside requests/s")
    parser.add_argument("--sentence-set", default="eval",
                        help="the held-out sentences spoken (texts.load_sentences): eval (English, 8-12 words), or "
                             "eval_zh (Mandarin, 13-19 characters)")
    parser.add_argument("--min-words", type=int, help="in unspaced text (Chinese), characters (default: the set's)")
    parser.add_argument("--max-words", type=int, help="(default: the set's)")
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
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    if args.triton and args.stream != "none":
        parser.error("--triton does not stream: leave --stream at none")
    try:
        sentences = pick_sentences(args.min_words, args.max_words, args.sentence_set)
        inputs = join_sentences(sentences, args.sentences_per_request)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    started_unix_s = time.time()
    config = {"mode": "triton" if args.triton else "http", "url": args.url, "triton_model": args.triton_model,
              "model": args.model, "voice": args.voice, "response_format": args.response_format,
              "stream": args.stream, "timeout_s": args.timeout_s}
    if args.processes == 1:
        reports = asyncio.run(run_loadtest(lambda: make_client(config, max(levels)), inputs, levels,
                                           args.requests, args.max_seconds, args.warmup, args.ready_timeout_s))
    else:
        reports = run_loadtest_processes(config, inputs, levels, args.requests, args.max_seconds, args.warmup,
                                         args.ready_timeout_s, args.processes)
    comparison = compare(reports, json.loads(args.baseline.read_text(encoding="utf-8"))) if args.baseline else []
    report = {
        "tool": "serve.loadtest", "label": args.label, "url": args.url,
        "mode": config["mode"], "stream": args.stream,
        "response_format": args.response_format, "git_revision": git_revision(REPO_ROOT),
        "provenance": provenance(REPO_ROOT),
        "started_unix_s": started_unix_s, "settings": {k: str(v) for k, v in vars(args).items()},
        "sentences": len(sentences),  # distinct evaluation sentences
        "sentence_set": args.sentence_set,
        "inputs": len(inputs),  # distinct request inputs, each of sentences_per_request sentences
        "sentences_per_request": args.sentences_per_request,
        "levels": [asdict(level) for level in reports],
        # Each input's sentences run as separate rows of the server's batches.
        "sentences_per_s": {str(level.concurrency): level.throughput_rps * args.sentences_per_request
                            for level in reports},
        "comparison_with_baseline": comparison,
        "target_checks": target_checks(reports, args.stream, comparison),
    }
    save_diff(REPO_ROOT, args.out)
    write_text_atomic(args.out, json.dumps(report, indent=2))
    if not args.no_table:
        print_table(report)
        print(f"report: {args.out}")
    return report


if __name__ == "__main__":
    main()
