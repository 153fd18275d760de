"""GPT-SoVITS v2's ONNX graph contracts: the text-to-semantic transformer as a prefill graph and a
one-step decode graph over a static KV cache, the SoVITS decoder with its noise as an input, the
reference encoder, and the SSL -> semantic-code encoder with its codebook search as MatMul +
ArgMin + Gather. The family is autoregressive, so there is no end-to-end ``synthesizer`` graph::

    contracts = graph_contracts(voice)                 # {name: GraphContract}, names in GRAPH_NAMES
    export_graph(contracts["t2s_decode_step"], "decode_step.onnx")   # export/onnx_export.py

How a caller runs the T2S graphs (batch B, rows right-padded to T_text):

1. ``t2s_prefill(phoneme_ids (B, T_text), bert_features (B, 1024, T_text), text_lengths (B,),
   prompt_tokens (B, T_prompt))`` -> ``logits`` (B, 1025) of the first step, ``key_cache`` and
   ``value_cache`` (layers, B, heads, max_len, head_dim) and ``cache_lengths`` (B,). Each row's
   text and prompt are packed from cache position 0 (its padding squeezed out), zeros after, so one
   valid length per row says which positions exist. The prompt is shared by the batch's rows (one
   voice), as in the official batch decode.
2. Per step, ``t2s_decode_step(token (B, 1), audio_position (B,), key_cache, value_cache,
   cache_lengths (B,))`` -> ``logits`` (B, 1025), ``new_keys`` and ``new_values`` (layers, B,
   heads, 1, head_dim): the new token's own keys and values, which the caller writes at position
   ``cache_lengths`` before adding 1 to it. ``audio_position`` is T_prompt + the step index. The
   step attends the cache positions below ``cache_lengths`` and itself; whatever lies at or past
   a row's valid length is never read into its output. The cache's position axis is dynamic
   (length buckets up to the prefill's max_len).

Choosing tokens (repetition penalty, top-k/top-p, EOS rules) stays with the caller
(``models.gpt_sovits.t2s_decode.choose_next_tokens``), as in the eager decoder and the engine;
models/gpt_sovits/onnx_decode.py is such a caller for one utterance in onnxruntime.

``sovits_decoder`` takes the reference embedding ``ge`` (B, 512, 1), not the spectrogram: ge is a
property of the voice, computed once per reference clip (``sovits_reference_encoder``) and cached
with its prompt, and the reference encoder averages every frame it is given, so references of
unequal lengths could not share a padded batch inside one graph anyway. Its prior noise (B, inter,
2 T_codes) is an input drawn by the caller (``noise_scale`` 0 makes it irrelevant); speed is 1.
"""
from __future__ import annotations

import copy
import math

import onnx
import torch
from torch import nn
from torch.nn import functional as F

from models.gpt_sovits.sovits import SovitsSynthesizer
from models.gpt_sovits.t2s import Text2SemanticModel, sinusoid_table
from models.graph_contract import GraphContract

PREFILL, DECODE_STEP = "t2s_prefill", "t2s_decode_step"
SOVITS_DECODER, REFERENCE_ENCODER, RVQ_ENCODE = "sovits_decoder", "sovits_reference_encoder", "rvq_encode"
GRAPH_NAMES = (PREFILL, DECODE_STEP, SOVITS_DECODER, REFERENCE_ENCODER, RVQ_ENCODE)
# Cache positions (text + prompt + generated tokens) of the prefill's static cache: the engine's
# default max_len; 54 s of official max_sec is 1350 tokens, leaving room for text and prompt.
DEFAULT_MAX_LEN = 2048
# Ops that a static-shape runtime (TensorRT, CUDA graphs) cannot plan or that draw inside the graph.
FORBIDDEN_OPS = frozenset({"NonZero", "Loop", "If", "Scan", "RandomNormal", "RandomNormalLike",
                           "RandomUniform", "RandomUniformLike", "Multinomial"})
# Example sizes for tracing, all distinct so that torch.export keeps each dimension its own symbol;
# batch 2 because it specializes a dimension whose example size is 1.
EXAMPLE_TEXT_LENGTHS = (13, 9)
EXAMPLE_PROMPT_TOKENS = 7
EXAMPLE_GENERATED = 5  # tokens already decoded in the decode step's example cache
EXAMPLE_CACHE_POSITIONS = 40  # a length bucket of the decode step's example cache
EXAMPLE_CODES = (11, 8)
EXAMPLE_TARGET_PHONEMES = (17, 12)
EXAMPLE_REFERENCE_FRAMES = 37
EXAMPLE_SSL_FRAMES = 23  # odd: ssl_proj's stride 2 drops the last frame


def refuse_dynamic_ops(model: onnx.ModelProto) -> None:
    """Raise if the exported graph has control flow, data-dependent shapes or random draws."""
    found = sorted({node.op_type for node in model.graph.node} & FORBIDDEN_OPS)
    if found:
        raise ValueError(f"the exported GPT-SoVITS graph contains {found}; its graphs must have none of "
                         f"{sorted(FORBIDDEN_OPS)} (static-shape runtimes, noise as an input)")


def _require_codebook_search(model: onnx.ModelProto) -> None:
    refuse_dynamic_ops(model)
    ops = {node.op_type for node in model.graph.node}
    if "ArgMin" not in ops or ops & {"ReduceMin", "TopK"}:
        raise ValueError(f"rvq_encode must search its codebook with MatMul + ArgMin + Gather, found ops {sorted(ops)}")


class T2SPrefill(nn.Module):
    """The first pass of the T2S transformer into a static cache (module docstring, step 1)."""

    def __init__(self, t2s: Text2SemanticModel, max_len: int):
        super().__init__()
        self.t2s = t2s
        self.max_len = max_len
        # alpha * table is added at run time (alpha is a weight a compressed model may change).
        self.register_buffer("positions", sinusoid_table(max_len, t2s.config.hidden_dim), persistent=False)

    def forward(self, phoneme_ids, bert_features, text_lengths, prompt_tokens):
        t2s = self.t2s
        batch, text_len = phoneme_ids.shape
        prompt_len = prompt_tokens.shape[1]
        # The eager embed_text / embed_audio sums, term for term.
        text = t2s.ar_text_embedding(phoneme_ids) + t2s.bert_proj(bert_features.transpose(1, 2))  # (B, T_text, D)
        text = text + t2s.ar_text_position.alpha * self.positions[:text_len]
        audio = t2s.ar_audio_embedding(prompt_tokens) + t2s.ar_audio_position.alpha * self.positions[:prompt_len]
        x = torch.cat([text, audio], dim=1)  # (B, S, D), S = T_text + T_prompt
        columns = torch.arange(text_len + prompt_len, device=x.device)  # (S,)
        is_text = columns < text_len  # (S,)
        key_exists = (columns.unsqueeze(0) < text_lengths.unsqueeze(1)) | ~is_text  # (B, S): padding hidden
        # Text rows see the text; audio rows see the text and the audio up to themselves.
        causal = ~is_text.unsqueeze(1) & (columns.unsqueeze(0) <= columns.unsqueeze(1))  # (S_q, S_k)
        attend = key_exists.unsqueeze(1) & (is_text.unsqueeze(0) | causal)  # (B, S_q, S_k)
        attend = attend.unsqueeze(1)  # (B, 1, S_q, S_k)
        keys, values = [], []
        for layer in t2s.h.layers:
            x, layer_keys, layer_values = layer(x, None, attend)  # keys/values (B, H, S, D_head)
            keys.append(layer_keys)
            values.append(layer_values)
        # Cache position p of row b holds sequence column p (its text) or p - len_b + T_text (its prompt).
        cache_lengths = text_lengths + prompt_len  # (B,)
        positions = torch.arange(self.max_len, device=x.device).unsqueeze(0)  # (1, max_len)
        source = torch.where(positions < text_lengths.unsqueeze(1), positions,
                             positions - text_lengths.unsqueeze(1) + text_len)  # (B, max_len)
        source = source.clamp(0, text_len + prompt_len - 1)
        written = (positions < cache_lengths.unsqueeze(1)).view(batch, 1, self.max_len, 1)  # (B, 1, max_len, 1)
        heads, head_dim = keys[0].shape[1], keys[0].shape[3]
        index = source.view(batch, 1, self.max_len, 1).expand(batch, heads, self.max_len, head_dim)

        def pack(per_layer: list[torch.Tensor]) -> torch.Tensor:
            packed = [torch.where(written, torch.gather(t, 2, index), 0.0) for t in per_layer]
            return torch.stack(packed)  # (layers, B, H, max_len, D_head)

        # The last written position's column: the last prompt token, or without a prompt the row's last text id.
        last = torch.gather(source, 1, (cache_lengths - 1).unsqueeze(1))  # (B, 1)
        last = x.gather(1, last.unsqueeze(2).expand(batch, 1, x.shape[2]))  # (B, 1, D)
        logits = t2s.ar_predict_layer(last[:, 0])  # (B, V)
        return logits, pack(keys), pack(values), cache_lengths


class T2SDecodeStep(nn.Module):
    """One token per row over the static cache (module docstring, step 2)."""

    def __init__(self, t2s: Text2SemanticModel, max_len: int):
        super().__init__()
        self.t2s = t2s
        self.register_buffer("positions", sinusoid_table(max_len, t2s.config.hidden_dim), persistent=False)

    def forward(self, token, audio_position, key_cache, value_cache, cache_lengths):
        t2s = self.t2s
        batch, cache_len = key_cache.shape[1], key_cache.shape[3]
        x = t2s.ar_audio_embedding(token) + t2s.ar_audio_position.alpha * self.positions[audio_position].unsqueeze(1)
        # (B, 1, D). Cache positions at or past a row's valid length are out, whatever they hold.
        hidden = torch.arange(cache_len, device=x.device).unsqueeze(0) >= cache_lengths.unsqueeze(1)  # (B, P)
        hidden = hidden.view(batch, 1, 1, cache_len)
        new_keys, new_values = [], []
        for index, layer in enumerate(t2s.h.layers):
            attention = layer.self_attn
            dim = x.shape[2]
            head_dim = dim // attention.heads
            query, key, value = (t.view(batch, 1, attention.heads, head_dim).transpose(1, 2)
                                 for t in attention.in_proj(x).chunk(3, -1))
            # (B, H, 1, D_head) each. Scores against the cache and against itself, one softmax over both:
            # the cache is read in place, never concatenated with the new position.
            scale = 1.0 / math.sqrt(head_dim)
            cached_scores = (query @ key_cache[index].transpose(2, 3)) * scale  # (B, H, 1, P)
            cached_scores = cached_scores.masked_fill(hidden, float("-inf"))
            own_score = (query * key).sum(-1, keepdim=True) * scale  # (B, H, 1, 1)
            weights = F.softmax(torch.cat([cached_scores, own_score], dim=-1), dim=-1)  # (B, H, 1, P + 1)
            attended = weights[..., :cache_len] @ value_cache[index] + weights[..., cache_len:] * value  # (B, H, 1, Dh)
            attended = attention.out_proj(attended.transpose(1, 2).reshape(batch, 1, dim))  # (B, 1, D)
            x = layer.norm1(x + attended)
            x = layer.norm2(x + layer.linear2(F.relu(layer.linear1(x))))
            new_keys.append(key)
            new_values.append(value)
        logits = t2s.ar_predict_layer(x[:, 0])  # (B, V)
        return logits, torch.stack(new_keys), torch.stack(new_values)  # (layers, B, H, 1, D_head) each


class SovitsDecoder(nn.Module):
    """Semantic codes + target phones + ge + noise -> audio (B, 1, 2 T_codes * hop); speed 1."""

    def __init__(self, sovits: SovitsSynthesizer):
        super().__init__()
        self.sovits = sovits

    def forward(self, codes, code_lengths, phoneme_ids, phoneme_lengths, ge, noise, noise_scale):
        sovits = self.sovits
        m_p, logs_p, mask = sovits.prior(codes, phoneme_ids, ge, 1.0, code_lengths, phoneme_lengths)  # (B, inter, T')
        # synthesize_latent's sum; noise_scale 0 gives m_p exactly, as its noise-free branch does.
        z_p = m_p + noise * torch.exp(logs_p) * noise_scale
        z = sovits.flow.reverse(z_p, mask, ge)
        return sovits.dec(z * mask, ge)  # (B, 1, T' * upsampling)


class ReferenceEncoder(nn.Module):
    """A reference clip's linear spectrogram (B, bins, T_ref), every frame real -> ge (B, 512, 1)."""

    def __init__(self, sovits: SovitsSynthesizer):
        super().__init__()
        self.sovits = sovits

    def forward(self, reference_spectrogram):
        return self.sovits.reference_embedding([reference_spectrogram])


class MatMulCodebookEncoder(nn.Module):
    """``extract_latent`` with export/rewrites/rvq.py's search: per stage, |c|^2 - 2 r.c by one MatMul,
    ArgMin over the codebook, a Gather. (That module is in the export layer, which models may not
    import; tests/models/gpt_sovits/test_onnx_contract.py checks the two give the same codes.)"""

    def __init__(self, sovits: SovitsSynthesizer):
        super().__init__()
        self.ssl_proj = sovits.ssl_proj
        codebooks = sovits.quantizer.codebooks().detach().clone()  # (S, K, D)
        self.register_buffer("codebooks", codebooks)
        self.register_buffer("codebook_norms", codebooks.pow(2).sum(-1))  # (S, K)

    def forward(self, ssl_features):
        residual = self.ssl_proj(ssl_features).transpose(1, 2)  # (B, T_codes, D)
        codes = []
        for stage in range(self.codebooks.shape[0]):
            codebook = self.codebooks[stage]  # (K, D)
            # |r|^2 is the same for every code and cannot move the argmin.
            distances = self.codebook_norms[stage] - 2 * residual @ codebook.transpose(0, 1)  # (B, T_codes, K)
            index = distances.argmin(dim=-1)  # (B, T_codes)
            residual = residual - F.embedding(index, codebook)
            codes.append(index)
        return torch.stack(codes, dim=1)  # (B, S, T_codes), the layout sovits_decoder takes


def _cpu_copy(module: nn.Module) -> nn.Module:
    """The module itself on the CPU, or a CPU copy of it: the caller's model is not moved."""
    return module if next(module.parameters()).device.type == "cpu" else copy.deepcopy(module).cpu()


def _t2s_example_inputs(t2s: Text2SemanticModel, generator: torch.Generator) -> dict[str, torch.Tensor]:
    batch, text_len = len(EXAMPLE_TEXT_LENGTHS), max(EXAMPLE_TEXT_LENGTHS)
    lengths = torch.tensor(EXAMPLE_TEXT_LENGTHS)
    ids = torch.randint(1, t2s.config.phoneme_vocab_size, (batch, text_len), generator=generator)
    ids = ids * (torch.arange(text_len) < lengths.unsqueeze(1))  # (B, T_text), padded with 0
    return {
        "phoneme_ids": ids,
        "bert_features": torch.randn(batch, t2s.config.bert_feature_dim, text_len, generator=generator),
        "text_lengths": lengths,
        "prompt_tokens": torch.randint(0, t2s.config.eos_id, (batch, EXAMPLE_PROMPT_TOKENS), generator=generator),
    }


def t2s_contracts(t2s: Text2SemanticModel, max_len: int = DEFAULT_MAX_LEN) -> dict[str, GraphContract]:
    """The prefill and decode-step graphs of a T2S model; the decode step's example cache is the
    prefill's, cut to a length bucket, with a few generated positions written."""
    t2s = _cpu_copy(t2s).eval()
    generator = torch.Generator().manual_seed(0)
    prefill = T2SPrefill(t2s, max_len).eval()
    prefill_inputs = _t2s_example_inputs(t2s, generator)
    with torch.no_grad():
        _, key_cache, value_cache, cache_lengths = prefill(*prefill_inputs.values())
    cut = min(EXAMPLE_CACHE_POSITIONS, max_len)
    key_cache, value_cache = key_cache[:, :, :, :cut].clone(), value_cache[:, :, :, :cut].clone()
    # Stand-ins for EXAMPLE_GENERATED decoded positions, and garbage past them that must stay unread.
    for cache in (key_cache, value_cache):
        generated = torch.randn(cache[:, :, :, :EXAMPLE_GENERATED].shape, generator=generator)
        for row, length in enumerate(cache_lengths.tolist()):
            cache[:, row, :, length:length + EXAMPLE_GENERATED] = generated[:, row]
            cache[:, row, :, length + EXAMPLE_GENERATED:] = 1e3
    batch = len(EXAMPLE_TEXT_LENGTHS)
    decode_inputs = {
        "token": torch.randint(0, t2s.config.eos_id, (batch, 1), generator=generator),
        "audio_position": torch.full((batch,), EXAMPLE_PROMPT_TOKENS + EXAMPLE_GENERATED),
        "key_cache": key_cache,
        "value_cache": value_cache,
        "cache_lengths": cache_lengths + EXAMPLE_GENERATED,
    }
    cache_axes = {1: "batch_size", 3: "cache_positions"}
    return {
        PREFILL: GraphContract(
            module=prefill, example_inputs=prefill_inputs,
            output_names=("logits", "key_cache", "value_cache", "cache_lengths"),
            input_axes={"phoneme_ids": {0: "batch_size", 1: "phonemes"},
                        "bert_features": {0: "batch_size", 2: "phonemes"},
                        "text_lengths": {0: "batch_size"},
                        "prompt_tokens": {0: "batch_size", 1: "prompt_tokens"}},
            output_axes={"logits": {0: "batch_size"}, "key_cache": {1: "batch_size"},
                         "value_cache": {1: "batch_size"}, "cache_lengths": {0: "batch_size"}},
            postprocess=refuse_dynamic_ops,
        ),
        DECODE_STEP: GraphContract(
            module=T2SDecodeStep(t2s, max_len).eval(), example_inputs=decode_inputs,
            output_names=("logits", "new_keys", "new_values"),
            input_axes={"token": {0: "batch_size"}, "audio_position": {0: "batch_size"},
                        "key_cache": cache_axes, "value_cache": cache_axes, "cache_lengths": {0: "batch_size"}},
            output_axes={"logits": {0: "batch_size"}, "new_keys": {1: "batch_size"}, "new_values": {1: "batch_size"}},
            postprocess=refuse_dynamic_ops,
        ),
    }


def sovits_contracts(sovits: SovitsSynthesizer) -> dict[str, GraphContract]:
    """The SoVITS decoder, reference encoder and semantic-code encoder graphs."""
    sovits = _cpu_copy(sovits).eval()
    config = sovits.config
    generator = torch.Generator().manual_seed(1)
    batch, n_codes = len(EXAMPLE_CODES), max(EXAMPLE_CODES)
    n_phonemes = max(EXAMPLE_TARGET_PHONEMES)
    code_lengths, phoneme_lengths = torch.tensor(EXAMPLE_CODES), torch.tensor(EXAMPLE_TARGET_PHONEMES)
    codes = torch.randint(0, config.codebook_size, (batch, 1, n_codes), generator=generator)
    phoneme_ids = torch.randint(1, config.phoneme_vocab_size, (batch, n_phonemes), generator=generator)
    reference = torch.rand(batch, config.spec_channels, EXAMPLE_REFERENCE_FRAMES, generator=generator)
    with torch.no_grad():
        ge = sovits.reference_embedding([reference])  # (B, gin, 1)
    decoder_inputs = {
        "codes": codes * (torch.arange(n_codes) < code_lengths.unsqueeze(1)).unsqueeze(1),
        "code_lengths": code_lengths,
        "phoneme_ids": phoneme_ids * (torch.arange(n_phonemes) < phoneme_lengths.unsqueeze(1)),
        "phoneme_lengths": phoneme_lengths,
        "ge": ge,
        "noise": torch.randn(batch, config.inter_channels, 2 * n_codes, generator=generator),
        "noise_scale": torch.tensor([0.5]),  # GptSovitsSampling's default
    }
    ssl = torch.randn(batch, config.ssl_dim, EXAMPLE_SSL_FRAMES, generator=generator)
    return {
        SOVITS_DECODER: GraphContract(
            module=SovitsDecoder(sovits).eval(), example_inputs=decoder_inputs, output_names=("audio",),
            input_axes={"codes": {0: "batch_size", 2: "codes"}, "code_lengths": {0: "batch_size"},
                        "phoneme_ids": {0: "batch_size", 1: "phonemes"}, "phoneme_lengths": {0: "batch_size"},
                        "ge": {0: "batch_size"}, "noise": {0: "batch_size", 2: "latent_frames"}},
            output_axes={"audio": {0: "batch_size", 2: "samples"}},
            audio_output="audio", postprocess=refuse_dynamic_ops,
        ),
        REFERENCE_ENCODER: GraphContract(
            module=ReferenceEncoder(sovits).eval(), example_inputs={"reference_spectrogram": reference},
            output_names=("ge",), input_axes={"reference_spectrogram": {0: "batch_size", 2: "reference_frames"}},
            output_axes={"ge": {0: "batch_size"}}, postprocess=refuse_dynamic_ops,
        ),
        RVQ_ENCODE: GraphContract(
            module=MatMulCodebookEncoder(sovits).eval(), example_inputs={"ssl_features": ssl},
            output_names=("codes",), input_axes={"ssl_features": {0: "batch_size", 2: "ssl_frames"}},
            output_axes={"codes": {0: "batch_size", 2: "codes"}}, postprocess=_require_codebook_search,
            rewrites=("rvq",),
        ),
    }


def graph_contracts(voice, max_len: int = DEFAULT_MAX_LEN) -> dict[str, GraphContract]:
    """Every graph of a GptSovitsVoice (its ``t2s`` and ``sovits`` parts), by name (GRAPH_NAMES)."""
    for part in ("t2s", "sovits"):
        if not hasattr(voice, part):
            raise TypeError(f"a GPT-SoVITS graph contract needs a voice with a {part!r} part, "
                            f"got {type(voice).__name__}")
    return {**t2s_contracts(voice.t2s, max_len), **sovits_contracts(voice.sovits)}
