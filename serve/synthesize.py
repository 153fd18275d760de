"""Speak each line of a text file into its own WAV, with any variant a table reports, so anyone can
listen to and score exactly what was measured.

    python -m serve.synthesize --text-file lines.txt --out-dir wavs/ --voice bundled:joe \
        --engine torch --noise-scale 0.667 --length-scale 1.0 --noise-scale-w 0.8 --seed 0 --device cpu
    python -m serve.synthesize --text-file lines.txt --out-dir wavs_fp16/ --variant fp16        # teacher, fp16 parts
    python -m serve.synthesize --text-file lines.txt --out-dir wavs_int8/ \
        --graph outputs/stages/int8_ort/int8_ort.onnx                                           # any exported graph
    python -m serve.synthesize --text-file lines.txt --out-dir wavs_champion/ \
        --manifest outputs/champion/piper/manifest.json                                               # the deployed champion

``--engine torch|onnxruntime`` is ``--variant teacher|original_onnx``. ``--variant fp16|bf16`` builds
the teacher with its parts in half precision as the stage and the server build it. ``--graph`` runs
a graph exported in the family's contract (a pruned, INT8 or Lite variant's ``onnx`` artifact) in
the family's graph runtime; ``--manifest`` runs what a manifest deploys.

``--family`` picks the family (models/registry.py; the first registered by default), ``--voice``
its voice (the family's default voice when left out). ``--noise-scale`` and ``--noise-scale-w``
are options of VITS-style sampling; a family without them refuses them by name.

Writes ``0001.wav``, ``0002.wav``, ... (16-bit PCM at the voice's sample rate), one per non-empty
line, and ``durations.json``: for each WAV, the frames per phoneme id of each of its sentences
(null for families whose results carry no durations), so that two engines or two variants can be
compared phoneme by phoneme.
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

from core.paths import DEFAULT_CACHE_DIR
from models.family import Family
from models.interface import SynthesisRequest, TTSModel, UnspeakableTextError
from models.registry import FAMILIES, get_family
from models.sampling import Sampling
from models.text.sanitize import UnsafeTextError, speakable_text
from serve.engines import load_deployed, load_variant
from serve.settings import SERVABLE_VARIANTS

ENGINES = ("torch", "onnxruntime")
ENGINE_VARIANTS = {"torch": "teacher", "onnxruntime": "original_onnx"}  # --engine is shorthand for these
SAMPLING_FLAGS = ("noise_scale", "noise_scale_w")  # flags that are options of a family's sampling type


def read_lines(text_file: Path) -> list[tuple[int, str]]:
    """(1-based line number in the file, text) for every non-empty line, each under the server's text rule
    (models/text/sanitize.py: NFKC with full-width punctuation kept, whitespace runs to one space); a control
    or format character in a line (a NUL would cut the line short in espeak-ng) fails the run, naming the
    line and position."""
    text_file = Path(text_file)
    if not text_file.is_file():
        raise FileNotFoundError(f"text file {text_file} not found: give a UTF-8 file with one utterance per line")
    numbered = []
    for number, line in enumerate(text_file.read_text(encoding="utf-8-sig").splitlines(), start=1):  # a BOM is no text
        try:
            text = speakable_text(line)
        except UnsafeTextError as error:
            raise ValueError(f"{text_file} line {number}: {error}") from error
        if text:
            numbered.append((number, text))
    if not numbered:
        raise ValueError(f"text file {text_file} has no non-empty line: write one utterance per line")
    return numbered


def check_sampling(sampling: Sampling) -> None:
    """Reject values the model would take silently: a negative option (noise scales), a non-positive pace."""
    for name in sampling.option_names():
        if getattr(sampling, name) < 0:
            raise ValueError(f"{name} is {getattr(sampling, name)}: give a value >= 0 (0 makes synthesis deterministic)")
    if sampling.length_scale <= 0:
        raise ValueError(f"length_scale is {sampling.length_scale}: give a value > 0 (>1 speaks slower)")


def load_source(family: Family, voice: str, variant: str | None, graph: Path | None, manifest: Path | None,
                device: str = "cpu") -> TTSModel:
    """The model to speak with: a manifest's deployed variant, an exported graph, or a named variant."""
    if sum(source is not None for source in (variant, graph, manifest)) > 1:
        raise ValueError("give one of --variant (or --engine), --graph, --manifest")
    if manifest is not None:
        return load_deployed(Path(manifest), threads=0, device=device).model
    if graph is not None:
        if family.reference is None:
            raise ValueError(f"family {family.name} has no runtime for exported graphs")
        if not Path(graph).is_file():
            raise FileNotFoundError(f"--graph {graph}: no such file; give a graph a run exported (its onnx artifact)")
        return family.reference.load_graph(voice or family.default_voice, 0, Path(graph))
    variant = variant or "teacher"
    if variant in ENGINE_VARIANTS.values():
        return load_engine(family, voice, next(e for e, v in ENGINE_VARIANTS.items() if v == variant), device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("torch here sees no CUDA GPU: use --device cpu")
    return load_variant(family, variant, voice, 0, device).model


def load_engine(family: Family, voice: str, engine: str, device: str = "cpu") -> TTSModel:
    """The family's voice in PyTorch (``torch``) or as its original graph in onnxruntime (``onnxruntime``,
    on the CPU); ``voice`` "" is the family's default voice."""
    voice = voice or family.default_voice
    if engine == "torch":
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("torch here sees no CUDA GPU: use --device cpu")
        return family.load_teacher(voice, DEFAULT_CACHE_DIR).to(device)
    if engine == "onnxruntime":
        if family.reference is None:
            raise ValueError(f"family {family.name} ships no graph of its own: use --engine torch")
        if device != "cpu":
            raise ValueError("the family's graph runs in onnxruntime on the CPU here: use --device cpu, or "
                             "--engine torch on the GPU")
        return family.reference.load(voice, 0)
    raise ValueError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")


def synthesize_lines(
    model: TTSModel, lines: list[str], sampling: Sampling, line_numbers: list[int] | None = None
) -> list[tuple[torch.Tensor, list[list[int]] | None]]:
    """(waveform (T_audio,), per-sentence durations in frames per phoneme id or None) for each line.

    The sentences of one line run as one padded batch; their trimmed waveforms are concatenated.
    ``line_numbers`` names the lines in errors (file line numbers); 1, 2, ... by default.
    """
    check_sampling(sampling)
    line_numbers = line_numbers or list(range(1, len(lines) + 1))
    sequences_per_line = []
    for number, line in zip(line_numbers, lines):
        try:
            sequences_per_line.append(model.text_to_utterances(line))
        except UnspeakableTextError as error:
            raise UnspeakableTextError(f"line {number}: {error}") from error
    outputs = []
    for sequences in sequences_per_line:
        result = model.synthesize(SynthesisRequest.from_utterances(sequences, sampling=sampling))
        durations = None if result.durations is None else [
            result.durations[i, : len(seq.phoneme_ids)].tolist() for i, seq in enumerate(sequences)]
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


def write_outputs(outputs: list[tuple[torch.Tensor, list[list[int]] | None]], out_dir: Path, sample_rate_hz: int) -> None:
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
    parser.add_argument("--family", choices=sorted(FAMILIES), default=next(iter(FAMILIES)))
    parser.add_argument("--voice", default="", help="a voice of the family (e.g. 'bundled:joe' or an .onnx path); "
                                                    "default: the family's own")
    parser.add_argument("--engine", choices=ENGINES, default=None, help="torch = --variant teacher, "
                        "onnxruntime = --variant original_onnx (the default is the teacher)")
    # int8_dynamic needs the parts its stage converted: a champion's manifest (--manifest) carries them.
    parser.add_argument("--variant", choices=[v for v in SERVABLE_VARIANTS if v != "int8_dynamic"], default=None,
                        help="a variant built from the voice")
    parser.add_argument("--graph", type=Path, default=None, help="an exported graph in the family's contract")
    parser.add_argument("--manifest", type=Path, default=None, help="a deployment manifest (the champion's)")
    parser.add_argument("--noise-scale", type=float, default=None, help="default: the family's sampling default")
    parser.add_argument("--length-scale", type=float, default=1.0)
    parser.add_argument("--noise-scale-w", type=float, default=None, help="default: the family's sampling default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    family = get_family(args.family)
    options = {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None}
    try:
        sampling = family.sampling(length_scale=args.length_scale, seed=args.seed, **options)
        check_sampling(sampling)  # before the voice loads: bad flags should fail in milliseconds
        numbered = read_lines(args.text_file)
        if args.engine is not None and args.variant is not None:
            raise ValueError("give --engine or --variant, not both")
        variant = ENGINE_VARIANTS[args.engine] if args.engine is not None else args.variant
        model = load_source(family, args.voice, variant, args.graph, args.manifest, args.device)
        outputs = synthesize_lines(model, [text for _, text in numbered], sampling, [n for n, _ in numbered])
    except (FileNotFoundError, ValueError) as error:  # UnspeakableTextError and ManifestError are ValueErrors
        parser.error(str(error))
    write_outputs(outputs, args.out_dir, model.sample_rate_hz)
    print(f"wrote {len(outputs)} WAVs and durations.json to {args.out_dir}")


if __name__ == "__main__":
    main()
