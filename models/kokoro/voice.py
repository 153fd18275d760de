"""A Kokoro voice behind the common TTSModel interface: the model, a frontend and one style pack.

    voice = FAMILIES["kokoro"].load_teacher("jf_alpha", DEFAULT_CACHE_DIR)
    result = voice.synthesize(SynthesisRequest.from_utterances(voice.text_to_utterances("今日は。")))

A request runs as one padded batch: each sentence takes the style row of its phoneme count, and
the model masks every length-dependent step (packed LSTMs, AdaIN statistics over an item's own
frames, per-item STFT padding), so a sentence sounds the same in any batch as alone, as the
official KModel runs it. The SineGen noise is drawn from ``sampling.seed`` per sentence
(KokoroSampling.source_noise); ``KokoroSampling(noise_scale=0)`` synthesises without it, as the
shipped int8 graph does.
"""
from __future__ import annotations

import torch
from torch import nn

from models.interface import SynthesisRequest, SynthesisResult, Utterance
from models.kokoro.capabilities import CAPABILITIES, FAMILY_NAME, PART_ROLES
from models.kokoro.decoder import SourceNoise
from models.kokoro.frontend import KokoroFrontend
from models.kokoro.model import KokoroModel
from models.kokoro.sampling import KokoroSampling


class KokoroVoice(nn.Module):
    """A module, so that the network and its voice's style pack move, count and copy together."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = KokoroSampling

    def __init__(self, model: KokoroModel, frontend: KokoroFrontend, style_pack: torch.Tensor, voice_name: str):
        expected = 2 * model.config.style_dim
        if style_pack.dim() != 2 or style_pack.shape[1] != expected:
            raise ValueError(f"style pack of voice {voice_name!r} has shape {tuple(style_pack.shape)}; "
                             f"expected (rows, {expected})")
        super().__init__()
        self.model = model.eval()
        self.frontend = frontend
        # (rows, 2S): row n - 1 styles a sentence of n phonemes
        self.register_buffer("style_pack", style_pack.float(), persistent=False)
        self.voice_name = voice_name
        self.sample_rate_hz = model.config.sample_rate_hz
        self.hop_length = model.config.samples_per_frame

    def text_to_utterances(self, text: str) -> list[Utterance]:
        return self.frontend(text)

    def style_row(self, phoneme_count: int) -> torch.Tensor:
        """(1, 2S) style for a sentence of ``phoneme_count`` phonemes (pads excluded)."""
        row = min(max(phoneme_count, 1), self.style_pack.shape[0]) - 1
        return self.style_pack[row].unsqueeze(0)

    def style_rows(self, phoneme_lengths: torch.Tensor) -> torch.Tensor:
        """(B, 2S) styles of a batch; ``phoneme_lengths`` (B,) count the two boundary pads."""
        return torch.cat([self.style_row(int(length) - 2) for length in phoneme_lengths])

    @torch.no_grad()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        self.capabilities.check(request.voice, self.family)
        sampling = KokoroSampling.of(request.sampling)
        device = next(self.model.parameters()).device
        lengths = request.phoneme_lengths.to(device)
        input_ids = request.phoneme_ids[:, : int(lengths.max())].to(device)  # (B, T) with the 0 pads
        style = self.style_rows(request.phoneme_lengths).to(device)  # (B, 2S)
        prediction = self.model.predict(input_ids, style, 1.0 / sampling.length_scale, lengths=lengths)
        noise = None
        if sampling.noise_scale != 0:
            drawn = sampling.source_noise(request.phoneme_lengths, self.hop_length)
            noise = SourceNoise(drawn.initial_phase.to(device), drawn.additive.to(device))
        audio = self.model.decode(prediction, style, noise).float().cpu()  # (B, T_audio)
        durations = torch.zeros(request.phoneme_ids.shape, dtype=torch.long)  # (B, T_text)
        durations[:, : input_ids.shape[1]] = prediction["frames_per_token"].cpu()
        return SynthesisResult(audio=audio, audio_lengths=prediction["frame_lengths"].cpu() * self.hop_length,
                               sample_rate_hz=self.sample_rate_hz, durations=durations)

    def parts(self) -> dict[str, nn.Module]:
        return {role: getattr(self.model, role) for role in PART_ROLES}

    def replace_part(self, role: str, module: nn.Module) -> None:
        if role not in PART_ROLES:
            raise ValueError(f"Kokoro has no part {role!r}; its parts are {list(PART_ROLES)}")
        setattr(self.model, role, module)
