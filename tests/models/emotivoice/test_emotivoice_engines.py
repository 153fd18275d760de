"""The bucketed engine pads text, frames and batch to buckets; the masked model makes that change
no sample. Eager on the CPU here; the CUDA-graph replay is checked against eager on a GPU."""
from __future__ import annotations

import pytest
import torch

from models.emotivoice.engines import BucketedEngine, bucket_of, length_groups
from models.emotivoice.tiny import tiny_voice

LENGTHS = (7, 13, 10)  # three rows, none filling a text bucket of 16


def inputs(generator, lengths, device="cpu", seed=0):
    config = generator.config
    rng = torch.Generator().manual_seed(seed)
    steps = max(lengths)
    lengths_t = torch.tensor(lengths)
    ids = torch.randint(2, config.n_vocab, (len(lengths), steps), generator=rng) * (torch.arange(steps) < lengths_t[:, None])
    speakers = torch.randint(0, config.n_speaker, (len(lengths),), generator=rng)
    style = torch.tanh(torch.randn(len(lengths), config.bert_embedding, generator=rng))
    content = torch.tanh(torch.randn(len(lengths), config.bert_embedding, generator=rng))
    return tuple(t.to(device) for t in (ids, lengths_t, speakers, style, content))


@pytest.fixture(scope="module")
def generator():
    return tiny_voice(0).generator


@torch.no_grad()
def test_compiled_frame_stage_equals_the_eager_one(generator):
    eager = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=32)
    compiled = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=32, compile_frames=True)
    batch = inputs(generator, LENGTHS)
    expected, out = eager.synthesize(*batch), compiled.synthesize(*batch)
    assert torch.equal(out["durations"], expected["durations"])  # the text stage is never compiled
    # Fusion reorders float arithmetic: close, not bit-equal (max 5.2e-8 of a 0.11 peak on the AMD EPYC).
    torch.testing.assert_close(out["audio"], expected["audio"], rtol=0, atol=1e-6)
    assert any(type(stage).__name__ == "OptimizedModule" for stage in compiled.frame_stages.values())


@torch.no_grad()
def test_dynamic_compile_serves_many_shapes_with_two_compiles(generator):
    """compile_dynamic: two compiles of the one frame stage (a batch of one row is specialised apart) run
    five shapes in two text buckets and several frame buckets, each as the eager engine computes it;
    static shapes compile once for each (rows, text bucket, frame bucket) shape."""
    from torch._dynamo.utils import counters

    eager = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8)
    compiled = {}
    for dynamic in (True, False):
        engine = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8,
                                compile_frames=True, compile_dynamic=dynamic)
        torch._dynamo.reset()
        counters.clear()
        for lengths in ((7,), (7, 13), (7, 13, 10), (20, 13), (3, 4, 2)):  # text buckets 16 and 32
            batch = inputs(generator, lengths)
            expected, out = eager.synthesize(*batch), engine.synthesize(*batch)
            assert torch.equal(out["audio_lengths"], expected["audio_lengths"])
            torch.testing.assert_close(out["audio"], expected["audio"], rtol=0, atol=1e-6)
        compiled[dynamic] = counters["stats"]["unique_graphs"]
        frame_buckets = engine.frame_slots if dynamic else engine.frame_stages
        assert len(frame_buckets) >= 2
    assert compiled == {True: 2, False: 5}
    with pytest.raises(ValueError, match="compile_dynamic=True needs compile_frames=True"):
        BucketedEngine(generator, graphs=False, compile_dynamic=True)
    with pytest.raises(ValueError, match="compiles a PyTorch vocoder"):
        BucketedEngine(generator, graphs=False, compile_frames=True, compile_dynamic=True, vocoder_kernels="triton")


@torch.no_grad()
@pytest.mark.parametrize("conv_layout,fold_dilation",  # channels_last: the CUDA default
                         [("ncw", False), ("channels_last", False), ("channels_last", True)])
def test_eager_buckets_equal_the_model_row_by_row(generator, conv_layout, fold_dilation):
    engine = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, batch_buckets=(4,), frame_bucket=32,
                            conv_layout=conv_layout, fold_dilation=fold_dilation)
    assert any(getattr(conv, "dilation_folded", False) for conv in engine.frame_model.modules()) == fold_dilation
    batch = inputs(generator, LENGTHS)
    out = engine.synthesize(*batch)
    reference = generator.inference_copy()(*batch, masked=True)
    assert torch.equal(out["audio_lengths"], reference["audio_lengths"])
    assert torch.equal(out["durations"], reference["durations"])
    for row, samples in enumerate(out["audio_lengths"].tolist()):
        torch.testing.assert_close(out["audio"][row, :samples], reference["audio"][row, :samples],
                                   rtol=1e-4, atol=1e-5)
    assert out["audio"].shape[-1] == int(reference["frame_lengths"].max()) * generator.config.upsample_factor


def test_length_groups_sort_rows_and_cut_them_evenly():
    assert length_groups([30, 10, 20, 40, 50], 2) == [[1, 2], [0, 3, 4]]
    assert length_groups([30, 10, 20], 1) == [[1, 2, 0]]
    assert length_groups([30, 10], 4) == [[1], [0]]  # no more groups than rows


def test_length_groups_take_a_batch_buckets_size_where_rows_are_padded_to_one(generator):
    """With batch buckets each group is padded to one, so groups take a bucket's size and only the last is
    smaller: 650 rows run as 20 groups of 32 and one of 10 (656 rows computed), not 20 of 32-33 (960)."""
    buckets = tuple(2 ** k for k in range(11))  # the server's for serve.max_batch_size=1024

    def sizes(frame_groups, min_group_rows, batch, batch_buckets=buckets):
        return BucketedEngine(generator, graphs=False, batch_buckets=batch_buckets, frame_groups=frame_groups,
                              min_group_rows=min_group_rows)._group_sizes(batch)

    assert sizes(32, 32, 650) == [32] * 20 + [10]
    assert sorted(sizes(32, 32, 650, None)) == [32] * 10 + [33] * 10  # nothing padded: near-equal groups
    assert sizes(32, 32, 1024) == [32] * 32 and sizes(32, 32, 63) == [63]
    assert sizes(8, 16, 100) == [16] * 6 + [4] and sizes(8, 16, 256) == [32] * 8
    assert sizes(2, 1, 6, (1, 2, 4, 8)) == [4, 2]  # groups of 2 would make 3 groups: the bucket above
    assert sizes(8, 20, 100) == [32] * 3 + [4]  # no bucket of 16: it is below min_group_rows
    for batch in range(1, 1025, 7):
        groups = sizes(32, 32, batch)
        assert sum(groups) == batch and len(groups) <= 32
        assert sum(bucket_of(rows, buckets, "batch") for rows in groups) <= batch + 31


@torch.no_grad()
@pytest.mark.parametrize("frame_groups,batch_buckets", [(2, None), (3, None), (2, (1, 2, 4, 8))])
def test_frame_stage_in_length_groups_equals_one_run(generator, frame_groups, batch_buckets):
    """Rows whose frame counts differ, their frame stage in length groups (each group padded to its
    own longest row, and to a batch bucket with repeats of its first row): every row as in one run."""
    lengths = (7, 13, 10, 4, 12, 9)
    batch = inputs(generator, lengths, seed=1)
    one_run = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8).synthesize(*batch)
    engine = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8,
                            frame_groups=frame_groups, batch_buckets=batch_buckets)
    out = engine.synthesize(*batch)
    assert len(set(one_run["audio_lengths"].tolist())) > 2  # rows of different lengths: groups differ
    assert len(engine.frame_stages) > 1  # the groups ran in buckets of their own
    assert torch.equal(out["audio_lengths"], one_run["audio_lengths"])
    assert out["audio"].shape == one_run["audio"].shape
    for row, samples in enumerate(out["audio_lengths"].tolist()):  # past a row's end: read by no one
        torch.testing.assert_close(out["audio"][row, :samples], one_run["audio"][row, :samples], rtol=1e-4, atol=1e-5)


def test_buckets_reject_what_they_cannot_hold(generator):
    assert bucket_of(17, (16, 32), "text length") == 32
    with pytest.raises(ValueError, match="text length of 40"):
        bucket_of(40, (16, 32), "text length")
    with pytest.raises(ValueError, match="graphs=False"):
        BucketedEngine(generator, graphs=True)
    with pytest.raises(ValueError, match="vocoder_kernels 'tensorrt'"):
        BucketedEngine(generator, graphs=False, vocoder_kernels="tensorrt")
    with pytest.raises(ValueError, match="frame_groups=0"):
        BucketedEngine(generator, graphs=False, frame_groups=0)
    with pytest.raises(ValueError, match="min_group_rows=0"):
        BucketedEngine(generator, graphs=False, frame_groups=2, min_group_rows=0)


@torch.no_grad()
def test_min_group_rows_caps_the_groups_by_batch(generator):
    """Groups never hold fewer rows than ``min_group_rows``: 6 rows at 3 a group run as two groups,
    and every row still equals its one-run samples."""
    lengths = (7, 13, 10, 4, 12, 9)
    batch = inputs(generator, lengths, seed=1)
    engine = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8, frame_groups=6,
                            min_group_rows=3)
    assert [engine._groups(rows) for rows in (1, 2, 3, 5, 6, 12, 40)] == [1, 1, 1, 1, 2, 4, 6]
    one_run = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8).synthesize(*batch)
    out = engine.synthesize(*batch)
    assert len(engine.frame_stages) == 2  # two groups, each in a frame bucket of its own
    for row, samples in enumerate(out["audio_lengths"].tolist()):
        torch.testing.assert_close(out["audio"][row, :samples], one_run["audio"][row, :samples], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_cuda_graph_replay_equals_eager_buckets(generator):
    model = generator.to("cuda")
    graphed = BucketedEngine(model, graphs=True, frame_dtype=torch.float32)
    eager = BucketedEngine(model, graphs=False, frame_dtype=torch.float32)
    for seed in range(2):  # the second call replays the captured graphs with new inputs
        batch = inputs(model, LENGTHS, "cuda", seed)
        out, reference = graphed.synthesize(*batch), eager.synthesize(*batch)
        assert torch.equal(out["audio_lengths"], reference["audio_lengths"])
        torch.testing.assert_close(out["audio"], reference["audio"], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_grouped_cuda_graphs_equal_one_eager_run(generator):
    """Length groups through CUDA graphs, with a frame bucket wide enough that both groups of a batch
    replay the same graph (the first group's output must be copied out before the second runs)."""
    model = generator.to("cuda")
    graphed = BucketedEngine(model, graphs=True, frame_dtype=torch.float32, frame_groups=2, batch_buckets=(2, 4),
                             frame_bucket=512)
    eager = BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=512)
    for seed in range(2):  # the second call replays the captured graphs with new inputs
        batch = inputs(model, (7, 13, 10, 4), "cuda", seed)
        out, reference = graphed.synthesize(*batch), eager.synthesize(*batch)
        assert torch.equal(out["audio_lengths"], reference["audio_lengths"])
        assert len({key for key in graphed.cache.captured if key[0] == "frames"}) == 1  # one shape, two groups
        for row, samples in enumerate(out["audio_lengths"].tolist()):
            torch.testing.assert_close(out["audio"][row, :samples], reference["audio"][row, :samples],
                                       rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_dynamic_compile_through_cuda_graphs_equals_eager_buckets(generator):
    """The one frame stage compiled with symbolic sizes, captured as a graph per (rows, text bucket, frame
    bucket) and replayed with new inputs, in length groups of a batch bucket's size: every row as eager."""
    model = generator.to("cuda")
    graphed = BucketedEngine(model, graphs=True, frame_dtype=torch.float32, frame_bucket=8, compile_frames=True,
                             compile_dynamic=True, frame_groups=2, min_group_rows=2, batch_buckets=(1, 2, 4, 8))
    eager = BucketedEngine(model, graphs=False, frame_dtype=torch.float32, frame_bucket=8)
    for seed in range(2):  # the second call replays the captured graphs with new inputs
        for lengths in ((7,), (7, 13, 10, 4, 12, 9), (20, 3, 5), (7, 13, 10, 4, 12, 9, 5)):  # 7 rows: [4, 3 + 1]
            batch = inputs(model, lengths, "cuda", seed)
            out, reference = graphed.synthesize(*batch), eager.synthesize(*batch)
            assert torch.equal(out["audio_lengths"], reference["audio_lengths"])
            for row, samples in enumerate(out["audio_lengths"].tolist()):
                torch.testing.assert_close(out["audio"][row, :samples], reference["audio"][row, :samples],
                                           rtol=1e-4, atol=1e-5)
    assert graphed.frame_stages == {} and len(graphed.frame_slots) >= 2
