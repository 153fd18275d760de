"""Stage: structured channel pruning of a family's decoder (optionally also its text encoder's
feed-forward layers), then a short recovery fine-tune.

Inputs -> artifact + metrics, like every stage:

    from compress.prune import PruneSettings, build

    settings = PruneSettings(ratio=0.5, importance="taylor", parts=["decoder"], finetune_steps=300,
                             finetune_lr=3e-4, finetune_sentences=200)
    pruned = build(teacher, settings, ctx)   # teacher: the fp32 Variant; ctx: compress.variants.StageContext
    pruned.stage_metrics["decoder_ms_b1_after"], pruned.artifacts["decoder_weights"]

What each piece needs of the family comes from its registry entry (``Family.prune``,
models/family.py): how its decoder is pruned with Torch-Pruning (coupled channel groups, one ratio
for all; the latent input and the waveform output stay), rebuilt with its shapes, and where the
teacher's latents come from; likewise for the encoder's feed-forward layers. Only the pruned part
changes: with ``decoder`` alone, durations and latents are the teacher's, sample for sample.

Importance: "magnitude" ranks a channel group by the L2 norm of its weights; "taylor" by the
second-order Taylor saliency of the distillation loss on calibration batches (its first-order
term is zero at the teacher, see ``models.training.pruning.second_order_taylor_gradients``).

The pruned decoder is then fine-tuned toward the teacher decoder's audio on the teacher's own
latents (models/training/decoder_training.py) from ``texts.training_text``, never eval or Harvard.
Its weights (safetensors) and shapes (JSON, rebuilt by the family's ``build``) go to
``ctx.work_dir``; a finished or half-finished run found there is resumed, not redone.
"""
from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from compress.variants import StageContext, Variant, check_part_roles, require_parts
from core.atomic_io import atomic_write
from core.config import ConfigError
from evaluate.memory import parameter_count, state_dict_size_mb
from models.family import Family, PruneHooks
from models.training.convolutions import load_module, save_module
from models.training.decoder_training import LatentDataset, SegmentSampler, train_decoder
from models.training.losses import DistillationLoss
from models.training.pruning import CALIBRATION_BATCHES, FINETUNE_FINAL_LR_FRACTION, PRUNING_SEED
from texts.training_text import generate_training_sentences

IMPORTANCES = ("magnitude", "taylor")
# The pieces this stage knows how to prune; a family's PruneHooks says which it supports and in
# which part each lives. encoder_ffn: the inner width of the text encoder's feed-forward layers.
PRUNABLE_PARTS = ("decoder", "encoder_ffn")
REPORT_FILE = "prune_report.json"
DECODER_FILES = ("pruned_decoder_init.safetensors", "pruned_decoder_init.json", "finetune_checkpoint.pt",
                 "finetune_latents.safetensors", "pruned_decoder.safetensors", "pruned_decoder.json")
LOSS_CHECK_STEPS = (1000, 1001, 1002, 1003)  # other calibration batches: the before/after loss checks
SPEED_FRAMES = 100  # latent frames of the speed check: 100 * 256 / 22050 = 1.16 s of audio at hop 256
SPEED_RUNS = 10  # timed runs after one warm-up; the median is reported (the machine may be shared)
SEED = PRUNING_SEED


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
        """The family prunes every listed piece, in parts it has (compress/stages.py calls it at start)."""
        hooks = prune_hooks(family, self.parts)
        check_part_roles("prune.parts (as part roles)", [getattr(hooks, name).part_role for name in self.parts], family)


def prune_hooks(family: Family, parts: tuple[str, ...]) -> PruneHooks:
    """``family.prune``, with every piece in ``parts``; a ConfigError naming the family otherwise."""
    if family.prune is None:
        raise ConfigError(f"variant 'pruned': family {family.name!r} registers no pruning (Family.prune is None); "
                          "drop 'pruned' from variants")
    missing = [name for name in parts if getattr(family.prune, name) is None]
    if missing:
        supported = [name for name in PRUNABLE_PARTS if getattr(family.prune, name) is not None]
        raise ConfigError(f"prune.parts={list(parts)}: family {family.name!r} cannot prune {missing}; "
                          f"it prunes {supported}")
    return family.prune


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
    hooks = ctx.family.prune.decoder
    paths = {name: work_dir / name for name in DECODER_FILES}
    if paths["pruned_decoder.safetensors"].is_file() and paths["pruned_decoder.json"].is_file():
        return load_module(paths["pruned_decoder.safetensors"], paths["pruned_decoder.json"],
                           hooks.build).to(teacher.device)

    calibration = SegmentSampler(hooks.teacher_latents(teacher.model, ctx.calibration_sequences),
                                 settings.finetune_batch_size, settings.segment_frames, SEED, teacher.device)
    if paths["pruned_decoder_init.safetensors"].is_file() and paths["pruned_decoder_init.json"].is_file():
        decoder = load_module(paths["pruned_decoder_init.safetensors"], paths["pruned_decoder_init.json"], hooks.build)
        decoder = decoder.to(teacher.device)
    else:
        start = time.perf_counter()
        decoder = hooks.prune(copy.deepcopy(teacher.model.parts()[hooks.part_role]).float(),
                              hooks.latent_channels(teacher.model), settings.ratio, settings.importance, calibration)
        report["decoder_prune_s"] = time.perf_counter() - start
        report |= {f"calib_{k}_after_prune": v for k, v in distillation_loss(decoder, calibration).items()}
        _write_report(work_dir / REPORT_FILE, report)  # first: an init decoder on disk always has its report
        save_module(decoder, hooks.config(decoder, teacher.model), paths["pruned_decoder_init.safetensors"],
                    paths["pruned_decoder_init.json"])
    if not paths["finetune_latents.safetensors"].is_file():
        sentences = generate_training_sentences(settings.finetune_sentences, SEED)
        hooks.teacher_latents(teacher.model, sentences).save(paths["finetune_latents.safetensors"])
    # Trained from the saved (float16) latents, fresh or resumed alike, so a resume repeats the same batches.
    finetune = SegmentSampler(LatentDataset.load(paths["finetune_latents.safetensors"], hooks.build),
                              settings.finetune_batch_size, settings.segment_frames, SEED, teacher.device)
    summary = train_decoder(
        decoder, finetune, settings.finetune_steps, settings.finetune_lr, paths["finetune_checkpoint.pt"],
        teacher.device, log_every=max(settings.finetune_steps // 10, 1), checkpoint_every=100,
        warmup_steps=settings.finetune_steps // 10, final_lr_fraction=FINETUNE_FINAL_LR_FRACTION,
    )
    report |= {f"decoder_finetune_{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
    report |= {f"calib_{k}_after_finetune": v for k, v in distillation_loss(decoder, calibration).items()}
    save_module(decoder, hooks.config(decoder, teacher.model), paths["pruned_decoder.safetensors"],
                paths["pruned_decoder.json"])
    _write_report(work_dir / REPORT_FILE, report)
    return decoder


def _pruned_encoder(teacher: Variant, settings: PruneSettings, ctx: StageContext, report: dict,
                    work_dir: Path) -> nn.Module:
    """Prune the encoder's feed-forward layers, fine-tune, save; reuse a finished one from ``work_dir``."""
    hooks = ctx.family.prune.encoder_ffn
    weights, config = work_dir / "pruned_encoder.safetensors", work_dir / "pruned_encoder.json"
    if weights.is_file() and config.is_file():
        return load_module(weights, config, hooks.build).to(teacher.device).eval()
    teacher_encoder = teacher.model.parts()[hooks.part_role]
    start = time.perf_counter()
    encoder = hooks.prune(copy.deepcopy(teacher_encoder).float(), settings.ratio, settings.importance,
                          ctx.calibration_sequences)
    report["encoder_prune_s"] = time.perf_counter() - start
    check = ctx.calibration_sequences[: 8 * CALIBRATION_BATCHES]
    report["calib_encoder_mse_after_prune"] = hooks.distance(encoder, teacher_encoder, check, teacher.device)
    sequences = [s for text in generate_training_sentences(settings.finetune_sentences, SEED)
                 for s in teacher.model.text_to_utterances(text)]
    summary = hooks.finetune(encoder, teacher_encoder, sequences, settings.finetune_steps, settings.finetune_lr,
                             settings.finetune_batch_size, teacher.device)
    report |= {f"encoder_finetune_{k}": v for k, v in summary.items()}
    report["calib_encoder_mse_after_finetune"] = hooks.distance(encoder, teacher_encoder, check, teacher.device)
    save_module(encoder, hooks.config(encoder, teacher.model), weights, config)
    _write_report(work_dir / REPORT_FILE, report)
    return encoder


def build(teacher: Variant, settings: PruneSettings, ctx: StageContext, variant_name: str = "pruned") -> Variant:
    """A new variant whose parts listed in ``settings.parts`` are pruned and fine-tuned; ``teacher`` (the
    source variant: the teacher, or a student that kept the teacher's parts) is untouched."""
    hooks = prune_hooks(ctx.family, settings.parts)
    require_parts("pruning", teacher, ctx.family, [getattr(hooks, name).part_role for name in settings.parts])
    hooks.check_model(teacher.model)
    work_dir = Path(ctx.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    report = _load_report(work_dir / REPORT_FILE, settings, work_dir)

    voice = copy.deepcopy(teacher.model)
    stage_metrics: dict[str, float] = {"prune_ratio": settings.ratio}
    stage_tags = {"importance": settings.importance, "parts": ",".join(settings.parts)}
    artifacts = {"prune_report": work_dir / REPORT_FILE}
    if "decoder" in settings.parts:
        role = hooks.decoder.part_role
        latent_channels = hooks.decoder.latent_channels(teacher.model)
        teacher_decoder = teacher.model.parts()[role]
        decoder = _pruned_decoder(teacher, settings, ctx, report, work_dir).eval()
        voice.replace_part(role, decoder)
        stage_metrics |= {
            "decoder_params_before": parameter_count(teacher_decoder),
            "decoder_params_after": parameter_count(decoder),
            "decoder_size_mb_before": state_dict_size_mb(teacher_decoder),
            "decoder_size_mb_after": state_dict_size_mb(decoder),
            "decoder_ms_b1_before": decoder_ms_b1(teacher_decoder, latent_channels, ctx.cpu_threads),
            "decoder_ms_b1_after": decoder_ms_b1(decoder, latent_channels, ctx.cpu_threads),
            "decoder_speed_threads": ctx.cpu_threads,
        }
        stage_tags["decoder_widths"] = json.dumps(hooks.decoder.widths(decoder))
        artifacts |= {"decoder_weights": work_dir / "pruned_decoder.safetensors",
                      "decoder_config": work_dir / "pruned_decoder.json"}
    if "encoder_ffn" in settings.parts:
        role = hooks.encoder_ffn.part_role
        teacher_encoder = teacher.model.parts()[role]
        encoder = _pruned_encoder(teacher, settings, ctx, report, work_dir)
        voice.replace_part(role, encoder)
        stage_metrics |= {"encoder_params_before": parameter_count(teacher_encoder),
                          "encoder_params_after": parameter_count(encoder)}
        stage_tags["encoder_ffn_widths"] = json.dumps(hooks.encoder_ffn.widths(encoder))
        artifacts |= {"encoder_weights": work_dir / "pruned_encoder.safetensors",
                      "encoder_config": work_dir / "pruned_encoder.json"}
    stage_metrics |= {"params_m_before": teacher.params_m, "size_mb_before": teacher.size_mb}
    stage_metrics |= {k: float(v) for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return Variant(
        name=variant_name,
        model=voice,
        engine="torch",
        device=teacher.device,
        params_m=parameter_count(voice) / 1e6,
        size_mb=state_dict_size_mb(voice),
        stage_metrics=stage_metrics,
        stage_tags=stage_tags,
        artifacts=artifacts,
    )
