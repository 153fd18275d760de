"""Serve a variant through PyTriton: Triton's HTTP/gRPC front end and dynamic batcher, our callable.

    bash scripts/pytriton_env.sh      # once: PyTriton needs numpy<2, so it has its own venv
    .venv-pytriton/bin/python -m serve.pytriton_server --variant original_onnx --http-port 8010
    .venv-pytriton/bin/python -m serve.pytriton_server --manifest outputs/champion/piper/manifest.json \
        --http-port 8010 --grpc-port 8011 --metrics-port 8012 --max-batch-size 16 --max-queue-delay-us 2000

Model ``tts`` (Triton listens on 127.0.0.1 only). Per request:

* inputs: ``text`` BYTES (1,) UTF-8; optional ``seed`` INT64 (1,) (default 0) and ``scales`` FP32 (3,)
  (noise_scale, length_scale, noise_scale_w; default VITS sampling's 0.667, 1.0, 0.8);
* outputs: ``audio`` FP32 (-1,) at the voice's sample rate, every sentence of the text one after
  the other; ``audio_length`` INT64 (1,) samples; ``batch_size`` INT64 (1,): how many requests
  Triton's batcher handed the callable together with this one (PyTriton restricts Triton's
  statistics API, so this is how a client sees batching).

The callable runs the variant in the family's reference runtime (``family.reference``; families
with VITS-style sampling, whose graphs take these scales and noise tensors) and draws each
request's noise as that runtime does for the request alone, so a request's audio does not depend on what it was
batched with. Triton hands the callable every request its batcher gathered (up to
``--max-batch-size``); they run as one padded onnxruntime batch per set of scales.
"""
from __future__ import annotations

import argparse
import logging
import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

from models.interface import SynthesisRequest, TTSModel
from models.registry import FAMILIES, get_family
from models.sampling import VitsSampling
from serve.triton_repo import VARIANTS

MODEL_NAME = "tts"
HOST = "127.0.0.1"
DEFAULT_SCALES = (VitsSampling.noise_scale, VitsSampling.length_scale, VitsSampling.noise_scale_w)
LOGGER = logging.getLogger("serve.pytriton_server")


def load_voice(manifest_path: Path | None, variant: str | None, voice: str, threads: int,
               family: str = next(iter(FAMILIES))) -> TTSModel:
    """The variant in onnxruntime: a champion's graph from its manifest (which names its family), or
    ``original_onnx`` of ``family``'s ``voice`` ("" for the family's default voice)."""
    if (manifest_path is None) == (variant is None):
        raise ValueError("give exactly one of --manifest PATH or --variant NAME")
    if manifest_path is not None:
        from export.manifest import load_manifest

        manifest = load_manifest(Path(manifest_path))
        return _reference(manifest.family).load_graph(manifest.voice, threads, manifest.graph_path(manifest_path))
    if variant not in VARIANTS:
        raise ValueError(f"--variant {variant!r}: use one of {list(VARIANTS)}, or --manifest for a champion")
    return _reference(family).load(voice or get_family(family).default_voice, threads)


def _reference(family: str):
    """``family``'s reference runtime; a ValueError for a family that ships no graph."""
    runtime = get_family(family).reference
    if runtime is None:
        raise ValueError(f"family {family} ships no graph of its own: Triton serves onnxruntime graphs")
    return runtime


class SpeechCallable:
    """Triton's inference callable: a list of requests in, one response dict per request out."""

    def __init__(self, voice: TTSModel):
        self.voice = voice

    def _items(self, requests) -> list[tuple[int, str, int, tuple[float, float, float]]]:
        """(request index, text, seed, scales) for every row of every request."""
        items = []
        for index, request in enumerate(requests):
            texts = request.data["text"]  # (n, 1) bytes
            seeds = request.data.get("seed", np.zeros((len(texts), 1), np.int64))  # (n, 1)
            scales = request.data.get("scales", np.tile(np.float32(DEFAULT_SCALES), (len(texts), 1)))  # (n, 3)
            for row in range(len(texts)):
                text = texts[row, 0]
                text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
                items.append((index, text, int(seeds[row, 0]), tuple(float(s) for s in scales[row])))
        return items

    def __call__(self, requests) -> list[dict[str, np.ndarray]]:
        items = self._items(requests)
        audio_by_item: list[np.ndarray | None] = [None] * len(items)
        for scales in sorted({item[3] for item in items}):
            members = [k for k, item in enumerate(items) if item[3] == scales]
            for k, waveform in zip(members, self._synthesize([items[k] for k in members], scales)):
                audio_by_item[k] = waveform
        responses = []
        for index in range(len(requests)):
            rows = [audio_by_item[k] for k, item in enumerate(items) if item[0] == index]
            width = max(len(row) for row in rows)
            audio = np.zeros((len(rows), width), np.float32)  # (n, T_audio), right-padded
            for row, waveform in enumerate(rows):
                audio[row, : len(waveform)] = waveform
            lengths = np.array([[len(row)] for row in rows], np.int64)  # (n, 1)
            batch_size = np.full((len(rows), 1), len(requests), np.int64)  # (n, 1)
            responses.append({"audio": audio, "audio_length": lengths, "batch_size": batch_size})
        return responses

    def _synthesize(self, items, scales: tuple[float, float, float]) -> list[np.ndarray]:
        """One padded batch of every sentence of ``items``; each item's noise drawn as if it ran alone."""
        noise_scale, length_scale, noise_scale_w = scales
        sequences, owners, duration_noises, prior_noises = [], [], [], []
        for k, (_, text, seed, _) in enumerate(items):
            item_sequences = self.voice.text_to_utterances(text)
            item_noise = VitsSampling(noise_scale=noise_scale, length_scale=length_scale, noise_scale_w=noise_scale_w,
                                      seed=seed)
            duration_noise, prior_noise = item_noise.draw(
                len(item_sequences), max(len(s.phoneme_ids) for s in item_sequences), self.voice.latent_channels
            )  # (n_k, 2, T_text_k), (n_k, C_latent, T_frames_cap_k)
            sequences += item_sequences
            owners += [k] * len(item_sequences)
            duration_noises.append(duration_noise)
            prior_noises.append(prior_noise)
        request = SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(
            noise_scale=noise_scale, length_scale=length_scale, noise_scale_w=noise_scale_w,
            duration_noise=_pad_cat(duration_noises),  # (B, 2, T_text)
            prior_noise=_pad_cat(prior_noises),  # (B, C_latent, T_frames_cap)
        ))
        waveforms = self.voice.synthesize(request).waveforms()
        return [torch.cat([w for w, owner in zip(waveforms, owners) if owner == k]).numpy()
                for k in range(len(items))]


def _pad_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate (n_i, C, T_i) along the batch, zero-padding time to the longest: the graph masks the padding."""
    width = max(t.shape[2] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[2])) for t in tensors])


def use_running_libpython() -> None:
    """Point Triton's Python backend at this interpreter's libpython.

    Without this the backend stub loads the system's libpython (Debian's, here), which cannot
    import this venv's packages; see ../shared/ENV_NOTES.md.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if libdir and libdir not in paths:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([libdir, *paths])


def serve(voice: TTSModel, http_port: int, grpc_port: int, metrics_port: int,
          max_batch_size: int, max_queue_delay_us: int) -> None:
    """Bind the callable and block until interrupted (SIGINT/SIGTERM stop Triton cleanly)."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    use_running_libpython()
    config = TritonConfig(http_address=HOST, http_port=http_port, grpc_address=HOST, grpc_port=grpc_port,
                          metrics_address=HOST, metrics_port=metrics_port)
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=SpeechCallable(voice),
            inputs=[
                Tensor(name="text", dtype=bytes, shape=(1,)),
                Tensor(name="seed", dtype=np.int64, shape=(1,), optional=True),
                Tensor(name="scales", dtype=np.float32, shape=(3,), optional=True),
            ],
            outputs=[
                Tensor(name="audio", dtype=np.float32, shape=(-1,)),
                Tensor(name="audio_length", dtype=np.int64, shape=(1,)),
                Tensor(name="batch_size", dtype=np.int64, shape=(1,)),
            ],
            config=ModelConfig(
                max_batch_size=max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=max_queue_delay_us),
            ),
            strict=True,
        )
        LOGGER.info("serving %s on http://%s:%d (grpc %d, metrics %d)", MODEL_NAME, HOST, http_port,
                    grpc_port, metrics_port)
        triton.serve()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", type=Path, help="a champion's manifest.json (export/manifest.py)")
    source.add_argument("--variant", help=f"one of {list(VARIANTS)}")
    parser.add_argument("--family", choices=sorted(FAMILIES), default=next(iter(FAMILIES)),
                        help="the family of --variant (a manifest names its own)")
    parser.add_argument("--voice", default="", help="the voice of --variant; default: the family's own")
    parser.add_argument("--http-port", type=int, default=8010)
    parser.add_argument("--grpc-port", type=int, default=8011)
    parser.add_argument("--metrics-port", type=int, default=8012)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-queue-delay-us", type=int, default=2000,
                        help="how long Triton holds a request to gather a batch (2 ms: small beside synthesis)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    args = parser.parse_args(argv)
    if args.max_batch_size < 1:
        parser.error(f"--max-batch-size {args.max_batch_size}: must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    voice = load_voice(args.manifest, args.variant, args.voice, args.threads, args.family)
    serve(voice, args.http_port, args.grpc_port, args.metrics_port, args.max_batch_size, args.max_queue_delay_us)


if __name__ == "__main__":
    main()
