"""What one measured level of a GPU load test did, read back from the files serve/gpu_loadtest.sh leaves.

    python -m serve.loadtest_summary --dir /tmp/c --sample-rate-hz 16000       # a gpu_loadtest.sh folder
    python -m serve.loadtest_summary --report docs/results/h100_50_emotivoice_serve_zh_fill_a.json \\
        --server-log docs/results/h100_50_emotivoice_serve_zh_fill_a.log \\
        --gpu-csv docs/results/h100_50_emotivoice_serve_zh_fill_a_gpu_utilisation.csv \\
        --stream-report docs/results/h100_50_emotivoice_serve_zh_fill_a_stream.json --sample-rate-hz 16000

docs/benchmarks.md quotes, for each served run, how busy the GPU was during the measured level and how
many CUDA graphs the workers captured under load; this module computes them from the committed raw files,
so a reader can check them. From the load test's report (serve.loadtest) it takes the measured level;
from ``nvidia-smi``'s samples (``gpu_utilisation.csv``, every 200 ms) the GPU's busy share; from the
server's log its workers' warm-up and the graph captures between the report's start and the streaming
level's (a capture under load is a shape the warm-up missed).

A report's only clock is ``started_unix_s``, taken before its client processes start, wait for the
server and send their warm-up requests; a level has no start of its own. So the GPU samples and captures
are read only for a report of one level (serve/gpu_loadtest.sh writes its measured level apart), and
its window opens a little before the load does. Two busy shares: over the report's clock
(``started_unix_s`` to ``+ wall_s``), which counts that lead-in as idle, and over the last ``wall_s``
seconds before the GPU last ran above ``BUSY_PERCENT`` within it, which does not.

Timestamps in the log and the CSV are the GPU machine's local time, read as UTC (the lent machines keep
UTC). The CSV must cover the report's window, which catches another zone: the log comes from the same
clock. Audio seconds need the voice's sample rate (WAV responses: 16-bit mono after a 44-byte header);
without it they are left out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUSY_PERCENT = 50.0  # a sample above this counts as the GPU still working through the level's load
WAV_HEADER_BYTES = 44
SAMPLE_BYTES = 2
LATE_SAMPLES_S = 5.0  # how far past the level's clock its last batches may still run
# The server's log formats: a worker's (serve/worker.py, with its pid), the single process's
# (serve/__main__.py), and Hydra's, in which a one-worker server logs. (time, milliseconds, pid?, logger, message)
LOG_FORMATS = (
    re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) [A-Z]+ (\d+) ([\w.]+): (.*)$"),
    re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) [A-Z]+ ()([\w.]+): (.*)$"),
    re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]\[([\w.]+)\]\[[A-Z]+\] - (.*)$"),
)
SINGLE_PROCESS = 0  # the pid reported for a format that names none
CAPTURE = re.compile(r"captured (.*) in ([\d.]+) s \(\d+ graphs\)")
READY = re.compile(r"warmed up in ([\d.]+) s, ([\d.]+) GiB reserved on \w+ \(peak ([\d.]+) GiB\)")
FILL = re.compile(r"warm-up: (\d+) more shapes captured between those the batches met, in ([\d.]+) s")


@dataclass
class WorkerWarmUp:
    pid: int
    warm_up_s: float
    reserved_gib: float
    peak_gib: float
    filled_shapes: int = 0
    fill_s: float = 0.0


@dataclass
class LevelSummary:
    report: str
    sentence_set: str
    concurrency: int
    requests_ok: int
    errors: int
    wall_s: float
    sentences_per_s: float
    latency_p50_p95_p99_s: tuple[float | None, float | None, float | None]  # None: no request succeeded
    audio_s_per_sentence: float | None
    gpu_busy_report_clock_percent: float | None
    gpu_busy_last_wall_percent: float | None
    captures_under_load: int | None
    capture_s_under_load: float | None
    captured_under_load: list[str] = field(default_factory=list)
    workers: list[WorkerWarmUp] = field(default_factory=list)


def _utc(stamp: str, fmt: str) -> float:
    return dt.datetime.strptime(stamp, fmt).replace(tzinfo=dt.timezone.utc).timestamp()


def read_gpu_samples(path: Path) -> list[tuple[float, float]]:
    """(unix seconds, utilisation %) per line of ``nvidia-smi --query-gpu=timestamp,utilization.gpu,...``."""
    samples = []
    for line in path.read_text().splitlines()[1:]:  # the first line names the columns
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 2 or not fields[1].endswith("%"):
            continue  # a line cut off when the sampler was stopped
        samples.append((_utc(fields[0], "%Y/%m/%d %H:%M:%S.%f"), float(fields[1].rstrip(" %"))))
    return samples


def gpu_busy(samples: list[tuple[float, float]], start: float, wall_s: float) -> tuple[float, float | None]:
    """(mean busy % over the report's clock, mean over the last ``wall_s`` s before the GPU's last busy
    sample in it; None if it never ran above BUSY_PERCENT there). Refuses samples that do not cover the
    window: another time zone, or a sampler that was not running."""
    if not samples or samples[0][0] > start or samples[-1][0] < start + wall_s:
        covered = f"{samples[0][0]:.0f}-{samples[-1][0]:.0f}" if samples else "none"
        raise ValueError(f"the GPU samples (unix {covered}) do not cover the report's window "
                         f"({start:.0f}-{start + wall_s:.0f}): not read as UTC, or from another run")
    on_clock = [busy for t, busy in samples if start <= t <= start + wall_s]
    busy_until = [t for t, busy in samples if start <= t <= start + wall_s + LATE_SAMPLES_S and busy > BUSY_PERCENT]
    if not busy_until:
        return statistics.fmean(on_clock), None
    last_busy = max(busy_until)
    return (statistics.fmean(on_clock),
            statistics.fmean(busy for t, busy in samples if last_busy - wall_s <= t <= last_busy))


def parse_log_line(line: str) -> tuple[float, int, str, str] | None:
    """(unix seconds, pid or SINGLE_PROCESS, logger, message) of a line in one of LOG_FORMATS, else None."""
    for log_format in LOG_FORMATS:
        match = log_format.match(line)
        if match:
            fields = match.groups()
            stamp, millis, logger, message = fields[0], fields[1], fields[-2], fields[-1]
            pid = int(fields[2]) if len(fields) == 5 and fields[2] else SINGLE_PROCESS
            return _utc(stamp, "%Y-%m-%d %H:%M:%S") + int(millis) / 1000.0, pid, logger, message
    return None


def read_server_log(path: Path) -> tuple[list[tuple[float, int, str, float]], list[WorkerWarmUp]]:
    """The log's graph captures as (unix seconds, worker pid, shape key, seconds), and each worker's warm-up.
    Refuses a log with no line in a known format: nothing read would look like nothing captured."""
    captures, ready, fills, parsed = [], {}, {}, 0
    for line in path.read_text(errors="replace").splitlines():
        fields = parse_log_line(line)
        if fields is None:
            continue  # tracebacks, uvicorn's own lines
        parsed += 1
        when, pid, logger, message = fields
        if (capture := CAPTURE.match(message)) and logger == "models.cuda_graphs":
            captures.append((when, pid, capture.group(1), float(capture.group(2))))
        elif fill := FILL.search(message):
            fills[pid] = (int(fill.group(1)), float(fill.group(2)))
        elif done := READY.search(message):
            ready[pid] = WorkerWarmUp(pid, float(done.group(1)), float(done.group(2)), float(done.group(3)))
    if not parsed:
        raise ValueError(f"{path}: no line in a known log format (serve/worker.py's, serve/__main__.py's, Hydra's)")
    for pid, (shapes, seconds) in fills.items():
        if pid in ready:
            ready[pid].filled_shapes, ready[pid].fill_s = shapes, seconds
    return captures, [ready[pid] for pid in sorted(ready)]


def summarize(report_path: Path, server_log: Path | None = None, gpu_csv: Path | None = None,
              stream_report: Path | None = None, sample_rate_hz: int | None = None, level: int = 0) -> LevelSummary:
    """The ``level``-th level of ``report_path`` (a serve.loadtest report), with what the other files add."""
    report = json.loads(report_path.read_text())
    if report.get("tool") != "serve.loadtest":
        raise ValueError(f"{report_path} is not a serve.loadtest report (tool={report.get('tool')!r})")
    levels = report["levels"]
    if not 0 <= level < len(levels):
        raise ValueError(f"{report_path} has {len(levels)} level(s); there is no level {level}")
    if len(levels) > 1 and (gpu_csv is not None or server_log is not None):
        raise ValueError(f"{report_path} has {len(levels)} levels and one clock: its levels' windows are unknown, "
                         "so GPU samples and captures are read only for a report of one level")
    measured = levels[level]
    per_request = report.get("sentences_per_request", 1)
    sentences = measured["requests_ok"] * per_request
    start, wall_s = report["started_unix_s"], measured["wall_s"]
    if wall_s <= 0:
        raise ValueError(f"{report_path}: level {level} lasted {wall_s} s")
    audio_s = None
    if sample_rate_hz:
        samples = (measured["audio_bytes_total"] - WAV_HEADER_BYTES * measured["requests_ok"]) / SAMPLE_BYTES
        audio_s = samples / sample_rate_hz / sentences if sentences else None
    busy_clock = busy_last = None
    if gpu_csv is not None:
        busy_clock, busy_last = gpu_busy(read_gpu_samples(gpu_csv), start, wall_s)
    captures = workers = None
    if server_log is not None:
        all_captures, workers = read_server_log(server_log)
        until = (json.loads(stream_report.read_text())["started_unix_s"] if stream_report is not None
                 else start + wall_s + LATE_SAMPLES_S)
        captures = [capture for capture in all_captures if start <= capture[0] <= until]
    latency = measured["latency_ms"]  # None where no request succeeded
    return LevelSummary(
        report=report_path.name, sentence_set=report.get("sentence_set", "eval"),
        concurrency=measured["concurrency"], requests_ok=measured["requests_ok"],
        errors=sum(measured["errors_by_status"].values()), wall_s=wall_s, sentences_per_s=sentences / wall_s,
        latency_p50_p95_p99_s=tuple(None if latency.get(key) is None else latency[key] / 1000.0
                                    for key in ("p50", "p95", "p99")),
        audio_s_per_sentence=audio_s, gpu_busy_report_clock_percent=busy_clock,
        gpu_busy_last_wall_percent=busy_last,
        captures_under_load=None if captures is None else len(captures),
        capture_s_under_load=None if captures is None else sum(capture[3] for capture in captures),
        captured_under_load=[] if captures is None else [f"{pid}: {key}" for _, pid, key, _ in captures],
        workers=workers or [])


def _folder_paths(folder: Path) -> dict[str, Path | None]:
    """gpu_loadtest.sh's file names in ``folder``: the measured report is the one without a suffix."""
    reports = [path for path in sorted(folder.glob("loadtest_*.json"))
               if not path.stem.endswith(("_stream", "_warmup"))]
    if len(reports) != 1:
        raise ValueError(f"{folder}: expected one loadtest_*.json report besides _stream/_warmup, found "
                         f"{[path.name for path in reports]}")
    stream = reports[0].with_name(reports[0].stem + "_stream.json")
    optional = {"server_log": folder / "server.log", "gpu_csv": folder / "gpu_utilisation.csv", "stream_report": stream}
    return {"report_path": reports[0], **{key: path if path.exists() else None for key, path in optional.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve.loadtest_summary", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="a serve/gpu_loadtest.sh output folder (instead of the paths below)")
    parser.add_argument("--report", type=Path, help="the measured level's serve.loadtest report")
    parser.add_argument("--server-log", type=Path)
    parser.add_argument("--gpu-csv", type=Path, help="gpu_utilisation.csv (nvidia-smi every 200 ms)")
    parser.add_argument("--stream-report", type=Path, help="the streaming level's report: captures count until it starts")
    parser.add_argument("--sample-rate-hz", type=int, help="the voice's output rate, for audio seconds (EmotiVoice: 16000)")
    parser.add_argument("--level", type=int, default=0, help="which level of the report (0: the first; GPU samples "
                        "and captures need a report of one level)")
    args = parser.parse_args(argv)
    if (args.dir is None) == (args.report is None):
        parser.error("give either --dir or --report")
    try:
        paths = _folder_paths(args.dir) if args.dir is not None else {
            "report_path": args.report, "server_log": args.server_log, "gpu_csv": args.gpu_csv,
            "stream_report": args.stream_report}
        summary = summarize(**paths, sample_rate_hz=args.sample_rate_hz, level=args.level)
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(str(error))
    print(json.dumps(asdict(summary), indent=2))


if __name__ == "__main__":
    main()
