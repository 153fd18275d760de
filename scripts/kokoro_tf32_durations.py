r"""Would TF32 products in Kokoro's text stage move any duration of a real voice? Emulated on the CPU.

The GPU engine's ``text_tf32`` (models/kokoro/engines.py) saves about 2.6 ms of a 61 ms batch of 16
on the H200, but the durations are rounded from that stage's output, and one rounding that tips
moves a whole frame of audio. This script runs the voice's duration prediction twice on the CPU,
in FP32 and with every matrix product's operands rounded to TF32 (10 explicit mantissa bits, to
nearest even: what tensor cores read when cuBLAS may use TF32; they accumulate in FP32, as here),
and counts the tokens whose frame counts differ.

It emulates the products cuBLAS would run in TF32 under ``torch.backends.cuda.matmul.allow_tf32``:
linear layers, matmul, bmm, attention. cuDNN's own TF32 switch (convolutions and LSTMs) is on by
default, so those are TF32 on the GPU with or without ``text_tf32`` and stay FP32 here. An
emulation, not the hardware: a real-voice check on a GPU would settle it.

    PYTHONPATH=. python scripts/kokoro_tf32_durations.py --sets eval_ja calibration_ja \
        --out docs/results/cpu_NN_kokoro_tf32_durations.json
"""
from __future__ import annotations

import argparse
import contextlib
import platform

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from core.paths import DEFAULT_CACHE_DIR, REPO_ROOT
from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from models.kokoro.family import load_teacher
from models.kokoro.prosody import durations_from_logits
from texts import load_sentences

MANTISSA_BITS_DROPPED = 13  # float32 keeps 23 explicit mantissa bits, TF32 10


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Float32 ``x`` rounded to the nearest TF32 value (ties to even), kept in float32."""
    bits = x.contiguous().view(torch.int32)
    keep_lsb = (bits >> MANTISSA_BITS_DROPPED) & 1
    half = (1 << (MANTISSA_BITS_DROPPED - 1)) - 1
    rounded = (bits + half + keep_lsb) & ~((1 << MANTISSA_BITS_DROPPED) - 1)
    return rounded.view(torch.float32)


class Tf32Products(TorchFunctionMode):
    """Rounds the float32 operands of every matrix product to TF32 before it runs."""

    PRODUCTS = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.mm,
                torch.addmm, torch.baddbmm, torch.einsum, F.scaled_dot_product_attention}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.PRODUCTS:
            args = tuple(round_to_tf32(a) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
                         for a in args)
        return func(*args, **kwargs)


@torch.inference_mode()
def frames_per_token(voice, utterance, tf32: bool) -> torch.Tensor:
    """(T,) the predicted frames of each token (pads included) at speed 1: the text side only."""
    ids = torch.tensor([utterance.phoneme_ids])  # (1, T) with the 0 pads
    _, prosody_style = voice.model.split_style(voice.style_row(len(utterance.phoneme_ids) - 2))  # (1, S)
    with Tf32Products() if tf32 else contextlib.nullcontext():
        logits = voice.model.prosody_features(ids, prosody_style)["duration_logits"]
    return durations_from_logits(logits, 1.0)[1][0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voice", default="jf_alpha")
    parser.add_argument("--sets", nargs="+", default=["eval_ja", "calibration_ja"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    torch.set_num_threads(args.threads)
    voice = load_teacher(args.voice, DEFAULT_CACHE_DIR).eval()
    tokens = changed_tokens = frames = frame_difference = 0
    changed_utterances = []
    for name in args.sets:
        for sentence in load_sentences(name):
            for utterance in voice.text_to_utterances(sentence):
                exact, emulated = frames_per_token(voice, utterance, False), frames_per_token(voice, utterance, True)
                differing = int((exact != emulated).sum())
                tokens += exact.numel()
                changed_tokens += differing
                frames += int(exact.sum())
                frame_difference += int((emulated.sum() - exact.sum()).abs())
                if differing:
                    changed_utterances.append({"set": name, "text": utterance.text, "tokens_changed": differing,
                                               "frames_fp32": int(exact.sum()), "frames_tf32": int(emulated.sum())})
    report = {"what": "Kokoro text stage: durations with TF32-rounded matrix products (emulated) against FP32",
              "provenance": origin, "machine": platform.node(), "torch": torch.__version__, "voice": args.voice,
              "sets": args.sets, "tokens": tokens, "tokens_changed": changed_tokens,
              "tokens_equal_fraction": 1 - changed_tokens / max(tokens, 1), "frames_fp32": frames,
              "total_frame_count_difference": frame_difference, "utterances_changed": changed_utterances}
    print_and_save_report(report, args.out)


if __name__ == "__main__":
    main()
