"""Stage: structured channel pruning of the HiFi-GAN decoder (optionally also the text encoder's
feed-forward layers), then a short recovery fine-tune.

Inputs -> artifact + metrics, like every stage:

    from compress.prune import PruneSettings, build

    settings = PruneSettings(ratio=0.5, importance="taylor", parts=["decoder"], finetune_steps=300,
                             finetune_lr=3e-4, finetune_sentences=200)
    pruned = build(teacher, settings, ctx)   # teacher: the fp32 Variant; ctx: compress.variants.StageContext
    pruned.stage_metrics["decoder_ms_b1_after"], pruned.artifacts["decoder_weights"]

Torch-Pruning's DependencyGraph groups every convolution whose channels must go together: in each
upsampling stage the ConvTranspose1d's outputs, every resblock convolution (their outputs meet on
residual sums) and the next stage's inputs form one group, so one ratio removes whole channels
coherently. The latent input (conv_pre's inputs) and the single output channel of conv_post stay.
Only the decoder changes: durations and latents are the teacher's, sample for sample.

Importance: "magnitude" ranks a channel group by the L2 norm of its weights; "taylor" by the
second-order Taylor saliency of the distillation loss on calibration batches (its first-order
term is zero at the teacher, see ``_second_order_taylor_gradients``). At ratio 0.5, before any
fine-tune, taylor left an MR-STFT loss of 2.55 against magnitude's 3.37 on calibration segments,
and 0.97 against 1.52 after 300 fine-tune steps.

``encoder_ffn`` narrows the inner width (768) of the text encoder's six feed-forward layers,
which hold 5.3 M of the medium voice's 15.7 M parameters, and fine-tunes the encoder on the
teacher encoder's outputs. It changes the encoder's outputs, so durations move: at ratio 0.5
after 300 steps, 24% of phonemes on 16 calibration sentences changed by a frame or more (MCD 1.4 dB
against the teacher, 15.65 M -> 12.99 M parameters).

The pruned decoder is then fine-tuned toward the teacher decoder's audio on the teacher's own
latents (compress.decoder_training) from ``texts.training_text``, never eval or Harvard.
Its weights (safetensors) and shapes (JSON, rebuilt by ``decoder_training.load_decoder``) go to
``ctx.work_dir``; a finished or half-finished run found there is resumed, not redone.
"""
from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from compress.decoder_training import (
    DistillationLoss, LatentDataset, SegmentSampler, atomic_write, convolution_channels, hyperparams_from_dict,
    learning_rate, load_decoder, resize_convolutions, save_decoder, save_module, train_decoder,
)
from core.config import ConfigError
from compress.variants import StageContext, Variant, check_part_roles, require_parts
from evaluate.memory import parameter_count, state_dict_size_mb
from models.family import Family
from models.interface import SynthesisRequest, Utterance
from models.piper.vits import TextEncoder, VitsHyperParams
from texts.training_text import generate_training_sentences

IMPORTANCES = ("magnitude", "taylor")
PRUNABLE_PARTS = ("decoder", "encoder_ffn")  # encoder_ffn: the inner width of the text encoder's feed-forward layers
PART_OF = {"decoder": "decoder", "encoder_ffn": "encoder"}  # the part role each prunable piece lives in
ENCODER_KIND = "piper_text_encoder"
REPORT_FILE = "prune_report.json"
DECODER_FILES = ("pruned_decoder_init.safetensors", "pruned_decoder_init.json", "finetune_checkpoint.pt",
                 "finetune_latents.safetensors", "pruned_decoder.safetensors", "pruned_decoder.json")
FINAL_LR_FRACTION = 0.1  # fine-tunes decay their learning rate (cosine) to a tenth
ROUND_CHANNELS_TO = 8  # widths in multiples of 8 keep oneDNN and tensor-core kernels on their fast paths
CALIBRATION_BATCHES = 2  # batches of calibration segments (steps 0, 1) for Taylor importance
LOSS_CHECK_STEPS = (1000, 1001, 1002, 1003)  # other calibration batches: the before/after loss checks
SPEED_FRAMES = 100  # latent frames of the speed check: 100 * 256 / 22050 = 1.16 s of audio
SPEED_RUNS = 10  # timed runs after one warm-up; the median is reported (the machine may be shared)
SEED = 0


@dataclass(frozen=True)
class PruneSettings:
    ratio: float  # fraction of channels removed from every coupled group, in (0, 1)
    importance: str  # "magnitude" (L2 of the group's weights) or "taylor" (needs calibration batches)
    parts: tuple[str, ...] = ("decoder",)
    finetune_steps: int = 300  # recovery steps; about 0.6 s each at ratio 0.5, batch 8, one CPU thread
    # Peak of a warm-up + cosine schedule. 40 steps at ratio 0.5 reached MR-STFT 1.48 / 1.28 / 1.25
    # with 1e-4 / 3e-4 / 1e-3 (calibration segments), so 3e-4, near HiFi-GAN's 2e-4.
    finetune_lr: float = 3e-4
    finetune_sentences: int = 200  # training-text sentences whose teacher latents feed the fine-tune
    finetune_batch_size: int = 8
    segment_frames: int = 32  # 32 frames = 8192 samples at hop 256, HiFi-GAN's segment length

    def __post_init__(self):
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)) or not 0 < self.ratio < 1:
            raise ConfigError(f"prune.ratio={self.ratio!r}: must be a number strictly between 0 and 1")
        if self.importance not in IMPORTANCES:
            raise ConfigError(f"prune.importance={self.importance!r}: use one of {list(IMPORTANCES)}")
        if isinstance(self.parts, str):
            raise ConfigError(f"prune.parts={self.parts!r}: give a list of parts, e.g. ['decoder']")
        unknown = sorted(set(self.parts) - set(PRUNABLE_PARTS))
        if unknown or not self.parts:
            raise ConfigError(f"prune.parts={list(self.parts)}: unknown {unknown} or empty; "
                              f"prunable so far: {list(PRUNABLE_PARTS)}")
        if self.finetune_steps < 0:
            raise ConfigError(f"prune.finetune_steps={self.finetune_steps}: must be >= 0")
        if self.finetune_lr <= 0:
            raise ConfigError(f"prune.finetune_lr={self.finetune_lr}: must be > 0")
        if self.finetune_sentences < 1 or self.finetune_batch_size < 1 or self.segment_frames < 1:
            raise ConfigError(
                "prune.finetune_sentences, finetune_batch_size and segment_frames must be >= 1 (got "
                f"{self.finetune_sentences}, {self.finetune_batch_size}, {self.segment_frames})"
            )
        object.__setattr__(self, "parts", tuple(self.parts))

    def check_family(self, family: Family) -> None:
        """The part roles the listed pieces live in, against the family's (compress/stages.py calls it at start)."""
        check_part_roles("prune.parts (as part roles)", [PART_OF[name] for name in self.parts], family)


# ---------------------------------------------------------------- measuring a decoder


def decoder_ms_b1(decoder: nn.Module, latent_channels: int, threads: int) -> float:
    """Median milliseconds for one fixed latent of SPEED_FRAMES frames, batch 1, on CPU."""
    latent = torch.randn(1, latent_channels, SPEED_FRAMES, generator=torch.Generator().manual_seed(SEED))
    decoder = copy.deepcopy(decoder).cpu().eval()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        timings = []
        with torch.inference_mode():
            for run in range(SPEED_RUNS + 1):
                start = time.perf_counter()
                decoder(latent)
                if run:  # the first run warms caches and oneDNN primitives
                    timings.append((time.perf_counter() - start) * 1000)
    finally:
        torch.set_num_threads(previous_threads)
    return statistics.median(timings)


def distillation_loss(decoder: nn.Module, sampler: SegmentSampler) -> dict[str, float]:
    """MR-STFT and log-mel L1 against the teacher, averaged over the sampler's LOSS_CHECK_STEPS batches."""
    criterion = DistillationLoss(sampler.dataset.sample_rate_hz, sampler.dataset.hop_length).to(sampler.device)
    was_training = decoder.training
    decoder.eval()
    totals = {"mrstft": 0.0, "log_mel_l1": 0.0}
    with torch.no_grad():
        for step in LOSS_CHECK_STEPS:
            z, target = sampler.batch(step)
            parts = criterion(decoder(z)[:, 0], target)
            totals["mrstft"] += parts["stft"].item() / len(LOSS_CHECK_STEPS)
            totals["log_mel_l1"] += parts["mel"].item() / len(LOSS_CHECK_STEPS)
    decoder.train(was_training)
    return totals


# ---------------------------------------------------------------- pruning


def _second_order_taylor_gradients(module: nn.Module, outputs: list[Callable[[], torch.Tensor]]) -> None:
    """Put sqrt(diag(J^T J)) in every parameter's ``.grad``, J the Jacobian of the module's output.

    The distillation loss 0.5 * ||f(w') - f(w)||^2 is zero with a zero gradient at the teacher's
    own weights, so the first-order Taylor term that Torch-Pruning's Taylor importance reads
    (|w * grad|) would rank nothing. Its second-order term is 0.5 * w^2 * diag(J^T J) per
    weight; E[(J^T r)^2] = diag(J^T J) for r ~ N(0, I), one random probe per calibration batch
    (``outputs``: one callable per batch, running the module). With that in ``.grad``,
    |w * grad| is the square root of the second-order saliency.
    """
    generator = torch.Generator().manual_seed(SEED)
    squared = [torch.zeros_like(p) for p in module.parameters()]
    for run_batch in outputs:
        module.zero_grad(set_to_none=True)
        output = run_batch()
        probe = torch.randn(output.shape, generator=generator).to(output.device)
        (output * probe).sum().backward()
        for total, parameter in zip(squared, module.parameters()):
            if parameter.grad is not None:
                total += parameter.grad.detach() ** 2
    for total, parameter in zip(squared, module.parameters()):
        parameter.grad = (total / len(outputs)).sqrt()


def prune_decoder(decoder: nn.Module, latent_channels: int, ratio: float, importance: str,
                  calibration: SegmentSampler | None = None) -> nn.Module:
    """Remove ``ratio`` of the channels of every coupled group of ``decoder``, in place; returns it."""
    import torch_pruning as tp  # only the machine that prunes needs it

    if importance == "magnitude":
        scorer = tp.importance.GroupMagnitudeImportance(p=2)
    else:
        if calibration is None:
            raise ValueError("taylor importance needs calibration batches; pass calibration=SegmentSampler(...)")
        _second_order_taylor_gradients(
            decoder, [lambda step=step: decoder(calibration.batch(step)[0]) for step in range(CALIBRATION_BATCHES)])
        scorer = tp.importance.GroupTaylorImportance()
    example_latent = torch.randn(1, latent_channels, 16, device=next(decoder.parameters()).device)
    pruner = tp.pruner.BasePruner(
        decoder, example_latent, importance=scorer, pruning_ratio=ratio,
        ignored_layers=[decoder.conv_post],  # its one output channel is the waveform
        round_to=ROUND_CHANNELS_TO,
    )
    pruner.step()
    decoder.zero_grad(set_to_none=True)
    if decoder.conv_pre.in_channels != latent_channels or decoder.conv_post.out_channels != 1:
        raise RuntimeError("pruning touched the decoder's latent input or waveform output")
    return decoder


# ---------------------------------------------------------------- encoder feed-forward layers


def encoder_config(encoder: TextEncoder, hp: VitsHyperParams) -> dict:
    return json.loads(json.dumps({"kind": ENCODER_KIND, "hyperparams": asdict(hp),
                                  "channels": convolution_channels(encoder)}))


def build_text_encoder(config: dict) -> TextEncoder:
    """A randomly initialised text encoder with the shapes ``config`` describes (load weights after)."""
    if config.get("kind") != ENCODER_KIND:
        raise ValueError(f"encoder config kind={config.get('kind')!r}: expected {ENCODER_KIND!r}")
    return resize_convolutions(TextEncoder(hyperparams_from_dict(config["hyperparams"])), config["channels"])


def load_text_encoder(weights_path: Path, config_path: Path) -> TextEncoder:
    encoder = build_text_encoder(json.loads(Path(config_path).read_text(encoding="utf-8")))
    encoder.load_state_dict(load_file(str(weights_path)), strict=True)
    return encoder


def _phoneme_batch(sequences: list[Utterance], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    request = SynthesisRequest.from_utterances(sequences)
    return request.phoneme_ids.to(device), request.phoneme_lengths.to(device)


def _encoder_outputs(encoder: TextEncoder, phoneme_ids: torch.Tensor, phoneme_lengths: torch.Tensor) -> torch.Tensor:
    """Hidden states, prior mean and prior log-std stacked on channels: (B, C_hidden + 2 C_lat, T_text), masked."""
    hidden, prior_mean, prior_log_std, _ = encoder(phoneme_ids, phoneme_lengths)
    return torch.cat([hidden, prior_mean, prior_log_std], dim=1)


def encoder_distillation_mse(student: TextEncoder, teacher: TextEncoder, sequences: list[Utterance],
                             device: str) -> float:
    """Mean squared difference of the encoder outputs over ``sequences`` (padding is zero in both)."""
    phoneme_ids, phoneme_lengths = _phoneme_batch(sequences, device)
    with torch.no_grad():
        difference = _encoder_outputs(student, phoneme_ids, phoneme_lengths) - _encoder_outputs(
            teacher, phoneme_ids, phoneme_lengths)
    return difference.pow(2).mean().item()


def prune_encoder_ffn(encoder: TextEncoder, ratio: float, importance: str,
                      calibration: list[Utterance] | None = None) -> TextEncoder:
    """Remove ``ratio`` of the inner channels of every feed-forward layer of ``encoder``, in place.

    Only the inner width (conv_1's outputs, conv_2's inputs) changes: the hidden width that the
    attention, the layer norms and the duration predictor see stays.
    """
    import torch_pruning as tp  # only the machine that prunes needs it

    device = next(encoder.parameters()).device
    if importance == "magnitude":
        scorer = tp.importance.GroupMagnitudeImportance(p=2)
    else:
        if not calibration:
            raise ValueError("taylor importance needs calibration sequences")
        batches = [calibration[i : i + 8] for i in range(0, min(len(calibration), 8 * CALIBRATION_BATCHES), 8)]
        _second_order_taylor_gradients(
            encoder, [lambda batch=batch: _encoder_outputs(encoder, *_phoneme_batch(batch, device)) for batch in batches])
        scorer = tp.importance.GroupTaylorImportance()
    hidden, length = encoder.hidden_channels, 16
    example = (torch.randn(1, hidden, length, device=device), torch.ones(1, 1, length, device=device))
    for ffn in encoder.encoder.ffn_layers:
        tp.pruner.BasePruner(ffn, example, importance=scorer, pruning_ratio=ratio,
                             ignored_layers=[ffn.conv_2],  # its outputs are the hidden width
                             round_to=ROUND_CHANNELS_TO).step()
    encoder.zero_grad(set_to_none=True)
    return encoder


def finetune_encoder(student: TextEncoder, teacher: TextEncoder, sequences: list[Utterance], steps: int,
                     lr: float, batch_size: int, device: str) -> dict:
    """Match the teacher encoder's outputs (MSE) on training phonemes; no checkpoint: 300 steps take
    about 8 minutes on one CPU thread (batch 8), against hours for a decoder run."""
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.8, 0.99))
    student.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, FINAL_LR_FRACTION, steps // 10)
        rng = np.random.default_rng([SEED, step])
        batch = [sequences[i] for i in rng.choice(len(sequences), size=min(batch_size, len(sequences)), replace=False)]
        phoneme_ids, phoneme_lengths = _phoneme_batch(batch, device)
        with torch.no_grad():
            target = _encoder_outputs(teacher, phoneme_ids, phoneme_lengths)
        loss = (_encoder_outputs(student, phoneme_ids, phoneme_lengths) - target).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % max(steps // 10, 1) == 0:
            print(f"encoder step {step + 1}/{steps}  mse {loss.item():.5f}", flush=True)
    student.eval()
    return {"loss_first": losses[0], "loss_last": losses[-1]} if losses else {}


# ---------------------------------------------------------------- the stage


def _settings_json(settings: PruneSettings) -> dict:
    return json.loads(json.dumps(asdict(settings)))  # tuples as lists, as the report stores them


def _load_report(path: Path, settings: PruneSettings, work_dir: Path) -> dict:
    if not path.is_file():
        return {"settings": _settings_json(settings)}
    report = json.loads(path.read_text(encoding="utf-8"))
    if report.get("settings") != _settings_json(settings):
        raise ValueError(
            f"{work_dir} holds a pruning run with settings {report.get('settings')}, not {_settings_json(settings)}: "
            "use another work_dir or delete that one"
        )
    return report


def _write_report(path: Path, report: dict) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1), encoding="utf-8"))


def _pruned_decoder(teacher: Variant, settings: PruneSettings, ctx: StageContext, report: dict,
                    work_dir: Path) -> nn.Module:
    """Prune, fine-tune and save the decoder, resuming from whatever ``work_dir`` already holds."""
    hp = teacher.model.model.hp
    paths = {name: work_dir / name for name in DECODER_FILES}
    if paths["pruned_decoder.safetensors"].is_file() and paths["pruned_decoder.json"].is_file():
        return load_decoder(paths["pruned_decoder.safetensors"], paths["pruned_decoder.json"]).to(teacher.device)

    calibration = SegmentSampler(LatentDataset.from_voice(teacher.model, ctx.calibration_sequences),
                                 settings.finetune_batch_size, settings.segment_frames, SEED, teacher.device)
    if paths["pruned_decoder_init.safetensors"].is_file() and paths["pruned_decoder_init.json"].is_file():
        decoder = load_decoder(paths["pruned_decoder_init.safetensors"], paths["pruned_decoder_init.json"])
        decoder = decoder.to(teacher.device)
    else:
        start = time.perf_counter()
        decoder = prune_decoder(copy.deepcopy(teacher.model.parts()["decoder"]).float(), hp.latent_channels,
                                settings.ratio, settings.importance, calibration)
        report["decoder_prune_s"] = time.perf_counter() - start
        report |= {f"calib_{k}_after_prune": v for k, v in distillation_loss(decoder, calibration).items()}
        _write_report(work_dir / REPORT_FILE, report)  # first: an init decoder on disk always has its report
        save_decoder(decoder, hp, paths["pruned_decoder_init.safetensors"], paths["pruned_decoder_init.json"])
    if not paths["finetune_latents.safetensors"].is_file():
        sentences = generate_training_sentences(settings.finetune_sentences, SEED)
        LatentDataset.from_voice(teacher.model, sentences).save(paths["finetune_latents.safetensors"])
    # Trained from the saved (float16) latents, fresh or resumed alike, so a resume repeats the same batches.
    finetune = SegmentSampler(LatentDataset.load(paths["finetune_latents.safetensors"]), settings.finetune_batch_size,
                              settings.segment_frames, SEED, teacher.device)
    summary = train_decoder(
        decoder, finetune, settings.finetune_steps, settings.finetune_lr, paths["finetune_checkpoint.pt"],
        teacher.device, log_every=max(settings.finetune_steps // 10, 1), checkpoint_every=100,
        warmup_steps=settings.finetune_steps // 10, final_lr_fraction=FINAL_LR_FRACTION,
    )
    report |= {f"decoder_finetune_{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
    report |= {f"calib_{k}_after_finetune": v for k, v in distillation_loss(decoder, calibration).items()}
    save_decoder(decoder, hp, paths["pruned_decoder.safetensors"], paths["pruned_decoder.json"])
    _write_report(work_dir / REPORT_FILE, report)
    return decoder


def _pruned_encoder(teacher: Variant, settings: PruneSettings, ctx: StageContext, report: dict,
                    work_dir: Path) -> TextEncoder:
    """Prune the encoder's feed-forward layers, fine-tune, save; reuse a finished one from ``work_dir``."""
    hp = teacher.model.model.hp
    weights, config = work_dir / "pruned_encoder.safetensors", work_dir / "pruned_encoder.json"
    if weights.is_file() and config.is_file():
        return load_text_encoder(weights, config).to(teacher.device).eval()
    teacher_encoder = teacher.model.parts()["encoder"]
    start = time.perf_counter()
    encoder = prune_encoder_ffn(copy.deepcopy(teacher_encoder).float(), settings.ratio, settings.importance,
                                ctx.calibration_sequences)
    report["encoder_prune_s"] = time.perf_counter() - start
    check = ctx.calibration_sequences[: 8 * CALIBRATION_BATCHES]
    report["calib_encoder_mse_after_prune"] = encoder_distillation_mse(encoder, teacher_encoder, check, teacher.device)
    sequences = [s for text in generate_training_sentences(settings.finetune_sentences, SEED)
                 for s in teacher.model.text_to_utterances(text)]
    summary = finetune_encoder(encoder, teacher_encoder, sequences, settings.finetune_steps, settings.finetune_lr,
                               settings.finetune_batch_size, teacher.device)
    report |= {f"encoder_finetune_{k}": v for k, v in summary.items()}
    report["calib_encoder_mse_after_finetune"] = encoder_distillation_mse(encoder, teacher_encoder, check,
                                                                          teacher.device)
    save_module(encoder, encoder_config(encoder, hp), weights, config)
    _write_report(work_dir / REPORT_FILE, report)
    return encoder


def build(teacher: Variant, settings: PruneSettings, ctx: StageContext) -> Variant:
    """A new variant whose parts listed in ``settings.parts`` are pruned and fine-tuned; teacher untouched."""
    require_parts("pruning", teacher, ctx.family, [PART_OF[name] for name in settings.parts])
    hp = teacher.model.model.hp
    if hp.num_speakers > 1:
        raise ValueError(f"pruning a multi-speaker voice ({hp.num_speakers} speakers) is not supported yet")
    work_dir = Path(ctx.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    report = _load_report(work_dir / REPORT_FILE, settings, work_dir)

    voice = copy.deepcopy(teacher.model)
    stage_metrics: dict[str, float] = {"prune_ratio": settings.ratio}
    stage_tags = {"importance": settings.importance, "parts": ",".join(settings.parts)}
    artifacts = {"prune_report": work_dir / REPORT_FILE}
    if "decoder" in settings.parts:
        teacher_decoder = teacher.model.parts()["decoder"]
        decoder = _pruned_decoder(teacher, settings, ctx, report, work_dir).eval()
        voice.replace_part("decoder", decoder)
        stage_metrics |= {
            "decoder_params_before": parameter_count(teacher_decoder),
            "decoder_params_after": parameter_count(decoder),
            "decoder_size_mb_before": state_dict_size_mb(teacher_decoder),
            "decoder_size_mb_after": state_dict_size_mb(decoder),
            "decoder_ms_b1_before": decoder_ms_b1(teacher_decoder, hp.latent_channels, ctx.cpu_threads),
            "decoder_ms_b1_after": decoder_ms_b1(decoder, hp.latent_channels, ctx.cpu_threads),
            "decoder_speed_threads": ctx.cpu_threads,
        }
        widths = {"conv_pre": decoder.conv_pre.out_channels} | {f"ups.{i}": up.out_channels
                                                               for i, up in enumerate(decoder.ups)}
        stage_tags["decoder_widths"] = json.dumps(widths)
        artifacts |= {"decoder_weights": work_dir / "pruned_decoder.safetensors",
                      "decoder_config": work_dir / "pruned_decoder.json"}
    if "encoder_ffn" in settings.parts:
        teacher_encoder = teacher.model.parts()["encoder"]
        encoder = _pruned_encoder(teacher, settings, ctx, report, work_dir)
        voice.replace_part("encoder", encoder)
        stage_metrics |= {"encoder_params_before": parameter_count(teacher_encoder),
                          "encoder_params_after": parameter_count(encoder)}
        stage_tags["encoder_ffn_widths"] = json.dumps([ffn.conv_1.out_channels for ffn in encoder.encoder.ffn_layers])
        artifacts |= {"encoder_weights": work_dir / "pruned_encoder.safetensors",
                      "encoder_config": work_dir / "pruned_encoder.json"}
    stage_metrics |= {"params_m_before": teacher.params_m, "size_mb_before": teacher.size_mb}
    stage_metrics |= {k: float(v) for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return Variant(
        name="pruned",
        model=voice,
        engine="torch",
        device=teacher.device,
        params_m=parameter_count(voice) / 1e6,
        size_mb=state_dict_size_mb(voice),
        stage_metrics=stage_metrics,
        stage_tags=stage_tags,
        artifacts=artifacts,
    )
