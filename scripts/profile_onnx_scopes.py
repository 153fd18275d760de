"""Where an exported synthesizer graph spends its CPU time, by module scope: onnxruntime's own
profiler, summed over each node's leading name scopes ("/enc_p/encoder/attn_layers.0/...").

    PYTHONPATH=. python scripts/profile_onnx_scopes.py --family piper \
        --graph outputs/graphs/piper/lite/lite.simplified.onnx --depth 1 --out docs/results/profile.json

Feeds come from the family's reference runtime (``reference`` in its registry entry), so any graph
that runtime runs can be profiled; ``--graph`` omitted profiles the voice's own graph, prepared as
the graph stages prepare it. Sentences are the first ``--count`` of ``--sentences`` (the eval set by
default; never Harvard), sentence i with seed i; each is run ``--repeats`` times after one warm-up
run. Times are onnxruntime's per-node kernel times, so their sum is below wall time by the
session's own overhead (reported beside it).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import onnx
import onnxruntime as ort

from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.revision import provenance
from models.interface import SynthesisRequest
from models.registry import FAMILIES, get_family
from texts import load_sentences


def scope_of(node_name: str, depth: int) -> str:
    """Up to ``depth`` leading scopes of a node name ("/enc_p/encoder/.../MatMul", 2 -> "enc_p/encoder");
    a node outside any scope is "(top level)"."""
    scopes = [part for part in node_name.split("/") if part][:-1]  # the last part names the node itself
    return "/".join(scopes[:depth]) if scopes else "(top level)"


def profile(session_bytes: bytes, feeds: list[dict], threads: int, repeats: int, depth: int) -> dict:
    """Run every feed once (warm-up: first-shape allocations, not counted), then ``repeats`` times
    more in one session; node kernel times of the counted runs, by scope and by op type, per run."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as work:
        options.profile_file_prefix = str(Path(work) / "profile")
        session = ort.InferenceSession(session_bytes, options, providers=["CPUExecutionProvider"])
        for feed in feeds:
            session.run(None, feed)
        wall = 0.0
        for _ in range(repeats):
            for feed in feeds:
                start = time.perf_counter()
                session.run(None, feed)
                wall += time.perf_counter() - start
        events = json.loads(Path(session.end_profiling()).read_text())
    # The profile holds the warm-up too: count node events from the first counted run's start on.
    run_starts = sorted(event["ts"] for event in events if event.get("name") == "model_run")
    if len(run_starts) != len(feeds) * (repeats + 1):
        raise RuntimeError(f"onnxruntime's profile has {len(run_starts)} runs, expected {len(feeds) * (repeats + 1)}")
    counted_from = run_starts[len(feeds)]
    events = [event for event in events if event["ts"] >= counted_from]
    by_scope: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    nodes: dict[str, set] = defaultdict(set)
    scope_ops: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        scope = scope_of(name, depth)
        by_scope[scope] += event["dur"] / 1e3  # microseconds -> ms
        op = event["args"].get("op_name", "?")
        by_op[op] += event["dur"] / 1e3
        scope_ops[scope][op] += event["dur"] / 1e3
        nodes[scope].add(name)
    kernel_ms = sum(by_scope.values())
    runs = repeats * len(feeds)
    return {
        "wall_ms_per_run": 1e3 * wall / runs,
        "kernel_ms_per_run": kernel_ms / runs,
        "by_scope": {scope: {"ms_per_run": ms / runs, "share": ms / kernel_ms, "nodes": len(nodes[scope]),
                             "ms_per_run_by_op_type": {op: op_ms / runs for op, op_ms in sorted(
                                 scope_ops[scope].items(), key=lambda item: -item[1])}}
                     for scope, ms in sorted(by_scope.items(), key=lambda item: -item[1])},
        "by_op_type_ms_per_run": {op: ms / runs for op, ms in sorted(by_op.items(), key=lambda item: -item[1])},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--voice", default=None, help="default: the family's default voice")
    parser.add_argument("--graph", type=Path, default=None,
                        help="a graph the family's runtime runs (default: the voice's own, prepared)")
    parser.add_argument("--sentences", default="eval", help="a named sentence set or a file (never Harvard)")
    parser.add_argument("--count", type=int, default=4, help="how many of its first sentences")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=1, help="how many leading scopes name a row")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    family = get_family(args.family)
    if family.reference is None:
        parser.error(f"family {family.name} has no onnxruntime runtime to build feeds with")
    voice = args.voice or family.default_voice
    if args.graph is None:
        runtime = family.reference.load(voice, args.threads)
        graph = family.reference.prepare_graph(family.reference.graph_path(voice))
    else:
        runtime = family.reference.load_graph(voice, args.threads, args.graph)
        graph = onnx.load(str(args.graph))
    feeds = []
    for seed, sentence in enumerate(load_sentences(args.sentences)[: args.count]):
        utterance = runtime.text_to_utterances(sentence)[0]
        request = SynthesisRequest.from_utterances([utterance], sampling=family.sampling(seed=seed))
        feeds.append(runtime.session_feeds(request))
    result = profile(graph.SerializeToString(), feeds, args.threads, args.repeats, args.depth)
    report = {
        "what": "onnxruntime kernel time by module scope, batch 1",
        "graph": str(args.graph or family.reference.graph_path(voice)),
        "onnxruntime": ort.__version__,
        "threads": args.threads,
        "sentences": f"{args.sentences}[:{len(feeds)}]",
        "repeats": args.repeats,
        **result,
        "provenance": provenance(REPO_ROOT),
    }
    write_text_atomic(args.out, json.dumps(report, indent=1) + "\n")
    for scope, row in list(report["by_scope"].items())[:15]:
        print(f"{scope:50s} {row['ms_per_run']:8.2f} ms  {100 * row['share']:5.1f} %  {row['nodes']} nodes")
    print(f"kernel {report['kernel_ms_per_run']:.1f} ms per run, wall {report['wall_ms_per_run']:.1f} ms")


if __name__ == "__main__":
    main()
