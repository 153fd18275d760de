"""Time from a GPT-SoVITS v2 speech request to its first streamed audio chunk, end to end on the path the
server runs (serve/token_scheduler.py driving the voice's step decoder with ``step_chunks``): the text's
phones, the join (the prompt's prefill into the static-cache engine), the token steps up to
``--first-chunk-tokens`` tokens, and SoVITS on the first chunk's window (models/gpt_sovits/streaming.py).
The voice's prompt is cached before timing (as the server caches an uploaded voice's).

    PYTHONPATH=. python scripts/bench_gpt_sovits_first_chunk.py --device cuda --out $OUT/first_chunk.json
    PYTHONPATH=. python scripts/bench_gpt_sovits_first_chunk.py --device cpu --repeats 2 \\
        --out docs/results/cpu_8_gpt_sovits_first_chunk.json

Full-size random weights from the official manifests (models/gpt_sovits/data/): speed and memory are
real, the audio is not speech. Also measured: the streamed audio against one decode of the same
tokens (``seam``: SNR and the largest error near chunk seams and elsewhere). The JSON is rewritten
after each section, so a run cut short keeps what it measured. Light on purpose: torch, numpy and
transformers only (no Hydra, no MLflow), so it runs on a bare GPU machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, publication_or_exit
from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.streaming import ChunkSettings, seam_error
from models.gpt_sovits.voice_files import GptSovitsFiles, load_voice
from models.interface import SynthesisRequest

SENTENCE = "Where is my lantern?"  # 20 characters: a short first sentence of a request
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def first_chunk_once(voice, decoder, sampling: GptSovitsSampling, key: int, device: str) -> dict:
    """One request: its timings (ms) to the first chunk; the rest of the sentence is then decoded untimed."""
    _sync(device)
    started_s = time.perf_counter()
    utterances = voice.text_to_utterances(SENTENCE)
    phonemized_s = time.perf_counter()
    decoder.join(key, SynthesisRequest.from_utterances(utterances[:1], sampling=sampling))
    _sync(device)
    joined_s = time.perf_counter()
    steps = 0
    while True:
        step_started_s = time.perf_counter()
        made = decoder.step_chunks()
        steps += 1
        if made:
            chunk = made[0][1].float().cpu()  # what the scheduler hands the response (a host copy)
            done_s = time.perf_counter()
            break
    while decoder.active:  # finish the sentence, untimed, so the next request gets the engine's slot
        decoder.step_chunks()
    return {"total_ms": 1000 * (done_s - started_s), "phonemize_ms": 1000 * (phonemized_s - started_s),
            "join_prefill_ms": 1000 * (joined_s - phonemized_s),
            "steps_before_chunk_ms": 1000 * (step_started_s - joined_s),
            "chunk_step_and_sovits_ms": 1000 * (done_s - step_started_s), "steps": steps,
            "chunk_samples": int(chunk.numel()), "chunk_was_last": bool(made[0][2])}


def measure_seams(voice, settings: ChunkSettings, sampling: GptSovitsSampling, token_count: int) -> dict:
    """The streamed audio of ``token_count`` random tokens against one decode of them."""
    utterance = voice.text_to_utterances(SENTENCE)[0]
    prompt = voice.prompt_of(voice.default_reference)
    tokens = torch.randint(0, voice.sovits.config.codebook_size, (token_count,),
                           generator=torch.Generator().manual_seed(1))
    stream = voice.audio_stream(utterance.phoneme_ids, prompt, sampling, settings)
    chunks = []
    for count in range(1, token_count + 1):
        chunks += stream.push(tokens[:count])
    chunks.append(stream.finish(tokens))
    whole = voice.tokens_to_audio(tokens, utterance.phoneme_ids, prompt, sampling).float().clamp(-1, 1)
    return {"tokens": token_count, "peak": float(whole.abs().max()),
            **seam_error(chunks, whole, seam_radius_samples=voice.hop_length).as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES),
                        help="the voice's weights (T2S engine and SoVITS); half precision only on cuda")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="replay the engine's decode step and the SoVITS windows as CUDA graphs (cuda only)")
    parser.add_argument("--first-chunk-tokens", type=int, default=ChunkSettings.first_chunk_tokens)
    parser.add_argument("--max-tokens", type=int, default=60,
                        help="a sentence's cap: random weights seldom choose EOS")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seam-tokens", type=int, default=110, help="0 skips the seam measurement")
    parser.add_argument("--out", type=Path, required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    if args.dtype != "float32" and args.device != "cuda":
        parser.error(f"--dtype {args.dtype} runs on cuda only; use float32 on the CPU")
    if args.max_tokens < args.first_chunk_tokens:
        parser.error(f"--max-tokens {args.max_tokens} < --first-chunk-tokens {args.first_chunk_tokens}: "
                     "no chunk would leave before the sentence ends")
    torch.set_num_threads(args.threads)
    settings = ChunkSettings(first_chunk_tokens=args.first_chunk_tokens)
    sampling = GptSovitsSampling(seed=0, max_tokens=args.max_tokens)

    voice = load_voice(GptSovitsFiles.parse("random"))
    voice.prompt_of(voice.default_reference)  # the prompt cache is warm before the first request
    voice = voice.to(args.device, DTYPES[args.dtype])
    voice.graph_windows = args.cuda_graphs  # SoVITS windows as CUDA graphs (models/gpt_sovits/window_graphs.py)
    decoder = voice.step_decoder(max_rows=1, chunking=settings)
    graphs = args.device == "cuda" and args.cuda_graphs
    if graphs:
        decoder.engine.capture_graphs()
    report = {
        "what": "GPT-SoVITS v2 request -> first streamed audio chunk (phones, prefill, token steps, SoVITS window), "
                "full-size random weights, prompt cached",
        "sentence": SENTENCE, "chunking": vars(settings), "sampling": {"top_k": sampling.top_k,
                                                                      "noise_scale": sampling.noise_scale},
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "dtype": args.dtype, "cuda_graphs": graphs, "threads": args.threads, "torch": torch.__version__,
        "samples_per_token": voice.hop_length, "sample_rate_hz": voice.sample_rate_hz,
        "provenance": origin,
    }

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")

    with torch.inference_mode():
        for key in range(args.warmup):
            first_chunk_once(voice, decoder, sampling, key, args.device)
        runs = [first_chunk_once(voice, decoder, sampling, args.warmup + key, args.device)
                for key in range(args.repeats)]
        report["first_chunk"] = {
            "median_ms": statistics.median(run["total_ms"] for run in runs),
            "min_ms": min(run["total_ms"] for run in runs),
            "median_parts_ms": {part: statistics.median(run[part] for run in runs) for part in
                                ("phonemize_ms", "join_prefill_ms", "steps_before_chunk_ms",
                                 "chunk_step_and_sovits_ms")},
            "chunk_audio_s": runs[0]["chunk_samples"] / voice.sample_rate_hz,
            "runs": runs,
        }
        save()
        if args.seam_tokens:
            report["seam"] = measure_seams(voice, settings, sampling, args.seam_tokens)
            save()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
