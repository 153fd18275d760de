r"""GPT-SoVITS v2's Lite student (the ``lite`` variant, compress/distil.py): a text-to-semantic
transformer with fewer layers (6 of the teacher's 24 by default), initialised from evenly spaced
teacher layers and distilled on the teacher's own greedy sequences. SoVITS, HuBERT and BERT stay
the teacher's.

    student = build_student(teacher_t2s, LiteT2SConfig(layers=6))
    targets = teacher_targets(teacher_t2s, inputs, tokens_per_sequence=50)     # greedy tokens + logits
    summary = train_student(student, targets, steps=2000, lr=3e-4, checkpoint_path=Path("lite_ckpt.pt"))

Token-level distillation on generated sequences: the teacher decodes each training sentence
greedily after the voice's prompt, recording its logits at every step; the student reads the same
sequence teacher-forced (one pass) and learns KL(teacher || student) on every step's distribution.
Cross-entropy on the teacher's chosen tokens is logged, not trained on: the teacher chose them from
penalised logits (repetition penalty), and pushing the student toward them would pull its raw
distribution away from the teacher's, which the same penalty then reshapes at decode time.

On a GPU machine, from a bundle written here (``python -m compress.distil prepare --family gpt_sovits_v2``):

    python -m models.gpt_sovits.lite --bundle .device/distil --checkpoint $OUT/lite_ckpt.pt \
        --steps 20000 --max-seconds 450 --device cuda --export $OUT/lite_student.safetensors

Checkpoints (student, optimizer, step) and the teacher's targets are written atomically; a run
finds them and resumes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

from core.atomic_io import atomic_write, write_text_atomic
from models.family import DistilHooks
from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.t2s import T2SConfig, Text2SemanticModel
from models.gpt_sovits.t2s_decode import decode
from models.training.schedule import learning_rate

STUDENT_PARTS = ("t2s",)
CONFIG_KEY = "lite_t2s_config"  # safetensors metadata: the student's shape
TRAINING_KEY = "training"  # safetensors metadata: the model card of the run that trained it
CHECKPOINT_EVERY = 50  # steps between checkpoints (and at the end)


@dataclass(frozen=True)
class LiteT2SConfig:
    layers: int = 6  # of the teacher's 24: a quarter of the decode step's matrix work

    def __post_init__(self):
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
            raise ValueError(f"student layers={self.layers!r}: must be a whole number >= 1")

    @classmethod
    def from_dict(cls, fields: dict) -> LiteT2SConfig:
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"the Lite T2S student takes {[f.name for f in dataclasses.fields(cls)]}; unknown {unknown}")
        return cls(**fields)


@dataclass(frozen=True)
class DecodeInput:
    """What the transformer reads for one sentence: the transcript's and the sentence's phones with
    their BERT features, after the voice's prompt tokens."""

    phoneme_ids: torch.Tensor  # (T_text,) int64
    bert_features: torch.Tensor  # (1024, T_text)
    prompt_tokens: torch.Tensor  # (T_prompt,) int64


@dataclass(frozen=True)
class TeacherTarget:
    """One training sequence: the teacher's greedy decode of a DecodeInput."""

    source: DecodeInput
    tokens: torch.Tensor  # (steps,) int64: each step's chosen token, EOS at the last step when it stopped by EOS
    logits: torch.Tensor  # (steps, V) the teacher's raw logits at each step


def teacher_layers(teacher_layers_count: int, student_layers: int) -> list[int]:
    """Evenly spaced teacher layers the student starts from, the first and the last included."""
    if student_layers > teacher_layers_count:
        raise ValueError(f"a student of {student_layers} layers from a teacher of {teacher_layers_count}")
    if student_layers == 1:
        return [teacher_layers_count - 1]
    return [round(i * (teacher_layers_count - 1) / (student_layers - 1)) for i in range(student_layers)]


def build_student(teacher: Text2SemanticModel, config: LiteT2SConfig) -> Text2SemanticModel:
    """A ``config.layers``-layer transformer: the teacher's embeddings and output layer, and its layers
    ``teacher_layers(...)`` in order."""
    student = Text2SemanticModel(dataclasses.replace(teacher.config, num_layers=config.layers))
    chosen = teacher_layers(teacher.config.layers, config.layers)
    state = {}
    for name, value in teacher.state_dict().items():
        if not name.startswith("h.layers."):
            state[name] = value
            continue
        index, rest = name[len("h.layers."):].split(".", 1)
        if int(index) in chosen:
            state[f"h.layers.{chosen.index(int(index))}.{rest}"] = value
    student.load_state_dict(state)
    return student.to(teacher.ar_predict_layer.weight.device)


def sequence_logits(model: Text2SemanticModel, source: DecodeInput, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (steps, V) of every decode step at once, teacher-forced: step 0 reads the prompt, step
    j the prompt and ``tokens[:j]``; the attention rule of ``Text2SemanticModel.prefill``."""
    device = model.ar_predict_layer.weight.device
    text = model.embed_text(source.phoneme_ids.reshape(1, -1).to(device),
                            source.bert_features.unsqueeze(0).to(device))  # (1, T_text, D)
    audio_ids = torch.cat([source.prompt_tokens, tokens[:-1]]).to(device)  # the last token is read by no step
    audio = model.embed_audio(audio_ids.reshape(1, -1), 0)  # (1, T_audio, D)
    text_length, audio_length = text.shape[1], audio.shape[1]
    attend = torch.ones(text_length + audio_length, text_length + audio_length, dtype=torch.bool, device=device)
    attend[:text_length, text_length:] = False  # text rows see no audio
    attend[text_length:, text_length:] = torch.ones(audio_length, audio_length, dtype=torch.bool,
                                                    device=device).tril()  # audio rows: causal
    x = torch.cat([text, audio], dim=1)  # (1, S, D)
    mask = attend.view(1, 1, *attend.shape)  # (1, 1, S, S)
    for layer in model.h.layers:
        x = layer(x, None, mask)[0]
    first_step = text_length + source.prompt_tokens.numel() - 1  # the last prompt position predicts step 0
    return model.ar_predict_layer(x[0, first_step:])  # (steps, V)


@torch.no_grad()  # not inference_mode: the student's backward reads these tensors
def teacher_targets(teacher: Text2SemanticModel, inputs: list[DecodeInput], tokens_per_sequence: int,
                    repetition_penalty: float = GptSovitsSampling.repetition_penalty) -> list[TeacherTarget]:
    """The teacher's greedy decode of every input, at most ``tokens_per_sequence`` tokens, with its logits."""
    sampling = GptSovitsSampling.deterministic(max_tokens=tokens_per_sequence, repetition_penalty=repetition_penalty)
    targets = []
    for source in inputs:
        decoded = decode(teacher, source.phoneme_ids, source.bert_features, source.prompt_tokens, sampling,
                         record_logits=True)
        tokens = decoded.tokens
        if decoded.stopped_by == "eos":  # the last recorded step chose EOS
            tokens = torch.cat([tokens, torch.tensor([teacher.config.eos_id])])
        # Clones outside inference mode: decode's outputs and the voice's cached prompt are inference tensors.
        source = DecodeInput(source.phoneme_ids.clone(), source.bert_features.clone(), source.prompt_tokens.clone())
        targets.append(TeacherTarget(source, tokens.clone(), decoded.step_logits.clone()))
    return targets


def distillation_losses(student: Text2SemanticModel, target: TeacherTarget) -> dict[str, torch.Tensor]:
    """KL(teacher || student) per step (summed over the vocabulary, averaged over steps: the training
    loss), and as diagnostics the cross-entropy on the teacher's tokens and the fraction of steps whose
    argmax is the teacher's token."""
    logits = sequence_logits(student, target.source, target.tokens)  # (steps, V)
    teacher_logits = target.logits.to(logits.device)
    tokens = target.tokens.to(logits.device)
    kl = F.kl_div(F.log_softmax(logits, dim=-1), F.log_softmax(teacher_logits, dim=-1), log_target=True,
                  reduction="batchmean")
    return {"kl": kl, "ce": F.cross_entropy(logits, tokens),
            "token_accuracy": (logits.argmax(dim=-1) == tokens).float().mean()}


def _save_targets(path: Path, targets: list[TeacherTarget]) -> None:
    state = {"count": torch.tensor(len(targets))}
    for i, t in enumerate(targets):
        state |= {f"{i}.phoneme_ids": t.source.phoneme_ids, f"{i}.bert_features": t.source.bert_features,
                  f"{i}.prompt_tokens": t.source.prompt_tokens, f"{i}.tokens": t.tokens, f"{i}.logits": t.logits}
    atomic_write(path, lambda tmp: save_file({k: v.contiguous() for k, v in state.items()}, tmp))


def _load_targets(path: Path) -> list[TeacherTarget]:
    state = load_file(str(path))
    return [TeacherTarget(DecodeInput(state[f"{i}.phoneme_ids"], state[f"{i}.bert_features"],
                                      state[f"{i}.prompt_tokens"]), state[f"{i}.tokens"], state[f"{i}.logits"])
            for i in range(int(state["count"]))]


def cached_targets(path: Path, teacher: Text2SemanticModel, inputs: list[DecodeInput],
                   tokens_per_sequence: int) -> list[TeacherTarget]:
    """``teacher_targets``, computed once and kept at ``path`` (a resumed run reads them back)."""
    if path.is_file():
        return _load_targets(path)
    targets = teacher_targets(teacher, inputs, tokens_per_sequence)
    _save_targets(path, targets)
    return targets


def train_student(student: Text2SemanticModel, targets: list[TeacherTarget], steps: int, lr: float,
                  checkpoint_path: Path, batch_size: int = 8, warmup_steps: int = 0, final_lr_fraction: float = 0.05,
                  seed: int = 0, max_seconds: float | None = None) -> dict:
    """Train ``student`` toward ``targets`` for ``steps`` optimizer steps of ``batch_size`` sequences
    (gradients summed over the batch's sequences, one at a time: no padding); resumes from
    ``checkpoint_path`` and writes it every ``CHECKPOINT_EVERY`` steps and at the end."""
    if not targets:
        raise ValueError("train_student needs at least one teacher sequence")
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    step, history = 0, []
    if Path(checkpoint_path).is_file():
        state = torch.load(checkpoint_path, map_location=student.ar_predict_layer.weight.device, weights_only=True)
        student.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    order = list(range(len(targets)))
    random.Random(seed).shuffle(order)
    student.train()
    start = time.perf_counter()
    while step < steps and (max_seconds is None or time.perf_counter() - start < max_seconds):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, final_lr_fraction, warmup_steps)
        optimizer.zero_grad(set_to_none=True)
        totals = {"kl": 0.0, "ce": 0.0, "token_accuracy": 0.0}
        for j in range(batch_size):
            losses = distillation_losses(student, targets[order[(step * batch_size + j) % len(order)]])
            (losses["kl"] / batch_size).backward()
            totals = {k: v + float(losses[k].detach()) / batch_size for k, v in totals.items()}
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        step += 1
        history.append(totals)
        if step % CHECKPOINT_EVERY == 0 or step == steps:
            _save_checkpoint(Path(checkpoint_path), student, optimizer, step)
    student.eval()
    tail = history[-max(1, len(history) // 5):] if history else []
    summary = {"step": step, "seconds": time.perf_counter() - start}
    for key in ("kl", "ce", "token_accuracy"):
        if tail:
            summary[f"{key}_tail_mean"] = sum(h[key] for h in tail) / len(tail)
    return summary


def _save_checkpoint(path: Path, student: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    state = {"model": student.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def save_student(student: Text2SemanticModel, config: LiteT2SConfig, path: Path, card: dict) -> None:
    """The student's weights with its shape and model card in the safetensors metadata, atomically."""
    metadata = {CONFIG_KEY: json.dumps(dataclasses.asdict(config)), TRAINING_KEY: json.dumps(card, default=str)}
    state = {k: v.detach().cpu().contiguous() for k, v in student.state_dict().items()}
    atomic_write(Path(path), lambda tmp: save_file(state, tmp, metadata=metadata))


def load_student(teacher_config: T2SConfig, path: Path) -> tuple[Text2SemanticModel, LiteT2SConfig]:
    """A student saved by ``save_student``; its other shapes are the teacher's."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if CONFIG_KEY not in metadata:
        raise ValueError(f"{path} holds no {CONFIG_KEY!r} metadata: not a GPT-SoVITS Lite student")
    config = LiteT2SConfig.from_dict(json.loads(metadata[CONFIG_KEY]))
    student = Text2SemanticModel(dataclasses.replace(teacher_config, num_layers=config.layers))
    student.load_state_dict(load_file(str(path)))
    return student.eval(), config


# ---------------------------------------------------------------- the stage's hooks (models/family.py: DistilHooks)


def voice_inputs(voice, phoneme_ids: list[list[int]]) -> list[DecodeInput]:
    """Each sentence as the voice's transformer reads it after the voice's default prompt."""
    prompt = voice.prompt_of(voice.default_reference)
    inputs = []
    for ids in phoneme_ids:
        text_ids, bert = voice.decode_input(tuple(ids), prompt)
        inputs.append(DecodeInput(text_ids, bert, prompt.tokens))
    return inputs


def _load_student_hook(voice, weights_path: Path) -> tuple[dict[str, nn.Module], dict]:
    student, config = load_student(voice.t2s.config, weights_path)
    return {"t2s": student}, dataclasses.asdict(config)


def _train_student_hook(voice, phoneme_ids: list[list[int]], student_config: dict, checkpoint_path: Path,
                        weights_path: Path, card: dict, *, steps: int, lr: float, warmup_steps: int,
                        final_lr_fraction: float, batch_size: int, segment_frames: int, latent_weight: float,
                        seed: int) -> dict:
    """Train here (compress/distil.py). ``segment_frames``: semantic tokens the teacher decodes per
    training sentence (a token is one 40 ms frame of audio). ``latent_weight`` weighs a decoder-latent
    loss in families whose student has a decoder; this student has none, so it is not read."""
    config = LiteT2SConfig.from_dict(dict(student_config))
    targets = cached_targets(Path(checkpoint_path).with_name("lite_teacher_targets.safetensors"), voice.t2s,
                             voice_inputs(voice, phoneme_ids), segment_frames)
    student = build_student(voice.t2s, config)
    summary = train_student(student, targets, steps, lr, checkpoint_path, batch_size, warmup_steps,
                            final_lr_fraction, seed)
    save_student(student, config, weights_path, {"steps": summary["step"], **card})
    return summary


def _write_bundle(voice, phoneme_ids: list[list[int]], out: Path, provenance: dict) -> None:
    """The teacher transformer (float16: a GPU call carries at most 64 MiB), its config and every
    training sentence's decode input, for ``python -m models.gpt_sovits.lite --bundle``."""
    out = Path(out)
    state = {k: v.detach().half().contiguous() for k, v in voice.t2s.state_dict().items()}
    atomic_write(out / "teacher_t2s.safetensors", lambda tmp: save_file(state, tmp))
    inputs = voice_inputs(voice, phoneme_ids)
    tensors = {"count": torch.tensor(len(inputs))}
    for i, source in enumerate(inputs):
        tensors |= {f"{i}.phoneme_ids": source.phoneme_ids, f"{i}.bert_features": source.bert_features.half(),
                    f"{i}.prompt_tokens": source.prompt_tokens}
    atomic_write(out / "inputs.safetensors", lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, tmp))
    write_text_atomic(out / "bundle.json", json.dumps({"family": voice.family,
                                                       "t2s_config": dataclasses.asdict(voice.t2s.config),
                                                       **provenance}))


DISTIL_HOOKS = DistilHooks(
    student_parts=STUDENT_PARTS,
    check_student_config=lambda fields: LiteT2SConfig.from_dict(dict(fields)),
    load_student=_load_student_hook,
    train_student=_train_student_hook,
    write_bundle=_write_bundle,
    train_command="python -m models.gpt_sovits.lite --bundle {bundle} --checkpoint $OUT/lite_ckpt.pt "
                  "--steps 20000 --max-seconds 450 --device cuda --export $OUT/lite_student.safetensors",
)


# ---------------------------------------------------------------- CLI: train from a bundle


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m models.gpt_sovits.lite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="written by python -m compress.distil prepare")
    parser.add_argument("--checkpoint", type=Path, required=True, help="resumed when it exists")
    parser.add_argument("--export", type=Path, required=True, help="the student's safetensors")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--max-seconds", type=float, default=None, help="stop this call after this long (resume later)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--tokens-per-sequence", type=int, default=500, help="the teacher's greedy tokens per sentence")
    parser.add_argument("--layers", type=int, default=LiteT2SConfig.layers)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    bundle = json.loads((args.bundle / "bundle.json").read_text(encoding="utf-8"))
    teacher = Text2SemanticModel(T2SConfig(**bundle["t2s_config"]))
    teacher.load_state_dict({k: v.float() for k, v in load_file(str(args.bundle / "teacher_t2s.safetensors")).items()})
    teacher = teacher.eval().to(args.device)
    tensors = load_file(str(args.bundle / "inputs.safetensors"))
    inputs = [DecodeInput(tensors[f"{i}.phoneme_ids"], tensors[f"{i}.bert_features"].float(),
                          tensors[f"{i}.prompt_tokens"]) for i in range(int(tensors["count"]))]
    targets = cached_targets(args.checkpoint.with_name("lite_teacher_targets.safetensors"), teacher, inputs,
                             args.tokens_per_sequence)
    config = LiteT2SConfig(layers=args.layers)
    student = build_student(teacher, config)
    summary = train_student(student, targets, args.steps, args.lr, args.checkpoint, args.batch_size,
                            args.warmup_steps, max_seconds=args.max_seconds)
    if summary["step"] >= args.steps:
        save_student(student, config, args.export, {"steps": summary["step"], "bundle": bundle})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
