"""Time the SoVITS half of GPT-SoVITS v2's first audio chunk: the first 25 semantic tokens (1 s of
audio) and a 20-phone sentence through the synthesizer, the voice's reference embedding cached (as
the server caches a prompt). Added to the text-to-semantic engine's time to its first 25 tokens
(scripts/bench_gpt_sovits_t2s.py), it bounds the time to first audio of a chunked stream.

    PYTHONPATH=. python scripts/bench_gpt_sovits_first_chunk.py --device cuda --out $OUT/first_chunk.json

Full-size random weights from the official manifest (models/gpt_sovits/data/): speed and memory are
real, the audio is not speech. Light on purpose: torch and numpy only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from core.paths import REPO_ROOT
from core.revision import git_revision
from models.gpt_sovits.sovits_checkpoint import sovits_from_manifest

MANIFEST = Path(__file__).resolve().parents[1] / "models" / "gpt_sovits" / "data" / "manifest_official_sovits.json"


def _timed_ms(run, device: str, repeats: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--tokens", type=int, default=25)  # 25 tokens = 1 s of audio at 25 Hz
    parser.add_argument("--phones", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = sovits_from_manifest(MANIFEST).model.eval().to(args.device)
    codes = torch.randint(0, model.config.codebook_size, (1, 1, args.tokens), device=args.device)
    phones = torch.randint(1, model.config.phoneme_vocab_size, (1, args.phones), device=args.device)
    spectrogram = torch.rand(1, model.config.reference_bins, 200, device=args.device)
    report = {"what": "SoVITS v2 decode of the first chunk, full-size random weights", "tokens": args.tokens,
              "phones": args.phones, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "git_revision": git_revision(REPO_ROOT), "ms": {}}
    with torch.inference_mode():
        ge = model.reference_embedding([spectrogram])  # (1, 512, 1): cached per voice by the server

        def decode(net, g):
            m_p, logs_p, mask = net.prior(codes, phones, g)
            return net.synthesize_latent(m_p, logs_p, mask, g)[1]

        report["ms"]["eager_fp32"] = _timed_ms(lambda: decode(model, ge), args.device, args.repeats)
        report["samples"] = int(decode(model, ge).shape[-1])
        if args.device == "cuda":
            half = model.half()
            ge_half = ge.half()
            report["ms"]["eager_fp16"] = _timed_ms(lambda: decode(half, ge_half), args.device, args.repeats)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    decode(half, ge_half)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_audio = decode(half, ge_half)
            report["ms"]["cuda_graph_fp16"] = _timed_ms(graph.replay, args.device, args.repeats)
            report["finite_fp16"] = bool(torch.isfinite(static_audio).all())
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
