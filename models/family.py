"""What a family registers, so that generic code (stages, export, evaluation, the server) reads a
family's loaders, parts and contracts from one place and never names the family.

A family is one folder (models/<family>/), one config (conf/model/<family>_<voice>.yaml), one
line in models/registry.py, and joins tests/families/test_contract.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from models.graph_contract import GraphContract
from models.interface import Capabilities, TTSModel
from models.sampling import Sampling


@dataclass(frozen=True)
class ReferenceRuntime:
    """A family's original inference graph run as it ships (the reference a port must match), and
    how the same runtime runs a graph derived from it (an INT8 copy, an exported variant)."""

    load: Callable[[str, int], TTSModel]  # (voice, cpu_threads) -> the original graph in onnxruntime
    load_graph: Callable[[str, int, Path], TTSModel]  # (voice, cpu_threads, graph_path) -> that graph
    graph_path: Callable[[str], Path]  # voice -> the original graph file
    prepare_graph: Callable[[Path], object]  # original graph -> onnx.ModelProto ready for graph stages


@dataclass(frozen=True)
class GpuEngines:
    """A family's variants on CUDA engines (``python -m evaluate.gpu_engines``), rebuilt on a GPU
    machine from a distillation bundle with torch, numpy and safetensors."""

    plan: tuple[tuple[str, str], ...]  # (variant, backend) in run order; each variant's eager run first
    graph_modes: dict[str, tuple[bool, ...]]  # backend -> runs of one engine without (False) / through (True) CUDA graphs
    variants: Callable[[Path, Path | None], dict]  # (bundle_dir, student_weights) -> variant name -> builder
    build_engine: Callable[..., object]  # (model on device, backend, sample_rate_hz, package_dir) -> engine


@dataclass(frozen=True)
class Family:
    name: str
    capabilities: Capabilities
    sampling_type: type[Sampling]
    part_roles: tuple[str, ...]  # what ``TTSModel.parts()`` returns, in pipeline order
    load_teacher: Callable[[str, Path], TTSModel]  # (voice, cache_dir) -> the PyTorch model on the CPU
    tiny_model: Callable[[int], TTSModel]  # seed -> the same architecture with tiny random weights
    default_voice: str
    reference: ReferenceRuntime | None = None  # None: the family ships no graph of its own
    # Stage defaults that depend on the family (parts kept in float32, blocks sensitive to INT8, ...),
    # under the keys of conf/stages; a run's config overrides them.
    stage_defaults: dict = field(default_factory=dict)
    # model -> its ONNX graphs by name (models/graph_contract.py); None: the family exports no graph.
    graph_contracts: Callable[[TTSModel], dict[str, GraphContract]] | None = None
    gpu_engines: GpuEngines | None = None  # None: the family has no CUDA engine suite yet
    # (teacher, backend eager|compile|aoti, replay CUDA graphs, package_dir, batch_buckets) ->
    # (the teacher on shape-bucketed engines, whether it replays CUDA graphs, its text buckets).
    torch_engine: Callable[..., tuple[TTSModel, bool, tuple[int, ...]]] | None = None

    def sampling(self, **values) -> Sampling:
        """This family's sampling from config or request values; unknown options name the family."""
        accepted = {"seed", "length_scale", *self.sampling_type.option_names()}
        unknown = sorted(set(values) - accepted)
        if unknown:
            raise ValueError(f"family {self.name} samples with {sorted(accepted)}; unknown {unknown}")
        return self.sampling_type(**values)
