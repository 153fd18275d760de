"""The batch-1 step as a CUDA C++ kernel of thread-block clusters (models/gpt_sovits/engine_cluster.py):
compiled on this CPU with NVRTC at the official shapes; on a GPU, its logits and tokens against the
Triton persistent step's, step by step, on full-size random weights."""
from __future__ import annotations

import itertools

import pytest
import torch

from core.cuda_source import CudaSourceError, compile_cuda, nvrtc_available
from models.gpt_sovits.engine import T2SRequest
from models.gpt_sovits.engine_weights import MANIFEST_PATH, T2SWeights, random_state_dict
from models.gpt_sovits.t2s import T2SConfig
from models.gpt_sovits.t2s_checkpoint import t2s_from_manifest

pytest.importorskip("triton")
from models.gpt_sovits.engine_cluster import (  # noqa: E402 - after the Triton check: the engine builds on the Triton one
    CLUSTER_SIZES,
    COPIES,
    ClusterT2SEngine,
    compile_step,
    kernel_defines,
    shared_bytes,
    unsupported_reason,
)

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC not installed (the dev extra brings it)")


@pytest.fixture(scope="module")
def official_config() -> T2SConfig:
    return t2s_from_manifest(MANIFEST_PATH).config


@needs_nvrtc
def test_the_step_compiles_at_the_official_shapes_with_its_cluster_and_shared_memory(official_config):
    """NVRTC (no GPU) compiles the step for sm_90 with each cluster size and each way of copying tiles
    (one of them with its timer stamps): a cubin, the cluster's barrier and distributed shared-memory loads
    in the PTX, bulk copies only where asked, and a shared-memory layout that fits one SM (227 KB)."""
    for cluster, copies in itertools.product(CLUSTER_SIZES, COPIES):
        defines = kernel_defines(official_config, 640, 8, 8, cluster, timeline=copies == "after", copies=copies)
        compiled = compile_step(tuple(sorted(defines.items())))
        assert compiled.cubin[:4] == b"\x7fELF"
        for instruction in ("barrier.cluster.arrive.release", "mapa.shared::cluster", "ld.shared::cluster.f32",
                            "cp.async.cg.shared.global", "red.release.gpu.global.add.u32",
                            f".reqnctapercluster {cluster}"):
            assert instruction in compiled.ptx, (cluster, copies, instruction)
        assert ("cp.async.bulk.shared::cluster.global.mbarrier" in compiled.ptx) == (copies == "bulk")
        assert ("globaltimer" in compiled.ptx) == (copies == "after")  # the stamped build
        assert 48 * 1024 < shared_bytes(compiled) <= 227 * 1024


@needs_nvrtc
def test_a_shape_the_kernel_does_not_take_fails_at_compile_time_with_its_reason(official_config):
    """The source's static assertions reject shapes its thread mapping does not cover, by name."""
    defines = kernel_defines(official_config, 640, 8, 8, 8) | {"HD": 64}
    with pytest.raises(CudaSourceError, match="32 dimensions: one per lane"):
        compile_step(tuple(sorted(defines.items())))
    with pytest.raises(CudaSourceError, match="did not compile"):
        compile_cuda("__global__ void broken( {", "sm_90")


def test_the_engine_names_what_it_cannot_run(official_config):
    """Configurations other than the official v2 shapes, non-FP16 weights and CPU weights are refused
    before any compile."""
    small = T2SConfig.from_checkpoint_config({"vocab_size": 41, "phoneme_vocab_size": 23, "embedding_dim": 48,
                                              "hidden_dim": 48, "head": 3, "n_layer": 3, "EOS": 40})
    assert "head_dim" in unsupported_reason(small)
    assert all(unsupported_reason(official_config, cluster) is None for cluster in CLUSTER_SIZES)
    state_dict = random_state_dict(official_config, seed=0)
    with pytest.raises(ValueError, match="FP16"):
        ClusterT2SEngine(T2SWeights.from_state_dict(official_config, state_dict, torch.float32, "cpu"))
    with pytest.raises(ValueError, match="on a GPU"):
        ClusterT2SEngine(T2SWeights.from_state_dict(official_config, state_dict, torch.float16, "cpu"))
    small_weights = T2SWeights.from_state_dict(small, random_state_dict(small, seed=0), torch.float16, "cpu")
    with pytest.raises(ValueError, match="cannot run this model"):
        ClusterT2SEngine(small_weights)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("prompt_tokens,knobs", [(30, {}), (300, {}), (300, {"copies": "after"}),
                                                 (300, {"copies": "before"}), (300, {"copies": "bulk", "cluster": 4})])
def test_the_cluster_step_gives_the_logits_and_tokens_of_the_triton_persistent_step(official_config, prompt_tokens,
                                                                                    knobs):
    """Full-size random weights in FP16, one request prefilled into both engines: 40 greedy steps, each
    step's logits within float32 summation order (and the exponent's approximation) of the Triton
    persistent step's, and the same tokens. 300 prompt tokens give each CTA a chunk of 42 cached
    positions; 30 leave most chunks at 4 and the new position to the last CTA. Every ``copies``
    setting (the default ``bulk``; ``after`` and ``before``), and clusters of 4 beside the engine's choice."""
    from models.gpt_sovits.engine_persistent import PersistentT2SEngine

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need compute capability 9.0")
    state_dict = random_state_dict(official_config, seed=0)
    generator = torch.Generator().manual_seed(1)
    phones = 30
    request = T2SRequest(torch.randint(0, official_config.phoneme_vocab_size, (phones,), generator=generator),
                         0.5 * torch.randn(official_config.bert_feature_dim, phones, generator=generator),
                         torch.randint(0, official_config.vocab_size - 1, (prompt_tokens,), generator=generator),
                         top_k=1, max_steps=100, eos_from_step=100)
    max_len = 512
    engines = []
    for kind, settings in ((ClusterT2SEngine, knobs), (PersistentT2SEngine, {})):
        weights = T2SWeights.from_state_dict(official_config, state_dict, torch.float16, "cuda")
        engine = kind(weights, max_batch=1, max_len=max_len, length_buckets=[max_len], **settings)
        engine.prefill([0], [request])
        engines.append(engine)
    for step in range(40):
        for engine in engines:
            engine.decode_step(1, max_len, greedy=True)
        variant, reference = (engine._step_logits for engine in engines)
        assert reference.abs().max() > 0.1  # a real forward pass
        torch.testing.assert_close(variant, reference, rtol=0, atol=2e-3 * float(reference.abs().max()))
        assert torch.equal(engines[0].tokens, engines[1].tokens), step
    assert not engines[0].barrier_timed_out()
    cache_len = int(engines[0].cache_len[0])
    torch.testing.assert_close(engines[0].kv_cache[:, 0, :cache_len], engines[1].kv_cache[:, 0, :cache_len],
                               rtol=0, atol=4e-3 * float(engines[1].kv_cache.abs().max()))
