"""Kokoro's bucketed engine: eager on the CPU it equals the model whether or not frames are padded
to the bucket (the model's masked frame path, a BiLSTM that starts at each item's end), and pads a
batch of different durations without moving any item; FP16 stays close. The CUDA graph replay
is checked against eager on a GPU."""
from __future__ import annotations

import pytest
import torch

from models.kokoro.engines import BucketedEngine, MaskedBiLstm, StyleProjections, TableColumns, UnpaddedBiLstm
from models.kokoro.layers import AdaIN1d
from models.kokoro.tiny import tiny_model

TOKENS = 12  # with the two 0 pads
BUCKET = 16


def snr_db(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    return float(10 * torch.log10(reference.pow(2).sum() / (reference - estimate).pow(2).sum().clamp_min(1e-30)))


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


def request(model, frames_per_token: list[list[int]], seed: int = 0):
    rng = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, model.config.n_token, (1, TOKENS), generator=rng)
    ids[:, 0] = ids[:, -1] = 0
    ref_s = torch.randn(1, 2 * model.config.style_dim, generator=rng) * 0.3
    batch = len(frames_per_token)
    return ids.expand(batch, -1), ref_s.expand(batch, -1), torch.tensor(frames_per_token)


def exact(model, ids, ref_s, frames):
    with torch.no_grad():
        return model.forward_with_tokens(ids, ref_s, frames_per_token=frames).audio


@torch.no_grad()
def test_unpadded_bucket_equals_the_model(model):
    ids, ref_s, frames = request(model, [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 2, 2]])  # 32 frames: two full buckets
    engine = BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=BUCKET)
    out = engine.synthesize(ids, ref_s, frames_per_token=frames)
    torch.testing.assert_close(out["audio"], exact(model, ids, ref_s, frames), rtol=1e-4, atol=1e-5)
    assert out["audio_lengths"].tolist() == [32 * model.config.samples_per_frame]


@torch.no_grad()
def test_padded_frames_change_no_sample(model):
    ids, ref_s, frames = request(model, [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6]])  # 37 frames in a bucket of 48
    engine = BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=BUCKET)
    audio = engine.synthesize(ids, ref_s, frames_per_token=frames)["audio"]
    torch.testing.assert_close(audio, exact(model, ids, ref_s, frames), rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_float32_statistics_stay_close_to_the_float64_ones_on_a_padded_batch(model):
    durations = [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6], [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]]  # 37 and 22 frames
    ids, ref_s, frames = request(model, durations)
    engines = [BucketedEngine(model, graphs=False, frame_bucket=BUCKET, statistics_dtype=dtype)
               for dtype in (torch.float64, torch.float32)]
    assert {norm.statistics_dtype for norm in engines[1].frame_model.modules() if isinstance(norm, AdaIN1d)} == {
        torch.float32}
    wide, narrow = (engine.synthesize(ids, ref_s, frames_per_token=frames) for engine in engines)
    assert narrow["audio_lengths"].tolist() == wide["audio_lengths"].tolist()
    assert snr_db(wide["audio"], narrow["audio"]) > 60.0
    assert not torch.equal(wide["audio"], narrow["audio"])  # the option reached the statistics


@torch.no_grad()
def test_float16_frame_stage_stays_close(model):
    ids, ref_s, frames = request(model, [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6]])
    engine = BucketedEngine(model, graphs=False, frame_dtype=torch.float16, frame_bucket=BUCKET)
    audio = engine.synthesize(ids, ref_s, frames_per_token=frames)["audio"]
    assert snr_db(exact(model, ids, ref_s, frames), audio) > 30.0  # 35.9 dB on 2026-12-01


@torch.no_grad()
@pytest.mark.parametrize("conv_layout,fold_dilation,align_channels",
                         [("channels_last", False, 1), ("ncw", True, 1), ("channels_last", True, 1), ("ncw", False, 32)])
def test_converted_frame_stage_equals_the_ncw_one_on_a_padded_batch(model, conv_layout, fold_dilation, align_channels):
    durations = [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6], [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]]  # 37 and 22 frames
    ids, ref_s, frames = request(model, durations)
    ncw = BucketedEngine(model, graphs=False, frame_bucket=BUCKET).synthesize(ids, ref_s, frames_per_token=frames)
    engine = BucketedEngine(model, graphs=False, frame_bucket=BUCKET, conv_layout=conv_layout,
                            fold_dilation=fold_dilation, align_channels=align_channels)
    layout_convs = [m for m in engine.frame_model.decoder.modules() if type(m).__name__ == "LayoutConv"]
    assert any(conv.dilation_folded for conv in layout_convs) == fold_dilation
    assert any(conv.input_padding for conv in layout_convs) == (align_channels > 1)
    converted = len(layout_convs)
    assert converted == sum(isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)) for m in model.decoder.modules())
    out = engine.synthesize(ids, ref_s, frames_per_token=frames)
    assert out["audio_lengths"].tolist() == ncw["audio_lengths"].tolist()
    torch.testing.assert_close(out["audio"], ncw["audio"], rtol=1e-4, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("frame_dtype", [torch.float32, torch.float16])
def test_stacked_style_projections_equal_the_per_adain_ones_on_a_padded_batch(model, frame_dtype):
    durations = [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6], [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]]  # 37 and 22 frames
    ids, ref_s, frames = request(model, durations)
    separate, stacked = (BucketedEngine(model, graphs=False, frame_dtype=frame_dtype, frame_bucket=BUCKET,
                                        stacked_projections=stack) for stack in (False, True))
    adains = [norm for norm in stacked.frame_model.modules() if isinstance(norm, AdaIN1d)]
    assert adains and all(isinstance(norm.fc, TableColumns) for norm in adains)  # none left computing its own
    columns = sum(table.weight.shape[0] for table in stacked.projections.values())
    assert columns == sum(norm.fc.out_features for norm in model.modules() if isinstance(norm, AdaIN1d))
    expected = separate.synthesize(ids, ref_s, frames_per_token=frames)
    out = stacked.synthesize(ids, ref_s, frames_per_token=frames)
    assert out["audio_lengths"].tolist() == expected["audio_lengths"].tolist()
    torch.testing.assert_close(out["audio"], expected["audio"], rtol=1e-4, atol=1e-5)


def test_style_projections_refuse_a_module_without_adain():
    with pytest.raises(ValueError, match="no AdaIN1d"):
        StyleProjections(torch.nn.Linear(4, 4))


@torch.no_grad()
def test_batch_rows_of_different_durations_equal_their_single_runs(model):
    durations = [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 2, 2], [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]]  # 32 and 22 frames
    ids, ref_s, frames = request(model, durations)
    engine = BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=BUCKET)
    out = engine.synthesize(ids, ref_s, frames_per_token=frames)
    for row in range(2):
        single = engine.synthesize(ids[row:row + 1], ref_s[row:row + 1], frames_per_token=frames[row:row + 1])
        samples = int(out["audio_lengths"][row])
        assert samples == int(single["audio_lengths"][0])
        torch.testing.assert_close(out["audio"][row, :samples], single["audio"][0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_masked_bilstm_equals_the_bilstm_on_each_items_own_frames(fused):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 4, batch_first=True, bidirectional=True)
    x = torch.randn(2, 9, 6)
    lengths = torch.tensor([9, 5])
    with torch.no_grad():
        out = MaskedBiLstm(lstm, fused=fused)(x, lengths)
        torch.testing.assert_close(out[0], lstm(x[:1])[0][0])
        torch.testing.assert_close(out[1, :5], lstm(x[1:, :5])[0][0])
    assert out[1, 5:].abs().max() == 0


@torch.no_grad()
def test_fused_text_lstms_equal_the_model_and_leave_it_untouched(model):
    durations = [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6], [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]]  # 37 and 22 frames
    ids, ref_s, frames = request(model, durations)
    plain, fused = (BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=BUCKET,
                                   fused_text_lstms=fuse) for fuse in (False, True))
    text_model = fused.text_stage.model
    assert text_model is not model and text_model.decoder is model.decoder  # the decoder shared, not copied
    assert text_model.predictor.shared is model.predictor.shared  # the frame-rate BiLSTM: shared, not converted
    bilstms = sum(isinstance(module, torch.nn.LSTM) and module.bidirectional for module in model.modules())
    assert sum(isinstance(module, UnpaddedBiLstm) for module in text_model.modules()) == bilstms - 1
    assert not any(isinstance(module, UnpaddedBiLstm) for module in model.modules())
    speed = torch.ones(1)
    for expected, got in zip(plain.text_stage(ids, ref_s, speed), fused.text_stage(ids, ref_s, speed)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    expected = plain.synthesize(ids, ref_s)  # predicted durations: the fused LSTMs must not tip one
    out = fused.synthesize(ids, ref_s)
    assert out["audio_lengths"].tolist() == expected["audio_lengths"].tolist()
    torch.testing.assert_close(out["audio"], expected["audio"], rtol=1e-4, atol=1e-5)


def test_unpadded_bilstm_refuses_an_initial_state():
    lstm = UnpaddedBiLstm(torch.nn.LSTM(6, 4, batch_first=True, bidirectional=True))
    with pytest.raises(TypeError, match="initial state"):
        lstm(torch.randn(1, 3, 6), (torch.zeros(2, 1, 4), torch.zeros(2, 1, 4)))


def test_graphs_need_cuda(model):
    with pytest.raises(ValueError, match="graphs=False"):
        BucketedEngine(model, graphs=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_cuda_graph_replay_equals_eager_buckets(model):
    model = tiny_model(0).to("cuda")
    graphed = BucketedEngine(model, graphs=True, frame_dtype=torch.float32, frame_bucket=BUCKET)
    eager = BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=BUCKET)
    for seed in range(2):  # the second call replays the captured graphs with new inputs
        ids, ref_s, frames = request(model, [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6]], seed)
        out = graphed.synthesize(ids, ref_s, frames_per_token=frames)
        torch.testing.assert_close(out["audio"], eager.synthesize(ids, ref_s, frames_per_token=frames)["audio"],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
@pytest.mark.parametrize("knobs", [{}, {"stacked_projections": False}, {"fold_dilation": True}, {"align_channels": 32},
                                   {"statistics_dtype": torch.float32}, {"fused_text_lstms": True},
                                   {"conv_layout": "channels_last", "statistics_dtype": torch.float32}],
                         ids=["default", "unstacked", "folded", "aligned", "stats32", "fused_text_lstms",
                              "channels_last_stats32"])
def test_compiled_graph_replay_equals_eager_buckets(knobs):
    """The compiled, graphed engine against the eager one with the same knobs (each A/B option runs
    through torch.compile and CUDA-graph capture)."""
    model = tiny_model(0).to("cuda")
    graphed = BucketedEngine(model, graphs=True, frame_dtype=torch.float32, frame_bucket=BUCKET, compile_stages=True,
                             **knobs)
    eager = BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=BUCKET, **knobs)
    compiled = torch._dynamo.eval_frame.OptimizedModule
    for seed in range(2):  # the second call replays the captured graphs with new inputs
        ids, ref_s, frames = request(model, [[2, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 6]], seed)
        out = graphed.synthesize(ids, ref_s, frames_per_token=frames)
        reference = eager.synthesize(ids, ref_s, frames_per_token=frames)["audio"]
        expected_samples = sum(frames[0].tolist()) * model.config.samples_per_frame
        torch.testing.assert_close(out["audio_lengths"], torch.tensor([expected_samples]))
        # The compiler may reorder floating-point sums (and cuDNN's TF32 choices differ per graph): close, not equal.
        assert snr_db(reference, out["audio"]) > 60.0
    assert isinstance(graphed.text_stage, compiled)
    assert graphed.frame_stages and all(isinstance(stage, compiled) for stage in graphed.frame_stages.values())
