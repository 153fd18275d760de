"""EmotiVoice's acoustic model (PromptTTS on a JETS/FastSpeech2 body): phoneme ids, a speaker row and
two 768-d BERT embeddings (style prompt, content text) in, mel frames and integer durations out.

Submodule names follow the released checkpoint (``am.*`` keys of ``g_00140000``), so its state dict
loads without renaming; the training-only alignment module is not built (models/emotivoice/checkpoints.py
drops its keys by name).

Two batch behaviours, chosen per call with ``masked``:

* ``masked=False`` is the official computation: the encoder masks attention keys but its
  convolutional feed-forward layers and the predictors' later layers read padding, and the decoder
  runs with no mask at all, so a padded row differs from its single run (the fixture's batch case:
  54 frames against 53).
* ``masked=True`` (what our synthesis uses) zeroes padding in front of every convolution and masks
  attention keys in the decoder too, so each row equals its single-utterance result. This
  deliberately differs from official batching; at batch 1 both are the same computation.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.emotivoice.config import GeneratorConfig

LAYER_NORM_EPS = 1e-12  # every LayerNorm of the released acoustic model
FFN_WIDTH_FACTOR = 4  # feed-forward inner width = 4 x hidden, fixed in the official code
GAUSSIAN_DELTA = 0.1  # Gaussian upsampling's sharpness, fixed in the official code


def _zero_padding(x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """x (B, T, C) with the rows' padded steps zeroed; unchanged where ``valid`` is None."""
    return x if valid is None else x * valid.unsqueeze(-1).to(x.dtype)


class ScaledPositionalEncoding(nn.Module):
    """x + alpha * sinusoid table (sin at even channels, cos at odd); the input is not scaled by sqrt(d).

    The table is computed for each call's length (the same float32 values upstream precomputes for
    5000 positions): no length limit, and nothing data dependent for the exporter to guard on."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.alpha = nn.Parameter(torch.tensor(1.0))
        frequency = torch.exp(torch.arange(0, channels, 2, dtype=torch.float32) * -(math.log(10000.0) / channels))
        self.register_buffer("frequency", frequency, persistent=False)  # (C/2,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        position = torch.arange(x.size(1), device=x.device, dtype=torch.float32).unsqueeze(1)  # (T, 1)
        angles = position * self.frequency.float()  # (T, C/2)
        table = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)  # (T, C): sin, cos interleaved
        return x + self.alpha * table.to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, channels: int, heads: int):
        super().__init__()
        if channels % heads:
            raise ValueError(f"hidden width {channels} is not divisible by {heads} heads")
        self.heads = heads
        self.linear_q = nn.Linear(channels, channels)
        self.linear_k = nn.Linear(channels, channels)
        self.linear_v = nn.Linear(channels, channels)
        self.linear_out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
        batch, steps, channels = x.shape
        def split(t):  # (B, T, C) -> (B, heads, T, C / heads)
            return t.view(batch, steps, self.heads, channels // self.heads).transpose(1, 2)
        q, k, v = split(self.linear_q(x)), split(self.linear_k(x)), split(self.linear_v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(channels // self.heads)  # (B, heads, T, T)
        # Written out rather than F.scaled_dot_product_attention: its mask broadcast guards on the
        # frame count, which the exporter must keep dynamic. Masked keys get weight exactly 0.
        if key_valid is not None:
            masked = ~key_valid[:, None, None, :]  # (B, 1, 1, T)
            scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
            weights = torch.softmax(scores, dim=-1).masked_fill(masked, 0.0)
        else:
            weights = torch.softmax(scores, dim=-1)
        attended = torch.matmul(weights, v)  # (B, heads, T, C / heads)
        return self.linear_out(attended.transpose(1, 2).reshape(batch, steps, channels))


class ConvFeedForward(nn.Module):
    """Conv1d(k) -> GELU (erf) -> Conv1d(k), 'same' padding."""

    def __init__(self, channels: int, inner: int, kernel_size: int):
        super().__init__()
        self.w_1 = nn.Conv1d(channels, inner, kernel_size, padding=(kernel_size - 1) // 2)
        self.w_2 = nn.Conv1d(inner, channels, kernel_size, padding=(kernel_size - 1) // 2)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:  # (B, T, C)
        hidden = F.gelu(self.w_1(_zero_padding(x, valid).transpose(1, 2))).transpose(1, 2)  # (B, T, inner)
        return self.w_2(_zero_padding(hidden, valid).transpose(1, 2)).transpose(1, 2)


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and convolutional feed-forward, each with a residual."""

    def __init__(self, channels: int, heads: int, kernel_size: int):
        super().__init__()
        self.self_attn = SelfAttention(channels, heads)
        self.feed_forward = ConvFeedForward(channels, FFN_WIDTH_FACTOR * channels, kernel_size)
        self.norm1 = nn.LayerNorm(channels, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(channels, eps=LAYER_NORM_EPS)

    def forward(self, x, key_valid, conv_valid):
        x = x + self.self_attn(self.norm1(x), key_valid)
        return x + self.feed_forward(self.norm2(x), conv_valid)


class TransformerStack(nn.Module):
    """The encoder, and the decoder (same layout over frames instead of phonemes)."""

    def __init__(self, channels: int, heads: int, layers: int, kernel_size: int):
        super().__init__()
        self.embed = nn.Sequential(ScaledPositionalEncoding(channels))
        self.encoders = nn.ModuleList(TransformerBlock(channels, heads, kernel_size) for _ in range(layers))
        self.after_norm = nn.LayerNorm(channels, eps=LAYER_NORM_EPS)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor | None = None,
                conv_valid: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C); ``key_valid`` (B, T) masks attention keys, ``conv_valid`` zeroes padding before
        each convolution; None leaves that step unmasked."""
        x = self.embed(x)
        for block in self.encoders:
            x = block(x, key_valid, conv_valid)
        return self.after_norm(x)


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, T) tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class VariancePredictor(nn.Module):
    """Conv1d -> ReLU -> LayerNorm (x n_layers) -> Linear(1): one value per phoneme. The duration,
    pitch and energy predictors share this layout (``conv.<i>.0`` conv, ``conv.<i>.2`` norm)."""

    def __init__(self, in_channels: int, layers: int, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.ModuleList(
            nn.Sequential(nn.Conv1d(in_channels if i == 0 else channels, channels, kernel_size,
                                    padding=(kernel_size - 1) // 2),
                          nn.ReLU(), ChannelLayerNorm(channels, eps=LAYER_NORM_EPS), nn.Dropout(0.0))
            for i in range(layers))
        self.linear = nn.Linear(channels, 1)

    def forward(self, x: torch.Tensor, valid: torch.Tensor, mask_every_layer: bool) -> torch.Tensor:
        """x (B, T, C) -> (B, T); padded phonemes read 0 in and out (official), and between layers
        too when ``mask_every_layer``."""
        gate = valid.unsqueeze(1).to(x.dtype)  # (B, 1, T)
        hidden = _zero_padding(x, valid).transpose(1, 2)  # (B, C, T)
        for index, layer in enumerate(self.conv):
            if mask_every_layer and index > 0:
                hidden = hidden * gate
            hidden = layer(hidden)
        return _zero_padding(self.linear(hidden.transpose(1, 2)), valid).squeeze(-1)  # (B, T)


class GaussianUpsampling(nn.Module):
    """Phoneme states to frames: frame t takes softmax_n(-delta (t - c_n)^2) over the row's phonemes,
    c_n the centre of phoneme n (cumulative durations minus half its own). Elementwise ops,
    a cumsum, a softmax and one matmul: nothing TensorRT lacks."""

    def forward(self, hidden: torch.Tensor, durations: torch.Tensor, text_valid: torch.Tensor,
                frames: int) -> torch.Tensor:
        """hidden (B, T_text, C), durations (B, T_text) int, text_valid (B, T_text) -> (B, frames, C)."""
        durations = durations.to(torch.float32)
        centres = torch.cumsum(durations, dim=-1) - durations / 2  # (B, T_text)
        t = torch.arange(frames, device=hidden.device, dtype=torch.float32)  # (T_feats,)
        energy = -GAUSSIAN_DELTA * (t[None, :, None] - centres[:, None, :]) ** 2  # (B, T_feats, T_text)
        energy = energy.masked_fill(~text_valid[:, None, :], float("-inf"))
        weights = torch.softmax(energy, dim=-1).to(hidden.dtype)
        return torch.matmul(weights, hidden)  # (B, T_feats, C)


def lengths_to_valid(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """(B,) lengths -> (B, steps) bool, True on a row's real steps."""
    return torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]


class AcousticModel(nn.Module):
    """``am`` of the released generator: text, speaker and two prompt embeddings -> mel frames."""

    def __init__(self, config: GeneratorConfig):
        super().__init__()
        self.config = config
        hidden = config.encoder_n_hidden
        self.src_word_emb = nn.Embedding(config.n_vocab, hidden)
        self.spk_tokenizer = nn.Embedding(config.n_speaker, hidden)  # yaml speaker_embed_dim is ignored upstream too
        self.encoder = TransformerStack(hidden, config.encoder_n_heads, config.encoder_n_layers,
                                        config.encoder_kernel_size)
        # [encoder output, speaker, style, content] -> hidden
        self.embed_projection1 = nn.Linear(2 * hidden + 2 * config.bert_embedding, hidden)
        self.duration_predictor = VariancePredictor(hidden, config.duration_n_layers, config.variance_n_hidden,
                                                    config.duration_kernel_size)
        self.pitch_predictor = VariancePredictor(hidden, config.variance_n_layers, config.variance_n_hidden,
                                                 config.variance_kernel_size)
        # The official energy predictor is 2 layers of kernel 3 whatever the yaml says.
        self.energy_predictor = VariancePredictor(hidden, 2, config.variance_n_hidden, 3)
        embed_kernel = config.variance_embed_kernel_size
        self.pitch_embed = nn.Sequential(nn.Conv1d(1, hidden, embed_kernel, padding=(embed_kernel - 1) // 2),
                                         nn.Dropout(0.0))
        self.energy_embed = nn.Sequential(nn.Conv1d(1, hidden, embed_kernel, padding=(embed_kernel - 1) // 2),
                                          nn.Dropout(0.0))
        self.length_regulator = GaussianUpsampling()
        self.decoder = TransformerStack(config.decoder_n_hidden, config.decoder_n_heads, config.decoder_n_layers,
                                        config.decoder_kernel_size)
        self.to_mel = nn.Linear(config.decoder_n_hidden, config.n_mels)

    def forward(self, phoneme_ids: torch.Tensor, phoneme_lengths: torch.Tensor, speaker_ids: torch.Tensor,
                style_embedding: torch.Tensor, content_embedding: torch.Tensor, masked: bool = True,
                length_scale: float = 1.0) -> dict:
        """phoneme_ids (B, T_text), phoneme_lengths (B,), speaker_ids (B,), style/content (B, 768) ->
        ``mel`` (B, T_feats, n_mels), ``durations`` (B, T_text) int64 as predicted, ``used_durations``
        (what the upsampler spread the phonemes over), ``frame_lengths`` (B,), ``pitch`` and
        ``energy`` (B, T_text). See the module docstring for ``masked``. ``length_scale`` > 1
        speaks slower (durations scaled and rounded); the official inference path has no pace
        control (its ``alpha`` never reaches the upsampler), so 1 is the official computation."""
        out = self.predict_variance(phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding,
                                    masked, length_scale)
        # The frame count is data dependent; stated as an unbacked symbol it stays dynamic in export.
        frames = out["frame_lengths"].max().item()
        torch._check(frames >= 1)
        out["mel"] = self.frames_to_mel(out["hidden"], out["used_durations"], phoneme_lengths, frames, masked)
        del out["hidden"]
        return out

    def predict_variance(self, phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding,
                         masked: bool = True, length_scale: float | torch.Tensor = 1.0) -> dict:
        """The text side, up to the frame count (fixed shapes: one CUDA graph per text length):
        ``hidden`` (B, T_text, h) with pitch and energy embedded, the durations, ``frame_lengths``."""
        batch, text_steps = phoneme_ids.shape
        text_valid = lengths_to_valid(phoneme_lengths, text_steps)  # (B, T_text)
        conv_valid = text_valid if masked else None
        x = self.encoder(self.src_word_emb(phoneme_ids), text_valid, conv_valid)  # (B, T_text, h)
        speaker = self.spk_tokenizer(speaker_ids)  # (B, h)
        conditions = torch.cat([speaker, style_embedding.to(x.dtype), content_embedding.to(x.dtype)], dim=-1)
        x = self.embed_projection1(torch.cat([x, conditions.unsqueeze(1).expand(batch, text_steps, -1)], dim=-1))

        pitch = self.pitch_predictor(x, text_valid, masked)  # (B, T_text)
        energy = self.energy_predictor(x, text_valid, masked)
        log_durations = self.duration_predictor(x, text_valid, masked)  # (B, T_text)
        # Integer frames: round(exp(x) - 1), half to even as torch.round, never negative.
        durations = torch.clamp(torch.round(log_durations.float().exp() - 1.0), min=0).long()
        durations = durations * text_valid
        x = x + self.pitch_embed(pitch.unsqueeze(1)).transpose(1, 2) + self.energy_embed(energy.unsqueeze(1)).transpose(1, 2)

        # A tensor scale (B, 1) always paces (round(d * 1.0) == d): the engine's captured text stage
        # then serves every speed with one graph.
        if isinstance(length_scale, torch.Tensor) or length_scale != 1.0:
            paced = torch.round(durations * length_scale).long()
        else:
            paced = durations
        # A row predicted silent throughout speaks one frame per phoneme instead (as upstream at B=1).
        silent = (paced.sum(dim=-1, keepdim=True) == 0) & text_valid
        used_durations = torch.where(silent, torch.ones_like(paced), paced)
        return {"hidden": x, "durations": durations, "used_durations": used_durations,
                "frame_lengths": used_durations.sum(dim=-1), "pitch": pitch, "energy": energy}

    def frames_to_mel(self, hidden: torch.Tensor, used_durations: torch.Tensor, phoneme_lengths: torch.Tensor,
                      frames: int, masked: bool = True) -> torch.Tensor:
        """The frame side: Gaussian upsampling to ``frames`` frames, the decoder, the mel projection
        -> (B, frames, n_mels) (fixed shapes for a given frame count)."""
        text_valid = lengths_to_valid(phoneme_lengths, hidden.shape[1])
        x = self.length_regulator(hidden, used_durations, text_valid, frames)  # (B, T_feats, h)
        frame_valid = lengths_to_valid(used_durations.sum(dim=-1), frames) if masked else None
        return self.to_mel(self.decoder(x, frame_valid, frame_valid))  # (B, T_feats, n_mels)
