"""serve/loadtest_summary.py: the GPU's busy share, the graph captures under load and the workers' warm-up,
read back from a load test's files; on written files whose answers are known, and on a committed run whose
figures docs/benchmarks.md quotes."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from core.paths import REPO_ROOT
from serve.loadtest_summary import main, summarize

START = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def stamp(offset_s: float, fmt: str) -> str:
    return dt.datetime.fromtimestamp(START + offset_s, dt.timezone.utc).strftime(fmt)


def log_line(offset_s: float, pid: int, logger: str, message: str) -> str:
    millis = round((offset_s % 1) * 1000)
    return f"{stamp(offset_s, '%Y-%m-%d %H:%M:%S')},{millis:03d} INFO {pid} {logger}: {message}"


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """A gpu_loadtest.sh folder: a 10 s level at concurrency 4 (40 requests of 2 sentences, each sentence
    1 s of 16 kHz audio), a streaming level from 20 s, and a server of two workers."""
    level = {"concurrency": 4, "requests_sent": 41, "requests_ok": 40, "errors_by_status": {"503": 1},
             "wall_s": 10.0, "throughput_rps": 4.0, "latency_ms": {"p50": 500.0, "p95": 900.0, "p99": 990.0},
             "audio_bytes_total": 40 * (44 + 2 * 32000)}
    report = {"tool": "serve.loadtest", "started_unix_s": START, "sentence_set": "eval_zh",
              "sentences_per_request": 2, "levels": [level]}
    (tmp_path / "loadtest_x.json").write_text(json.dumps(report))
    (tmp_path / "loadtest_x_warmup.json").write_text(json.dumps({**report, "started_unix_s": START - 30}))
    (tmp_path / "loadtest_x_stream.json").write_text(json.dumps({**report, "started_unix_s": START + 20}))
    # The GPU: idle for the level's first second (the load is on its way), busy 90 % for 10 s, idle after.
    rows = ["timestamp, utilization.gpu [%], memory.used [MiB]"]
    for tenth in range(0, 150, 2):  # every 200 ms from the level's start
        busy = 90 if 10 <= tenth < 110 else 0
        rows.append(f"{stamp(tenth / 10, '%Y/%m/%d %H:%M:%S.%f')[:-3]}, {busy} %, 1000 MiB")
    rows.append(f"{stamp(15, '%Y/%m/%d %H:%M:%S.%f')[:-3]}, 9")  # cut off when the sampler stopped
    (tmp_path / "gpu_utilisation.csv").write_text("\n".join(rows) + "\n")
    lines = [
        log_line(-40, 11, "models.cuda_graphs", "captured ('frames', 32, 64, 256) in 24.10 s (2 graphs)"),
        log_line(-31, 11, "serve.app", "warm-up: 12 more shapes captured between those the batches met, in 3.5 s"),
        log_line(-30.5, 11, "serve.app", "ready: teacher (torch_compile, named) warmed up in 50.5 s, 2.5 GiB "
                                         "reserved on cuda (peak 3.0 GiB)"),
        log_line(-30, 12, "serve.app", "ready: teacher (torch_compile, named) warmed up in 49.0 s, 2.4 GiB "
                                       "reserved on cuda (peak 2.9 GiB)"),
        log_line(3.25, 12, "models.cuda_graphs", "captured ('frames', 8, 168, 256) in 1.25 s (1 graphs)"),
        log_line(12, 11, "models.cuda_graphs", "captured ('frames', 16, 208, 256) in 0.75 s (1 graphs)"),
        log_line(17, 12, "models.cuda_graphs", "captured ('frames', 4, 96, 256) in 0.25 s (1 graphs)"),  # late batch
        log_line(25, 11, "models.cuda_graphs", "captured ('frames', 1, 160, 256) in 0.50 s (1 graphs)"),  # streaming
        "Traceback (most recent call last):",  # lines without the format are skipped
    ]
    (tmp_path / "server.log").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_a_run_folder_summarises_its_measured_level(run_folder, capsys):
    main(["--dir", str(run_folder), "--sample-rate-hz", "16000"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["report"] == "loadtest_x.json"  # not the warm-up or streaming report
    assert (summary["requests_ok"], summary["errors"], summary["sentences_per_s"]) == (40, 1, 8.0)
    assert summary["latency_p50_p95_p99_s"] == [0.5, 0.9, 0.99]
    assert summary["audio_s_per_sentence"] == pytest.approx(1.0)
    # Over the report's clock (51 samples, 0-10 s) the first idle second counts (46 busy); over the last 10 s
    # before the GPU's last busy sample (0.8-10.8 s) only the sample at 0.8 s is idle
    assert summary["gpu_busy_report_clock_percent"] == pytest.approx(90 * 46 / 51)
    assert summary["gpu_busy_last_wall_percent"] == pytest.approx(90 * 50 / 51)
    # Captures between the report's start and the streaming level's: not the warm-up's, nor the stream's
    assert summary["captures_under_load"] == 3 and summary["capture_s_under_load"] == pytest.approx(2.25)
    assert summary["captured_under_load"] == ["12: ('frames', 8, 168, 256)", "11: ('frames', 16, 208, 256)",
                                              "12: ('frames', 4, 96, 256)"]
    assert summary["workers"] == [
        {"pid": 11, "warm_up_s": 50.5, "reserved_gib": 2.5, "peak_gib": 3.0, "filled_shapes": 12, "fill_s": 3.5},
        {"pid": 12, "warm_up_s": 49.0, "reserved_gib": 2.4, "peak_gib": 2.9, "filled_shapes": 0, "fill_s": 0.0}]


def test_without_the_optional_files_only_the_report_figures_come_back(run_folder):
    summary = summarize(run_folder / "loadtest_x.json")
    assert summary.sentences_per_s == 8.0
    assert summary.audio_s_per_sentence is summary.gpu_busy_last_wall_percent is summary.captures_under_load is None
    # Without the streaming report, captures count until the report's clock ends plus the late-batch margin:
    # the capture at 17 s is past it
    late = summarize(run_folder / "loadtest_x.json", server_log=run_folder / "server.log")
    assert late.captures_under_load == 2


def test_a_one_worker_server_logs_in_hydras_format(run_folder):
    """One worker runs in the launching process, which logs through Hydra: no pid, brackets."""
    hydra_lines = [
        "[2027-01-15 07:59:29,500][serve.app][INFO] - ready: teacher (compile, named) warmed up in 50.5 s, 2.5 GiB "
        "reserved on cuda (peak 3.0 GiB)",
        "[2027-01-15 08:00:03,250][models.cuda_graphs][INFO] - captured ('frames', 8, 168, 256) in 1.25 s (1 graphs)",
    ]
    (run_folder / "server.log").write_text("\n".join(hydra_lines) + "\n")
    summary = summarize(run_folder / "loadtest_x.json", server_log=run_folder / "server.log",
                        stream_report=run_folder / "loadtest_x_stream.json")
    assert summary.captured_under_load == ["0: ('frames', 8, 168, 256)"]
    assert [(worker.pid, worker.warm_up_s) for worker in summary.workers] == [(0, 50.5)]


def test_a_level_without_a_successful_request_is_summarised(run_folder):
    report = json.loads((run_folder / "loadtest_x.json").read_text())
    report["levels"][0].update(requests_ok=0, errors_by_status={"503": 41}, audio_bytes_total=0,
                               latency_ms={"p50": None, "p95": None, "p99": None})
    (run_folder / "loadtest_x.json").write_text(json.dumps(report))
    summary = summarize(run_folder / "loadtest_x.json", sample_rate_hz=16000)
    assert (summary.sentences_per_s, summary.errors, summary.audio_s_per_sentence) == (0.0, 41, None)
    assert summary.latency_p50_p95_p99_s == (None, None, None)


def test_bad_inputs_are_refused_with_the_reason(run_folder, tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"tool": "bench_emotivoice"}))
    with pytest.raises(ValueError, match="not a serve.loadtest report"):
        summarize(other)
    with pytest.raises(ValueError, match="has 1 level"):
        summarize(run_folder / "loadtest_x.json", level=1)
    several = json.loads((run_folder / "loadtest_x.json").read_text())
    several["levels"] *= 2  # a report of several levels has one clock for all of them
    other.write_text(json.dumps(several))
    assert summarize(other, level=1).sentences_per_s == 8.0
    with pytest.raises(ValueError, match="one clock"):
        summarize(other, gpu_csv=run_folder / "gpu_utilisation.csv")
    with pytest.raises(ValueError, match="do not cover the report's window"):  # another zone, or another run
        summarize(run_folder / "loadtest_x_warmup.json", gpu_csv=run_folder / "gpu_utilisation.csv")
    (run_folder / "noise.log").write_text("Traceback (most recent call last):\n")
    with pytest.raises(ValueError, match="no line in a known log format"):
        summarize(run_folder / "loadtest_x.json", server_log=run_folder / "noise.log")
    (run_folder / "loadtest_y.json").write_text("{}")
    with pytest.raises(SystemExit):
        main(["--dir", str(run_folder)])
    assert "expected one loadtest_*.json report" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])
    assert "give either --dir or --report" in capsys.readouterr().err


def test_the_committed_mandarin_run_gives_the_figures_the_benchmarks_quote():
    """docs/benchmarks.md, session 50, call 2: 1,753.2 sentences/s, 2.89 s a sentence, GPU 96.9 % busy, no
    capture under load, 458 shapes filled a worker."""
    results = REPO_ROOT / "docs" / "results"
    name = "h100_50_emotivoice_serve_zh_fill_a"
    summary = summarize(results / f"{name}.json", server_log=results / f"{name}.log",
                        gpu_csv=results / f"{name}_gpu_utilisation.csv", stream_report=results / f"{name}_stream.json",
                        sample_rate_hz=16000)
    assert round(summary.sentences_per_s, 1) == 1753.2
    assert round(summary.audio_s_per_sentence, 2) == 2.89
    assert round(summary.gpu_busy_last_wall_percent, 1) == 96.9
    assert summary.captures_under_load == 0 and summary.errors == 0
    assert [worker.filled_shapes for worker in summary.workers] == [458, 458]
