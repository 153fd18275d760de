"""Kokoro's Lite decoder (models/kokoro/generator_student.py) on the tiny architecture: slicing the
teacher's generator, the packed training form, the dataset file, training and loading."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from core.paths import REPO_ROOT
from models.kokoro.config import KokoroConfig
from models.kokoro.decoder import Generator
from models.kokoro.generator_student import (
    PackedGenerator,
    build_packed_generator,
    channel_importance,
    check_student_config,
    export_student,
    generator_inputs,
    lite_decoder,
    load_student_generator,
    main,
    slice_generator,
    student_from_checkpoint,
    teacher_dataset,
    train_student,
)
from models.kokoro.release import MANIFEST_PATH
from models.kokoro.tiny import tiny_voice
from models.training.decoder_training import LatentDataset
from models.training.discriminators import AdversarialSettings
from scripts.kokoro_lite_length_gap import decode_in_segments
from scripts.kokoro_lite_length_gap import main as length_gap_main

SEGMENT = 100  # columns: 1,200 samples at the tiny generator's 12 a column, past the loss's 2,048-point STFT pad


@pytest.fixture(scope="module")
def voice():
    return tiny_voice(0)


def _generator_call(voice, generator: Generator, frames: int = 12, seed: int = 1) -> torch.Tensor:
    """One random generator input through ``generator`` (noise off)."""
    config = voice.model.config
    torch.manual_seed(seed)
    x = torch.randn(2, config.istftnet.upsample_initial_channel, frames)
    style = torch.randn(2, config.style_dim)
    f0 = 120 + 80 * torch.rand(2, frames)
    with torch.no_grad():
        return generator(x, style, f0)


def test_slicing_to_the_teacher_width_computes_what_the_teacher_does(voice):
    teacher = voice.model.decoder.generator
    same = slice_generator(teacher, teacher.stage_channels)
    torch.testing.assert_close(_generator_call(voice, same), _generator_call(voice, teacher), rtol=0, atol=1e-6)


def test_a_narrower_slice_keeps_the_most_important_channels_and_the_output_shape(voice):
    teacher = voice.model.decoder.generator
    narrow = slice_generator(teacher, (4, 2))
    assert narrow.stage_channels == (4, 2)
    assert narrow.ups[0].weight.shape[1] == 4 and narrow.ups[1].weight.shape[:2] == (4, 2)
    assert narrow.conv_post.weight.shape[1] == 2
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in teacher.parameters()) / 2
    expected = _generator_call(voice, teacher)
    got = _generator_call(voice, narrow)
    assert got.shape == expected.shape and torch.isfinite(got).all()
    # A plain Generator of those widths loads the sliced weights (what a student file holds).
    rebuilt = Generator(voice.model.config, stage_channels=(4, 2))
    rebuilt.load_state_dict(narrow.state_dict(), strict=True)
    torch.testing.assert_close(_generator_call(voice, rebuilt), got, rtol=0, atol=0)


def _masked_teacher(teacher: Generator, keeps: list[torch.Tensor]) -> Generator:
    """A copy of the teacher whose dropped channels carry nothing: every weight writing them and
    every weight reading them zeroed. The slice must compute exactly what it computes."""
    import copy

    masked = copy.deepcopy(teacher)
    with torch.no_grad():
        for stage, keep in enumerate(keeps):
            drop = torch.ones(teacher.stage_channels[stage], dtype=torch.bool)
            drop[keep] = False
            up = masked.ups[stage]
            up.weight[:, drop] = 0  # ConvTranspose1d (in, out, k): the stream is its output
            up.bias[drop] = 0
            masked.noise_convs[stage].weight[drop] = 0
            masked.noise_convs[stage].bias[drop] = 0
            reader = masked.ups[stage + 1] if stage + 1 < teacher.num_upsamples else masked.conv_post
            if stage + 1 < teacher.num_upsamples:
                reader.weight[drop] = 0
            else:
                reader.weight[:, drop] = 0
            kernels = teacher.num_kernels
            for block in list(masked.resblocks[stage * kernels:(stage + 1) * kernels]) + [masked.noise_res[stage]]:
                for conv in list(block.convs1) + list(block.convs2):
                    conv.weight[drop] = 0
                    conv.weight[:, drop] = 0
                    conv.bias[drop] = 0
    return masked


def test_a_narrower_slice_computes_what_the_teacher_does_without_the_dropped_channels(voice):
    teacher = voice.model.decoder.generator
    widths = (5, 3)
    keeps = [channel_importance(teacher, stage).topk(width).indices for stage, width in enumerate(widths)]
    narrow = slice_generator(teacher, widths)
    torch.testing.assert_close(_generator_call(voice, narrow), _generator_call(voice, _masked_teacher(teacher, keeps)),
                               rtol=0, atol=1e-5)
    # Another choice of channels computes something else: the slice follows the importance order.
    wrong = [torch.arange(width) if not torch.equal(keep.sort().values, torch.arange(width))
             else torch.arange(1, width + 1) for keep, width in zip(keeps, widths)]
    assert (_generator_call(voice, narrow) - _generator_call(voice, _masked_teacher(teacher, wrong))).abs().max() > 1e-3


def test_bad_student_configs_and_widths_are_refused(voice):
    teacher = voice.model.decoder.generator
    with pytest.raises(ValueError, match="unknown keys"):
        check_student_config({"stage_channel": [4, 2]})
    with pytest.raises(ValueError, match="positive integers"):
        check_student_config({"stage_channels": [4, 0]})
    with pytest.raises(ValueError, match="wider than"):
        slice_generator(teacher, (64, 2))
    with pytest.raises(ValueError, match="2 stages"):
        slice_generator(teacher, (4,))


def test_the_packed_form_gives_the_generator_its_own_output(voice):
    generator = voice.model.decoder.generator
    ids = voice.text_to_utterances("A short test sentence.")[0].phoneme_ids
    packed = generator_inputs(voice.model, [ids], voice.style_row, speeds=(1.0,))[0]  # (U + S + 1, 2F)
    config = voice.model.config
    assert packed.shape[0] == config.istftnet.upsample_initial_channel + config.style_dim + 1
    with torch.no_grad():
        audio = PackedGenerator(generator, config.istftnet.upsample_initial_channel)(packed.unsqueeze(0))
        request_audio = voice.model.forward_with_tokens(torch.tensor([list(ids)]), voice.style_row(len(ids) - 2)).audio
    assert audio.shape[-1] == packed.shape[-1] * generator.upsample_scale
    torch.testing.assert_close(audio.reshape(-1), request_audio.reshape(-1), rtol=0, atol=1e-5)


def test_dataset_round_trip_training_and_loading(voice, tmp_path):
    texts = ("The first training sentence is here, and it runs on for a while before it stops.",
             "And a second, longer one follows it now, with several more words to make it long enough.")
    ids = [u.phoneme_ids for text in texts for u in voice.text_to_utterances(text)]
    written = teacher_dataset(voice, ids, speeds=(0.9, 1.1))
    paths = written.save_shards(tmp_path, "generator_inputs", max_mib=0.4)  # the tiny teacher 0.1 MiB, an utterance up to 0.2
    assert len(paths) > 1
    loaded = LatentDataset.load(paths, build_packed_generator)
    assert len(loaded.latents) == 4 and loaded.hop_length == voice.model.decoder.generator.upsample_scale
    for a, b in zip(written.latents, loaded.latents):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)  # stored as float16
    weights = tmp_path / "lite_generator.safetensors"
    summary = train_student(loaded, (4, 2), tmp_path / "ckpt.pt", weights, {"note": "test"}, steps=6,
                            lr=1e-3, batch_size=2, segment_frames=SEGMENT, log_every=0)
    assert summary["done"] and summary["step"] == 6 and weights.is_file()
    generator, config = load_student_generator(voice.model.config, weights)
    assert config == {"kind": "kokoro_generator", "stage_channels": [4, 2]} and generator.stage_channels == (4, 2)
    decoder = lite_decoder(voice.model.decoder, generator)
    assert decoder.generator is generator and voice.model.decoder.generator is not generator
    # Resuming past the end trains no more steps and keeps the file as it was.
    written_bytes = weights.read_bytes()
    again = train_student(loaded, (4, 2), tmp_path / "ckpt.pt", weights, {}, steps=6, batch_size=2,
                          segment_frames=SEGMENT, log_every=0)
    assert again["steps_this_call"] == 0 and weights.read_bytes() == written_bytes
    # A longer schedule in bounded calls: with export_each_call each call leaves the student it reached.
    partial = train_student(loaded, (4, 2), tmp_path / "ckpt.pt", weights, {}, steps=10, batch_size=2,
                            segment_frames=SEGMENT, log_every=0, max_steps_this_call=2, export_each_call=True)
    assert partial["step"] == 8 and not partial["done"]
    with safe_open(str(weights), framework="pt") as handle:
        assert json.loads(handle.metadata()["card"])["step_reached"] == 8
    # A new schedule can start from a trained student instead of the teacher's slice (steps=0: as loaded).
    restarted = tmp_path / "restarted.safetensors"
    train_student(loaded, (4, 2), tmp_path / "new_ckpt.pt", restarted, {}, steps=0, batch_size=2,
                  segment_frames=SEGMENT, log_every=0, initial_weights=weights)
    for name, tensor in load_file(str(weights)).items():
        assert torch.equal(load_file(str(restarted))[name], tensor), name
    # A float16 file (for a GPU call's returned-file limit) loads back into a float32 generator.
    half = tmp_path / "half.safetensors"
    train_student(loaded, (4, 2), tmp_path / "new_ckpt.pt", half, {}, steps=0, batch_size=2,
                  segment_frames=SEGMENT, log_every=0, initial_weights=weights, export_dtype=torch.float16)
    assert {t.dtype for t in load_file(str(half)).values()} == {torch.float16}
    widened, _ = load_student_generator(voice.model.config, half)
    for name, tensor in widened.state_dict().items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, load_file(str(weights))[name].half().float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="stage channels"):
        train_student(loaded, (2, 2), tmp_path / "other_ckpt.pt", tmp_path / "other.safetensors", {}, steps=0,
                      batch_size=2, segment_frames=SEGMENT, log_every=0, initial_weights=weights)


def test_adversarial_fine_tune_resumes_bit_for_bit_and_keeps_its_discriminator(voice, tmp_path):
    """A spectral student goes on adversarially (the discriminator's state joins the checkpoint),
    and two bounded calls end where one uninterrupted call ends."""
    ids = [u.phoneme_ids for u in voice.text_to_utterances("A sentence long enough for a few training segments.")]
    dataset = teacher_dataset(voice, ids, speeds=(1.0,))
    spectral = tmp_path / "spectral.safetensors"
    train_student(dataset, (4, 2), tmp_path / "spectral_ckpt.pt", spectral, {}, steps=2, batch_size=2,
                  segment_frames=SEGMENT, log_every=0)
    gan = AdversarialSettings(discriminator_warmup_steps=1)  # step 0: the discriminator alone; 1, 2: both

    def fine_tune(name: str, **limits) -> dict:
        torch.manual_seed(1)  # the discriminator's initial weights
        return train_student(dataset, (4, 2), tmp_path / f"{name}.pt", tmp_path / f"{name}.safetensors", {},
                             steps=3, lr=1e-3, batch_size=2, segment_frames=SEGMENT, log_every=0,
                             initial_weights=spectral, adversarial=gan, **limits)

    whole_summary = fine_tune("whole")
    assert "adv_tail_mean" in whole_summary and "fm_tail_mean" in whole_summary and "disc_tail_mean" in whole_summary
    assert fine_tune("chunks", max_steps_this_call=2)["step"] == 2
    state = torch.load(tmp_path / "chunks.pt", weights_only=True)
    assert {"discriminator", "d_optimizer"} <= set(state) and state["step"] == 2
    assert fine_tune("chunks")["start_step"] == 2
    # The adversarial terms moved the student: the same steps without them end elsewhere.
    spectral_only = train_student(dataset, (4, 2), tmp_path / "plain.pt", tmp_path / "plain.safetensors", {},
                                  steps=3, lr=1e-3, batch_size=2, segment_frames=SEGMENT, log_every=0,
                                  initial_weights=spectral)
    assert "adv_tail_mean" not in spectral_only
    plain, adversarial = (load_file(str(tmp_path / f"{name}.safetensors")) for name in ("plain", "whole"))
    assert any(not torch.equal(plain[name], tensor) for name, tensor in adversarial.items())
    # A checkpoint with a discriminator is not silently resumed without one.
    with pytest.raises(ValueError, match="holds a discriminator"):
        train_student(dataset, (4, 2), tmp_path / "chunks.pt", tmp_path / "chunks.safetensors", {}, steps=4,
                      batch_size=2, segment_frames=SEGMENT, log_every=0)
    # A spectral checkpoint goes on adversarially, its discriminator's warm-up counted from there.
    onward = train_student(dataset, (4, 2), tmp_path / "plain.pt", tmp_path / "plain.safetensors", {}, steps=4,
                           lr=1e-3, batch_size=2, segment_frames=SEGMENT, log_every=0, adversarial=gan)
    assert onward["start_step"] == 3 and "adv_tail_mean" not in onward  # step 3 is its warm-up step
    assert torch.load(tmp_path / "plain.pt", weights_only=True)["adversarial_from_step"] == 3
    from_checkpoint, step = student_from_checkpoint(voice.model.decoder.generator, tmp_path / "chunks.pt")
    assert step == 3 and from_checkpoint.stage_channels == (4, 2)  # widths read from the weights
    for name, tensor in from_checkpoint.state_dict().items():
        assert torch.equal(tensor, load_file(str(tmp_path / "chunks.safetensors"))[name]), name
    torch.save({"model": {"other.weight": torch.zeros(1)}, "step": 0}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a Lite trainer checkpoint"):
        student_from_checkpoint(voice.model.decoder.generator, tmp_path / "other.pt")
    whole, chunks = load_file(str(tmp_path / "whole.safetensors")), load_file(str(tmp_path / "chunks.safetensors"))
    for name, tensor in whole.items():
        assert torch.equal(chunks[name], tensor), name


@pytest.mark.parametrize("name,widths", [("lite_kokoro_jf_alpha.safetensors", (144, 72)),
                                         ("lite_kokoro_jf_alpha_128_64.safetensors", (128, 64))])
def test_the_committed_students_load_at_their_widths_with_their_training_record(name, widths):
    """The committed Lite generators (the CPU target's and the GPU width's, models/checkpoints/README.md)
    build on the official config at the widths their metadata names, from float16 weights, and carry
    the card of the long-segment fine-tune that made them."""
    path = REPO_ROOT / "models" / "checkpoints" / name
    official = KokoroConfig.from_dict(json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))["config"])
    generator, config = load_student_generator(official, path)
    assert tuple(config["stage_channels"]) == widths
    assert [generator.ups[i].weight.shape[1] for i in range(generator.num_upsamples)] == list(widths)
    assert {tensor.dtype for tensor in load_file(str(path)).values()} == {torch.float16}
    with safe_open(str(path), "pt") as handle:
        card = json.loads(handle.metadata()["card"])
    assert card["segment_frames"] == 192 and card["step_reached"] == 500


def test_a_file_without_a_student_config_is_refused(voice, tmp_path):
    path = tmp_path / "plain.safetensors"
    export_student(voice.model.decoder.generator, path, {})
    generator, config = load_student_generator(voice.model.config, path)  # the teacher's own widths load
    assert tuple(config["stage_channels"]) == voice.model.decoder.generator.stage_channels
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="student_config"):
        load_student_generator(voice.model.config, tmp_path / "other.safetensors")


def test_the_config_a_dataset_stores_reads_back_as_the_same_config(voice):
    from models.kokoro.config import KokoroConfig
    from models.kokoro.release import official_config

    for config in (voice.model.config, official_config()):
        assert KokoroConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_the_distil_stage_builds_the_lite_decoder_and_reloads_it(voice, tmp_path):
    """compress/distil.py on the tiny voice, through Kokoro's hooks (their training set swapped for the
    English calibration set: the tiny voice's frontend is English): the student replaces the
    decoder's generator only, keeps the durations, trains, and the saved student is reloaded."""
    import dataclasses

    from compress.distil import DistilSettings
    from compress.distil import build as build_lite
    from compress.variants import StageContext, Variant
    from evaluate.memory import parameter_count, state_dict_size_mb
    from models.interface import SynthesisRequest
    from models.kokoro.family import FAMILY

    family = dataclasses.replace(FAMILY, distil=dataclasses.replace(FAMILY.distil, training_set="calibration"))
    teacher = Variant("teacher", voice, "torch", "cpu", parameter_count(voice) / 1e6, state_dict_size_mb(voice))
    context = StageContext(calibration_sequences=[], work_dir=tmp_path, cpu_threads=1, cache_dir=tmp_path,
                           family=family, voice="random")
    settings = DistilSettings(checkpoint=None, student={"stage_channels": [4, 2]}, train_steps=2, lr=1e-3,
                              warmup_steps=1, batch_size=2, segment_frames=SEGMENT, training_sentences=6)
    settings.check_family(family)
    lite = build_lite(teacher, settings, context)
    assert lite.stage_metrics["distil_steps"] == 2
    assert lite.stage_metrics["decoder_params_after"] < lite.stage_metrics["decoder_params_before"]
    assert lite.model.model.decoder.generator.stage_channels == (4, 2)
    assert lite.model.model.decoder.encode is not voice.model.decoder.encode  # a copy: the teacher is untouched
    assert voice.model.decoder.generator.stage_channels != (4, 2)
    request = SynthesisRequest.from_utterances(voice.text_to_utterances("A sentence to speak."))
    before, after = voice.synthesize(request), lite.model.synthesize(request)
    assert torch.equal(after.durations, before.durations) and after.audio.shape == before.audio.shape
    reloaded = build_lite(teacher, settings, context)  # the saved student, not retrained
    assert "distil_steps" not in reloaded.stage_metrics
    assert torch.equal(reloaded.model.synthesize(request).audio, after.audio)


def test_distillation_never_trains_on_a_held_out_set(voice):
    import dataclasses

    from compress.distil import _training_phoneme_ids
    from core.config import ConfigError
    from models.kokoro.family import FAMILY

    assert FAMILY.distil.training_set == "calibration_ja" and FAMILY.distil.held_out_set == "eval_ja"
    from texts import NAMED_SETS

    for held_out in ("eval", "eval_ja", "harvard", str(NAMED_SETS["eval_ja"])):
        with pytest.raises(ConfigError, match="held out"):
            _training_phoneme_ids(dataclasses.replace(FAMILY.distil, training_set=held_out), voice, 4, 0)
    with pytest.raises(ConfigError, match="held out"):  # the family's own held-out set, whatever its name
        _training_phoneme_ids(dataclasses.replace(FAMILY.distil, training_set="calibration", held_out_set="calibration"),
                              voice, 4, 0)
    with pytest.raises(ValueError, match="unknown keys"):
        from compress.distil import DistilSettings
        DistilSettings(checkpoint=None, student={"width": 3}, train_steps=1).check_family(FAMILY)


def test_the_cli_bounds_a_call_by_time_and_returns_the_student_in_float16(voice, tmp_path, capsys):
    ids = [u.phoneme_ids for u in voice.text_to_utterances("A sentence for the command line, long enough to train on.")]
    shards = teacher_dataset(voice, ids).save_shards(tmp_path / "bundle", "generator_inputs")
    export = tmp_path / "student.safetensors"
    arguments = ["train", "--dataset", *map(str, shards), "--stage-channels", "4", "2", "--steps", "5",
                 "--batch-size", "2", "--segment-frames", str(SEGMENT), "--max-seconds-this-call", "1e-9",
                 "--export-each-call", "--export-dtype", "float16", "--checkpoint", str(tmp_path / "ckpt.pt"),
                 "--waveform-weight", "2.0", "--export", str(export)]
    main(arguments)  # a bound no step fits in: one step, a checkpoint and the student reached
    assert "  waveform " in capsys.readouterr().out  # the phase-aware term is in the loss it logs
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 1
    assert {t.dtype for t in load_file(str(export)).values()} == {torch.float16}
    with safe_open(str(export), framework="pt") as handle:
        card = json.loads(handle.metadata()["card"])
    assert card["step_reached"] == 1 and card["export_dtype"] == "float16" and card["init_weights"] is None
    assert card["waveform_weight"] == 2.0
    # Bad loss settings are refused before the dataset is read (here: a dataset that is not there).
    after_dataset = arguments[arguments.index("--stage-channels"):]
    no_dataset = ["train", "--dataset", str(tmp_path / "missing.safetensors"), *after_dataset]
    with pytest.raises(ValueError, match="loss weights"):
        main(no_dataset + ["--waveform-weight", "-1"])
    with pytest.raises(ValueError, match="discriminator_warmup_steps"):
        main(no_dataset + ["--discriminator-warmup-steps", "-1"])
    generator, config = load_student_generator(voice.model.config, export)
    assert config["stage_channels"] == [4, 2] and generator.stage_channels == (4, 2)


def test_the_gpu_bundle_is_shards_and_a_record_the_training_command_reads(voice, tmp_path):
    from models.kokoro.family import FAMILY

    ids = [u.phoneme_ids for u in voice.text_to_utterances("A sentence for the bundle, long enough to train on.")]
    FAMILY.distil.write_bundle(voice, ids, tmp_path, {"voice": "random"})
    record = json.loads((tmp_path / "bundle.json").read_text())
    assert record == {"family": "kokoro", "sentences": 1, "sample_rate_hz": voice.sample_rate_hz, "voice": "random"}
    shards = sorted(tmp_path.glob("generator_inputs-*.safetensors"))
    assert shards and "generator_inputs-*.safetensors" in FAMILY.distil.train_command
    assert len(LatentDataset.load(shards, build_packed_generator).latents) == 3  # three speeds


def test_the_length_gap_decodes_segments_alone_and_tells_a_student_from_the_teacher(voice, tmp_path):
    texts = ("The first training sentence is here, and it runs on for a while before it stops.",
             "And a second, longer one follows it now, with several more words to make it long enough.")
    ids = [u.phoneme_ids for text in texts for u in voice.text_to_utterances(text)]
    dataset = teacher_dataset(voice, ids, speeds=(0.9, 1.0, 1.1))
    teacher = dataset.teacher_decoder
    packed = dataset.latents[1]  # (C, T)
    with torch.no_grad():
        whole = teacher(packed[None])[0, 0]
        # Each segment of 40 columns decoded alone, in order; the tail past the last whole segment dropped.
        by_hand = torch.cat([teacher(packed[None, :, start:start + 40])[0, 0]
                             for start in range(0, packed.shape[-1] - 39, 40)])
    torch.testing.assert_close(torch.from_numpy(decode_in_segments(teacher, packed, None)), whole)
    torch.testing.assert_close(torch.from_numpy(decode_in_segments(teacher, packed, 40)), by_hand)
    # The teacher's own width as a "student" shows no level gap at any length; an untrained narrow
    # slice does, so the report measures the student it is given, not the teacher twice.
    paths = dataset.save_shards(tmp_path, "generator_inputs", max_mib=0.4)
    teacher_generator = voice.model.decoder.generator
    own, narrow = tmp_path / "own_width.safetensors", tmp_path / "narrow.safetensors"
    export_student(slice_generator(teacher_generator, teacher_generator.stage_channels), own, {"segment_frames": 40})
    export_student(slice_generator(teacher_generator, (4, 2)), narrow, {"segment_frames": 40})
    report = tmp_path / "gap.json"
    length_gap_main([str(own), str(narrow), "--dataset", *map(str, paths), "--segment-frames", "40",
                     "--utterances", "2", "--out", str(report), "--allow-dirty"])
    same, sliced = json.loads(report.read_text())["students"]
    assert same["trained_segment_frames"] == 40 and set(same["band_level_db_vs_teacher"]) == {"40", "whole"}
    for levels in same["band_level_db_vs_teacher"].values():  # the dataset keeps its teacher in float16
        assert max(abs(level) for level in levels) < 0.1
    for levels in sliced["band_level_db_vs_teacher"].values():
        assert max(abs(level) for level in levels) > 1.0
