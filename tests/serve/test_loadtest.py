"""serve.loadtest against an in-process stub speech server whose delays are known."""
from __future__ import annotations

import asyncio
import base64
import json
import threading

import numpy as np
import pytest
from aiohttp import web

from serve.loadtest import (LevelReport, LoopbackOnlyError, Outcome, check_loopback, compare, join_sentences, main,
                            percentiles_ms, pick_sentences, sentence_length, split_level, summarize, target_checks)
from serve.text_split import split_text

DELAY_S = (0.05, 0.10, 0.15)  # the stub answers seed s after DELAY_S[s % 3]
REJECTED_SEED_MOD = 7  # seeds s with s % 7 == 6 get 503 + Retry-After, as under backpressure


async def _speech(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    seed = int(body["seed"])
    if seed % REJECTED_SEED_MOD == REJECTED_SEED_MOD - 1:
        return web.json_response({"error": {"code": "queue_full"}}, status=503, headers={"Retry-After": "1"})
    response = web.StreamResponse(headers={"Content-Type": "audio/wav"})
    await response.prepare(request)
    if body.get("stream_format") == "sse":
        await asyncio.sleep(DELAY_S[seed % 3])
        for chunk in (b"R" * 44, b"\x01" * 800, b"\x02" * 800):  # header first, as the runtime streams it
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b'data: {"type": "speech.audio.done"}\n\n')
    else:
        await response.write(b"R" * 44)  # the WAV header goes out at once; audio follows the delay
        await asyncio.sleep(DELAY_S[seed % 3])
        await response.write(b"\x01" * 1600)
    await response.write_eof()
    return response


async def _ready(_: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture(scope="module")
def stub_url():
    """A stub /v1/audio/speech + /readyz on a free loopback port, in a thread with its own loop."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.add_routes([web.post("/v1/audio/speech", _speech), web.get("/readyz", _ready)])
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def test_percentiles_on_known_latencies():
    latencies_s = [i / 1000 for i in range(10, 110, 10)]  # 10, 20, ..., 100 ms
    figures = percentiles_ms(latencies_s)
    assert figures["p50"] == pytest.approx(55.0)  # linear between the 5th and 6th of 10
    assert figures["p95"] == pytest.approx(95.5)
    assert figures["p99"] == pytest.approx(99.1)
    assert figures["mean"] == pytest.approx(55.0) and figures["max"] == pytest.approx(100.0)
    assert percentiles_ms([])["p95"] is None


def test_summary_counts_errors_and_uses_only_successes():
    outcomes = [Outcome("200", 0.010 * (i + 1), 0.005) for i in range(4)] + \
               [Outcome("503", 0.001), Outcome("error:ConnectError", 5.0)]
    level = summarize(concurrency=2, outcomes=outcomes, wall_s=2.0, stopped_by="requests")
    assert (level.requests_sent, level.requests_ok) == (6, 4)
    assert level.errors_by_status == {"503": 1, "error:ConnectError": 1}
    assert level.throughput_rps == pytest.approx(2.0)
    assert level.latency_ms["max"] == pytest.approx(40.0)  # the 5 s failure is not a latency


def test_throughput_target_holds_at_any_level_without_errors():
    def level(concurrency: int, rps: float, p95_ms: float, errors: dict | None = None) -> LevelReport:
        return LevelReport(concurrency, 100, 100, errors or {}, 1.0, rps, {"p95": p95_ms}, {"p50": None}, 0, "requests")

    # The busiest level misses the P95 bound; a lower one meets both.
    checks = target_checks([level(1, 150, 8), level(48, 730, 76), level(64, 734, 112)], "none", [])
    assert checks["h200_throughput_and_p95_met"] is True
    assert checks["h200_levels_meeting_throughput_and_p95"] == [48]
    checks = target_checks([level(32, 480, 84), level(48, 523, 112), level(40, 600, 90, {"503": 3})], "none", [])
    assert checks["h200_throughput_and_p95_met"] is False  # too slow, too late, or refusing requests


def test_stub_run_reports_known_delays_and_rejections(stub_url, tmp_path):
    out = tmp_path / "report.json"
    report = main(["--url", stub_url, "--concurrency", "1", "--requests", "14", "--max-seconds", "30",
                   "--warmup", "0", "--stream", "audio", "--out", str(out), "--no-table"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    (level,) = report["levels"]
    assert level["requests_sent"] == 14 and level["stopped_by"] == "requests"
    assert level["errors_by_status"] == {"503": 2}  # seeds 6 and 13
    assert level["requests_ok"] == 12 and level["audio_bytes_total"] == 12 * 1644
    ok_delays_s = [DELAY_S[seed % 3] for seed in range(14) if seed % 7 != 6]
    # Latency is the stub's delay plus loopback overhead: never below, and p50 close above.
    assert level["latency_ms"]["p50"] >= np.percentile(ok_delays_s, 50) * 1000
    assert level["latency_ms"]["p50"] <= np.percentile(ok_delays_s, 50) * 1000 + 80
    assert level["latency_ms"]["max"] >= max(ok_delays_s) * 1000
    # First audio is the first byte after the 44-byte header: after the delay, not at the header.
    assert level["ttfa_ms"]["p50"] >= np.percentile(ok_delays_s, 50) * 1000
    assert report["target_checks"]["ttfa_c1_streaming_met"] is False  # 100 ms > the 20 ms target


def test_sse_first_audio_and_concurrency(stub_url, tmp_path):
    report = main(["--url", stub_url, "--concurrency", "4", "--requests", "12", "--max-seconds", "30",
                   "--warmup", "0", "--stream", "sse", "--out", str(tmp_path / "r.json"), "--no-table"])
    (level,) = report["levels"]
    assert level["requests_ok"] == 11 and level["errors_by_status"] == {"503": 1}
    assert level["audio_bytes_total"] == 11 * 1644  # base64 deltas decoded
    assert level["ttfa_ms"]["p50"] >= 100.0
    serial_s = sum(DELAY_S[seed % 3] for seed in range(12) if seed % 7 != 6)
    assert level["wall_s"] < 0.9 * serial_s  # four at a time, not one after the other


def test_time_bound_stops_issuing(stub_url, tmp_path):
    report = main(["--url", stub_url, "--concurrency", "1", "--requests", "1000", "--max-seconds", "0.3",
                   "--warmup", "0", "--out", str(tmp_path / "r.json"), "--no-table"])
    (level,) = report["levels"]
    assert level["stopped_by"] == "time"
    assert 1 <= level["requests_sent"] <= 6  # 0.3 s of 50-150 ms requests, one at a time


def test_refuses_non_loopback_hosts(tmp_path):
    with pytest.raises(LoopbackOnlyError, match="non-loopback"):
        check_loopback("http://192.0.2.10:8000")
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        check_loopback("ftp://127.0.0.1:21")
    assert check_loopback("http://localhost:8000") == ("localhost", 8000)
    with pytest.raises(SystemExit):
        main(["--url", "http://192.0.2.10:8000", "--out", str(tmp_path / "r.json")])


def test_baseline_comparison():
    base = {"levels": [{"concurrency": 4, "throughput_rps": 10.0, "latency_ms": {"p95": 200.0}}]}
    faster = summarize(4, [Outcome("200", 0.1)] * 30, wall_s=1.0, stopped_by="requests")
    (row,) = compare([faster], base)
    assert row["throughput_ratio"] == pytest.approx(3.0)
    assert row["p95_equal_or_better"] is True


def test_sentences_are_short_eval_sentences():
    sentences = pick_sentences(8, 12)
    assert len(sentences) > 50 and all(8 <= len(s.split()) <= 12 for s in sentences)


def test_each_set_has_its_own_lengths_unless_given():
    assert pick_sentences() == pick_sentences(8, 12, "eval")
    assert pick_sentences(name="eval_zh") == pick_sentences(13, 19, "eval_zh")
    assert pick_sentences(name="harvard") == pick_sentences(8, 12, "harvard")  # a set without its own: eval's
    assert pick_sentences(10, name="eval") == pick_sentences(10, 12, "eval")  # one bound given, the other the set's


def test_mandarin_sentences_are_measured_in_characters_and_split_back_by_the_server():
    assert sentence_length("今天天气很好，我们去公园吧！") == 12  # characters, the marks not counted
    assert (sentence_length("Hello."), sentence_length("Two words.")) == (1, 2)
    assert sentence_length("こんにちは。") == 5  # Japanese kana are unspaced too
    sentences = pick_sentences(13, 19, "eval_zh")
    assert len(sentences) == 40 and all(13 <= sentence_length(s) <= 19 for s in sentences)
    joined = join_sentences(sentences, 8)[0]
    assert split_text(joined, max_chars=400) == sentences[:8]  # the server batches each on its own


def test_an_unknown_sentence_set_is_refused_at_start(stub_url, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--url", stub_url, "--sentence-set", "klingon", "--out", str(tmp_path / "r.json"), "--no-table"])
    assert "unknown sentence set 'klingon'" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_inputs_of_several_sentences_wrap_around_and_count_each_sentence(stub_url, tmp_path):
    assert join_sentences(["A b.", "C d.", "E f."], 2) == ["A b. C d.", "C d. E f.", "E f. A b."]
    with pytest.raises(ValueError, match="sentences-per-request 0"):
        join_sentences(["A b."], 0)
    report = main(["--url", stub_url, "--concurrency", "2", "--requests", "6", "--max-seconds", "30", "--warmup", "0",
                   "--sentences-per-request", "3", "--out", str(tmp_path / "r.json"), "--no-table"])
    (level,) = report["levels"]
    assert report["sentences_per_request"] == 3
    assert report["sentences_per_s"] == {"2": pytest.approx(3 * level["throughput_rps"])}


def test_split_level_partitions_slots_and_requests():
    for concurrency, processes, requests in [(3, 2, 14), (16, 4, 200), (1, 4, 5), (5, 3, 2), (7, 7, 7)]:
        split = split_level(concurrency, processes, requests)
        sizes = [size for size, _ in split]
        assert len(split) == min(concurrency, processes) and sum(sizes) == concurrency
        assert max(sizes) - min(sizes) <= 1
        assert sorted(i for _, indices in split for i in indices) == list(range(requests))
        assert all(indices == sorted(indices) for _, indices in split)
    assert split_level(3, 2, 14) == [(2, [0, 1, 3, 4, 6, 7, 9, 10, 12, 13]), (1, [2, 5, 8, 11])]


def test_two_client_processes_merge_into_one_level(stub_url, tmp_path):
    report = main(["--url", stub_url, "--concurrency", "1,3", "--processes", "2", "--requests", "14",
                   "--max-seconds", "30", "--warmup", "1", "--stream", "audio", "--out", str(tmp_path / "r.json"),
                   "--no-table"])
    assert report["settings"]["processes"] == "2"
    single, split = report["levels"]
    for level in (single, split):
        assert level["requests_sent"] == 14 == level["requests_ok"] + sum(level["errors_by_status"].values())
        assert level["stopped_by"] == "requests"
        assert level["errors_by_status"] == {"503": 2}  # seeds 6 and 13, each sent once, whoever sent them
        assert level["audio_bytes_total"] == 12 * 1644
        assert level["throughput_rps"] == pytest.approx(12 / level["wall_s"])
        rows = level["client_processes"]
        assert sum(row["concurrency"] for row in rows) == level["concurrency"]
        assert sum(row["requests_sent"] for row in rows) == 14
        assert level["wall_s"] == max(row["wall_s"] for row in rows)
        assert 0.0 <= level["client_cpu_utilisation"] == max(row["cpu_utilisation"] for row in rows)
    assert [row["concurrency"] for row in single["client_processes"]] == [1]  # one slot, one process
    assert [(row["concurrency"], row["requests_sent"]) for row in split["client_processes"]] == [(2, 10), (1, 4)]
    assert split["ttfa_ms"]["p50"] >= 100.0  # the stub's p50 delay, first byte after the header
    serial_s = sum(DELAY_S[seed % 3] for seed in range(14) if seed % 7 != 6)
    assert split["wall_s"] < 0.9 * serial_s  # three at a time from two processes


def test_client_processes_share_the_deadline(stub_url, tmp_path):
    report = main(["--url", stub_url, "--concurrency", "2", "--processes", "2", "--requests", "1000",
                   "--max-seconds", "0.3", "--warmup", "0", "--out", str(tmp_path / "r.json"), "--no-table"])
    (level,) = report["levels"]
    assert level["stopped_by"] == "time"
    assert 2 <= level["requests_sent"] <= 12  # 0.3 s of 50-150 ms requests, one at a time in each of two
    assert level["wall_s"] < 0.3 + 1.0  # the last ones start before 0.3 s and take at most 150 ms
