"""Speak each line of a text file into its own WAV, with a Piper voice in PyTorch or onnxruntime.

    python -m serve.synthesize --text-file lines.txt --out-dir wavs/ --voice bundled:joe \
        --engine torch --noise-scale 0.667 --length-scale 1.0 --noise-scale-w 0.8 --seed 0 --device cpu

Writes ``0001.wav``, ``0002.wav``, ... (16-bit PCM at the voice's sample rate), one per non-empty
line, and ``durations.json``: for each WAV, the frames per phoneme id of each of its sentences,
so that two engines or two variants can be compared phoneme by phoneme.
All lines are phonemized before any audio is made: one unspeakable line fails the run at once.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import soundfile
import torch

from models.interface import SynthesisRequest, TTSModel
from models.sampling import VitsSampling
from models.interface import UnspeakableTextError

ENGINES = ("torch", "onnxruntime")


def read_lines(text_file: Path) -> list[tuple[int, str]]:
    """(1-based line number in the file, text) for every non-empty line."""
    text_file = Path(text_file)
    if not text_file.is_file():
        raise FileNotFoundError(f"text file {text_file} not found: give a UTF-8 file with one utterance per line")
    numbered = [(number, line.strip()) for number, line in
                enumerate(text_file.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()]
    if not numbered:
        raise ValueError(f"text file {text_file} has no non-empty line: write one utterance per line")
    return numbered


def check_noise(noise: VitsSampling) -> None:
    """Reject scales the model would take silently: negative noise, non-positive length."""
    for name in ("noise_scale", "noise_scale_w"):
        if getattr(noise, name) < 0:
            raise ValueError(f"{name} is {getattr(noise, name)}: give a value >= 0 (0 makes synthesis deterministic)")
    if noise.length_scale <= 0:
        raise ValueError(f"length_scale is {noise.length_scale}: give a value > 0 (>1 speaks slower)")


def load_engine(voice: str, engine: str, device: str = "cpu") -> TTSModel:
    """The voice in PyTorch (``torch``) or as the original graph in onnxruntime (``onnxruntime``)."""
    if engine == "torch":
        from models.piper.voice import PiperVoice

        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("torch here sees no CUDA GPU: use --device cpu")
        return PiperVoice.load(voice).to(device)
    if engine == "onnxruntime":
        import onnxruntime

        from models.piper.onnx_runtime import PiperOnnxRuntimeVoice

        provider = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}[device]
        if provider not in onnxruntime.get_available_providers():
            raise ValueError(f"onnxruntime here has no {provider}: use --device cpu or --engine torch")
        return PiperOnnxRuntimeVoice(voice, providers=[provider])
    raise ValueError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")


def synthesize_lines(
    model: TTSModel, lines: list[str], noise: VitsSampling, line_numbers: list[int] | None = None
) -> list[tuple[torch.Tensor, list[list[int]]]]:
    """(waveform (T_audio,), per-sentence durations in frames per phoneme id) for each line.

    The sentences of one line run as one padded batch; their trimmed waveforms are concatenated.
    ``line_numbers`` names the lines in errors (file line numbers); 1, 2, ... by default.
    """
    check_noise(noise)
    line_numbers = line_numbers or list(range(1, len(lines) + 1))
    sequences_per_line = []
    for number, line in zip(line_numbers, lines):
        try:
            sequences_per_line.append(model.text_to_utterances(line))
        except UnspeakableTextError as error:
            raise UnspeakableTextError(f"line {number}: {error}") from error
    outputs = []
    for sequences in sequences_per_line:
        result = model.synthesize(SynthesisRequest.from_utterances(sequences, sampling=noise))
        durations = [result.durations[i, : len(seq.phoneme_ids)].tolist() for i, seq in enumerate(sequences)]
        outputs.append((torch.cat(result.waveforms()), durations))
    return outputs


@contextmanager
def _atomic_target(path: Path):
    """A temporary path beside ``path``, renamed onto it on success: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes files private; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_outputs(outputs: list[tuple[torch.Tensor, list[list[int]]]], out_dir: Path, sample_rate_hz: int) -> None:
    """``0001.wav``, ... and ``durations.json`` (one WAV per JSON line, so diffs point at the line)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_rows = []
    for index, (waveform, durations) in enumerate(outputs, start=1):
        wav_name = f"{index:04d}.wav"
        with _atomic_target(out_dir / wav_name) as tmp:
            soundfile.write(tmp, waveform.numpy(), sample_rate_hz, subtype="PCM_16", format="WAV")
        json_rows.append(f"{json.dumps(wav_name)}: {json.dumps(durations)}")
    with _atomic_target(out_dir / "durations.json") as tmp:
        Path(tmp).write_text("{\n" + ",\n".join(json_rows) + "\n}\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text-file", type=Path, required=True, help="one utterance per line")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--voice", default="bundled:joe", help="'bundled:joe' or a Piper .onnx path")
    parser.add_argument("--engine", choices=ENGINES, default="torch")
    parser.add_argument("--noise-scale", type=float, default=0.667)  # Piper's defaults, as in VitsSampling
    parser.add_argument("--length-scale", type=float, default=1.0)
    parser.add_argument("--noise-scale-w", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    noise = VitsSampling(noise_scale=args.noise_scale, length_scale=args.length_scale,
                         noise_scale_w=args.noise_scale_w, seed=args.seed)
    try:
        check_noise(noise)  # before the voice loads: bad flags should fail in milliseconds
        numbered = read_lines(args.text_file)
        model = load_engine(args.voice, args.engine, args.device)
        outputs = synthesize_lines(model, [text for _, text in numbered], noise, [n for n, _ in numbered])
    except (FileNotFoundError, ValueError) as error:  # UnspeakableTextError is a ValueError
        parser.error(str(error))
    write_outputs(outputs, args.out_dir, model.sample_rate_hz)
    print(f"wrote {len(outputs)} WAVs and durations.json to {args.out_dir}")


if __name__ == "__main__":
    main()
