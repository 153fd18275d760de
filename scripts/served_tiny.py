"""A family's tiny model behind the real app on uvicorn in this process, loaded by ``serve.loadtest`` from
another process: a server bound by its host side (HTTP, front end, batching), as a GPU server is once its
engine is fast. The measuring scripts (served_gc_collections.py, served_frontend_cost.py) share it.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from core.publishing import add_allow_dirty_argument, publication_or_exit
from models.registry import FAMILIES
from serve.app import create_app
from serve.engines import ServedModel, served_as_is
from serve.settings import ServeSettings

REPO = Path(__file__).resolve().parents[1]


def add_load_arguments(parser: argparse.ArgumentParser, concurrency: int) -> None:
    """The options of the interleaved rounds of measured load levels these scripts run."""
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of all arms")
    parser.add_argument("--concurrency", type=int, default=concurrency)
    parser.add_argument("--sentences", type=int, default=8, help="sentences a request")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each measured level")
    parser.add_argument("--warm-seconds", type=float, default=10.0, help="length of the untimed level before each")
    parser.add_argument("--max-batch", type=int, default=64)


def parse_measuring_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, dict]:
    """(arguments, provenance): ``--out`` and ``--allow-dirty`` added, parsed, the report's publication
    checked (core.publishing), and torch held to one thread so that the server is what the CPUs run."""
    parser.add_argument("--out", type=Path, required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, REPO, args.out, args.allow_dirty)
    torch.set_num_threads(1)
    return args, origin


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(family_name: str, **settings) -> Iterator[tuple[str, ServedModel]]:
    """(base url, served model): the family's tiny teacher on a free port, no warm-up, one worker thread;
    ``settings`` are ServeSettings fields on top."""
    family = FAMILIES[family_name]
    port = free_port()
    served = served_as_is(family.tiny_model(0), family, "teacher", family.default_voice)
    config = ServeSettings(**{"source": "teacher", "family": family_name, "port": port, "warmup": False,
                              "access_log": False, "max_wait_ms": 0, "batches_in_flight": 2, "threads": 1,
                              "queue_capacity": 1024, "max_requests_per_client": 1024, **settings})
    server = uvicorn.Server(uvicorn.Config(create_app(config, served), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, name="server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", served
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def run_load(url: str, served: ServedModel, *, concurrency: int, sentences_per_request: int, seconds: float,
             out: str, sentence_set: str = "eval") -> None:
    """One ``serve.loadtest`` level of ``seconds`` against ``url``, from another process, on ``sentence_set``
    at its own lengths; its report at ``out``."""
    subprocess.run([sys.executable, "-m", "serve.loadtest", "--url", url, "--concurrency", str(concurrency),
                    "--requests", "1000000", "--max-seconds", str(seconds), "--warmup", "16",
                    "--sentences-per-request", str(sentences_per_request), "--sentence-set", sentence_set,
                    "--ready-timeout-s", "60", "--no-table", "--model", served.model_id,
                    "--voice", served.voice_name, "--out", out],
                   check=True, cwd=REPO, timeout=600)


def metric_samples(url: str, name: str) -> dict[str, dict[str, float]]:
    """{sample name: {label values joined by ',': value}} of one metric family on the server's /metrics."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for sample in family.samples:
                found.setdefault(sample.name, {})[",".join(sample.labels.values())] = sample.value
    return found
