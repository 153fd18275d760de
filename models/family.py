"""What a family registers, so that generic code (stages, export, evaluation, the server) reads a
family's loaders, parts and contracts from one place and never names the family.

A family is one folder (models/<family>/), one config (conf/model/<family>_<voice>.yaml), one
line in models/registry.py, and joins tests/families/test_contract.py.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from torch import nn

from models.graph_contract import GraphContract
from models.interface import Capabilities, SynthesisRequest, TTSModel
from models.sampling import Sampling


@dataclass(frozen=True)
class ReferenceRuntime:
    """A family's original inference graph run as it ships (the reference a port must match), and
    how the same runtime runs a graph derived from it (an INT8 copy, an exported variant)."""

    load: Callable[[str, int], TTSModel]  # (voice, cpu_threads) -> the original graph in onnxruntime
    load_graph: Callable[[str, int, Path], TTSModel]  # (voice, cpu_threads, graph_path) -> that graph
    graph_path: Callable[[str], Path]  # voice -> the original graph file
    prepare_graph: Callable[[Path], object]  # original graph -> onnx.ModelProto ready for graph stages
    # The shipped graph is quantized already (Kokoro's int8 ONNX): int8_ort, which quantizes it, has
    # nothing to do; the family's INT8 graph is teacher_int8, our exported graph quantized.
    ships_int8: bool = False


@dataclass(frozen=True)
class GpuEngines:
    """A family's variants on CUDA engines (``python -m evaluate.gpu_engines``), rebuilt on a GPU
    machine from a distillation bundle with torch, numpy and safetensors."""

    plan: tuple[tuple[str, str], ...]  # (variant, backend) in run order; each variant's eager run first
    graph_modes: dict[str, tuple[bool, ...]]  # backend -> runs of one engine without (False) / through (True) CUDA graphs
    variants: Callable[[Path, Sequence[Path]], dict]  # (bundle_dir, students' weights files) -> variant name -> builder
    build_engine: Callable[..., object]  # (model on device, backend, sample_rate_hz, package_dir) -> engine


@dataclass(frozen=True)
class QuantizationLayout:
    """How INT8 stages split a family's graph and modules into blocks, each kept or quantized alone
    (compress/int8_onnxruntime.py on the graph, compress/int8_modelopt.py on PyTorch parts).

    One naming serves both: the exporter names a graph node after the module path that made it
    ("/dec/resblocks.3/convs.0/Conv" from module "dec.resblocks.3.convs.0"), so a block measured
    in the graph and one measured in PyTorch carry the same name.
    """

    # Exporter node name -> block: the first pattern that matches names it, its group 1 with "/"
    # read as "." ("/dec/ups.1/ConvTranspose" -> "dec.ups.1").
    graph_block_patterns: tuple[re.Pattern[str], ...]
    top_level_block: str  # the block of nodes outside any module
    quantizable_parts: tuple[str, ...]  # part roles INT8 may quantize in PyTorch, in data-flow order
    module_root: Callable[[TTSModel], nn.Module]  # model -> the module whose submodule paths the exporter names nodes by
    # (model, part role, request, the part's quantized module) -> None: runs the request through the
    # model so that this part sees the inputs it sees in synthesis (the calibration forward pass).
    feed_part: Callable[[TTSModel, str, SynthesisRequest, nn.Module], None]
    decoder_latent_channels: Callable[[TTSModel], int]  # model -> channels of the decoder's input, to export it alone
    qdq_part: str = "decoder"  # the part (latent frames -> audio) int8_modelopt exports alone as a Q/DQ graph

    def block_of(self, node_name: str) -> str:
        """The block a graph node belongs to, from its exporter name."""
        for pattern in self.graph_block_patterns:
            match = pattern.match(node_name)
            if match:
                return match.group(1).replace("/", ".")
        return self.top_level_block

    def module_block(self, module_name: str) -> str:
        """The block of a submodule of ``module_root``, named as ``block_of`` names the graph node it
        exports to: "dec.resblocks.3.convs1.0" -> "dec.resblocks.3"."""
        path: list[str] = []
        for token in module_name.split("."):
            if token.isdigit() and path:
                path[-1] += f".{token}"
            else:
                path.append(token)
        return self.block_of("/" + "/".join([*path, "Op"]))


@dataclass(frozen=True)
class ServedTensor:
    """One input or output of a graph served with a batch dimension first (Triton's model config)."""

    name: str
    dtype: str  # numpy dtype name: int64, float32
    dims: tuple[int, ...]  # after the batch dimension; -1 where the length varies
    batch_only: bool = False  # the tensor is (B,) alone: one value per request


@dataclass(frozen=True)
class TritonLayout:
    """How a family's prepared graph (``ReferenceRuntime.prepare_graph``) is served by a batching
    server (serve/triton_repo.py): the server joins requests along the first axis of every tensor."""

    batchable_graph: Callable[[onnx.ModelProto], onnx.ModelProto]  # prepared graph -> a copy batched per request
    inputs: Callable[[onnx.ModelProto], tuple[ServedTensor, ...]]  # batchable graph -> its inputs, in feed order
    outputs: Callable[[onnx.ModelProto], tuple[ServedTensor, ...]]  # batchable graph -> its outputs


@dataclass(frozen=True)
class DecoderPruning:
    """How the pruning stage (compress/prune.py) prunes a family's decoder (latent frames -> audio) and
    fine-tunes it toward the teacher decoder on the teacher's own latents (models/training/)."""

    part_role: str  # the part the decoder is
    latent_channels: Callable[[TTSModel], int]  # model -> channels of the decoder's input latent
    # (model, sentences or utterances) -> models.training.decoder_training.LatentDataset of the teacher's latents
    teacher_latents: Callable[..., object]
    # (decoder, latent_channels, ratio, importance magnitude|taylor, SegmentSampler | None) -> the decoder, pruned in place
    prune: Callable[..., nn.Module]
    config: Callable[[nn.Module, TTSModel], dict]  # (decoder, model) -> JSON shapes ``build`` rebuilds it from
    build: Callable[[dict], nn.Module]  # JSON shapes -> a decoder with random weights
    widths: Callable[[nn.Module], dict[str, int]]  # decoder -> its stage widths, for the run's tags


@dataclass(frozen=True)
class EncoderFfnPruning:
    """How the pruning stage narrows the inner width of a family's text-encoder feed-forward layers."""

    part_role: str  # the part those layers live in
    # (encoder, ratio, importance, calibration utterances | None) -> the encoder, pruned in place
    prune: Callable[..., nn.Module]
    # (student, teacher, training utterances, steps, lr, batch_size, device) -> {"loss_first", "loss_last"}
    finetune: Callable[..., dict]
    distance: Callable[..., float]  # (student, teacher, utterances, device) -> MSE of their outputs
    config: Callable[[nn.Module, TTSModel], dict]  # (encoder, model) -> JSON shapes ``build`` rebuilds it from
    build: Callable[[dict], nn.Module]
    widths: Callable[[nn.Module], list[int]]  # encoder -> inner width of each feed-forward layer


@dataclass(frozen=True)
class PruneHooks:
    """What a family's parts need to be pruned; a piece left None is not prunable in that family."""

    check_model: Callable[[TTSModel], None]  # ValueError naming what the family cannot prune yet (speakers, ...)
    decoder: DecoderPruning | None = None
    encoder_ffn: EncoderFfnPruning | None = None


@dataclass(frozen=True)
class DistilHooks:
    """A family's small student (the ``lite`` variant, compress/distil.py): which parts it replaces,
    how it is trained here, loaded from its weights, and prepared for training on a GPU machine."""

    student_parts: tuple[str, ...]  # part roles the student replaces; the others stay the teacher's
    check_student_config: Callable[[dict], None]  # student config fields -> ValueError naming the bad ones
    load_student: Callable[[TTSModel, Path], tuple[dict[str, nn.Module], dict]]  # (teacher, weights) -> (parts by role, config)
    # (teacher, phoneme ids, student config, checkpoint, weights path, card, **training settings) -> summary;
    # writes the weights with ``card`` in their metadata.
    train_student: Callable[..., dict]
    write_bundle: Callable[[TTSModel, list, Path, dict], None]  # (teacher, phoneme ids, folder, provenance)
    train_command: str  # the GPU machine's command on such a bundle, "{bundle}" where its folder goes
    # The named sentence sets (texts.load_sentences) the student trains on and its quality curve is
    # read on; training None: texts/training_text.py's generated English sentences.
    training_set: str | None = None
    held_out_set: str = "eval"


@dataclass(frozen=True)
class VariantMeasures:
    """A family's own measures of one variant (``Family.measure_variant``), logged beside the generic ones."""

    metrics: dict[str, float]  # names with units, e.g. tokens_per_s, first_chunk_ms
    # What the variants after the reference are compared with (an autoregressive family: the
    # reference's greedy tokens); handed back to ``measure_variant`` for each of them.
    reference: object


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
    # model -> its ONNX graphs by name (models/graph_contract.py); None: the family exports no graph.
    # A family with graph_variants also takes one of them: graph_contracts(model, variant).
    graph_contracts: Callable[..., dict[str, GraphContract]] | None = None
    # Named forms of the same graphs (Kokoro: "cpu", "float32", "reference"), its default first;
    # export.graph_variant picks one, checked at start. (): one form only.
    graph_variants: tuple[str, ...] = ()
    gpu_engines: GpuEngines | None = None  # None: the family has no CUDA engine suite yet
    # (teacher, backend eager|compile|aoti, replay CUDA graphs, package_dir, batch_buckets) ->
    # (the teacher on shape-bucketed engines, whether it replays CUDA graphs, its text buckets).
    torch_engine: Callable[..., tuple[TTSModel, bool, tuple[int, ...]]] | None = None
    # True: torch_engine also takes ``precision=`` (float16/bfloat16) and builds the half-precision
    # variant its own way from the float32 teacher (Kokoro: a half frame stage with float32 islands);
    # False: the server hands it the teacher already through models.precision.to_half_precision.
    engine_precision: bool = False
    # A frozen dataclass of the family's own bucketed-engine settings (EmotiVoice: how a batch's frame
    # stage splits into length groups). ``serve.engine_options`` fills it, checked at start like any
    # other key, and torch_engine takes it as ``options=``. None: the family's engine has no settings.
    engine_options: type | None = None
    quantization: QuantizationLayout | None = None  # None: the INT8 stages refuse the family
    triton: TritonLayout | None = None  # None: the family's graph is not served through Triton
    prune: PruneHooks | None = None  # None: the pruning stage refuses the family
    distil: DistilHooks | None = None  # None: the family has no small student (no ``lite`` variant)
    # Keys of conf/model/<family>_*.yaml that name a voice's files (``model.gpt=...``); the config
    # folds them into ``model.voice``, the one string every loader reads, and the run drops them after.
    voice_fields: tuple[str, ...] = ()
    # model -> the names of its speaker table's rows, in row order (capabilities.speaker_ids): the
    # server takes a name, or a row number, as a request's voice. None: the family names no speakers.
    speaker_names: Callable[[TTSModel], tuple[str, ...]] | None = None
    # (model, evaluation utterances, the run's sampling, the reference variant's ``VariantMeasures.reference``
    # or None for the reference itself, timed: False for a GPU-only precision scored on the CPU, whose
    # speed there says nothing) -> the family's own measures; None: the family has none.
    measure_variant: Callable[..., VariantMeasures] | None = None
    # voice -> a sentence the results carry when their quality means nothing (full-size random
    # weights: speed and memory are real, quality is not); None or returning None: no note.
    weights_note: Callable[[str], str | None] | None = None

    def sampling(self, **values) -> Sampling:
        """This family's sampling from config or request values; unknown options name the family."""
        accepted = {"seed", "length_scale", *self.sampling_type.option_names()}
        unknown = sorted(set(values) - accepted)
        if unknown:
            raise ValueError(f"family {self.name} samples with {sorted(accepted)}; unknown {unknown}")
        return self.sampling_type(**values)
