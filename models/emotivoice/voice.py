"""An EmotiVoice voice behind the common TTSModel interface: front end, prompt embeddings, the
acoustic model and the vocoder.

    voice = load_voice(EmotiVoiceFiles.parse("random"))       # full-size random weights (manifests)
    request = SynthesisRequest.from_utterances(voice.text_to_utterances("今天天气很好。"),
                                               voice=VoiceCondition(emotion="开心"))
    voice.synthesize(request).waveforms()

Batches are masked (models/emotivoice/acoustic.py): each row equals its single run, which
deliberately differs from the official batch behaviour (padding leaks there).

The content embedding is the style encoder's reading of the sentence itself, so a request needs
each row's text: rows whose ids came from ``text_to_utterances`` use that sentence; rows built from
bare ids use their phoneme symbols joined by spaces.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from torch.nn.utils import parametrize

from models.emotivoice.capabilities import CAPABILITIES, FAMILY_NAME, PART_ROLES
from models.emotivoice.frontend import EmotiVoiceFrontend
from models.emotivoice.generator import EmotiVoiceGenerator
from models.emotivoice.prompts import DEFAULT_PROMPT, EMOTION_PROMPTS, PromptEncoder
from models.interface import SynthesisRequest, SynthesisResult, Utterance
from models.sampling import Sampling

REMEMBERED_SENTENCES = 65536  # phoneme ids -> sentence text, for content embeddings


class EmotiVoiceVoice(nn.Module):
    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = Sampling  # deterministic: no noise anywhere in inference

    def __init__(self, generator: EmotiVoiceGenerator, prompt_encoder: PromptEncoder,
                 frontend: EmotiVoiceFrontend, speakers: list[str]):
        super().__init__()
        if len(speakers) != generator.config.n_speaker:
            raise ValueError(f"{len(speakers)} speaker names for a speaker table of {generator.config.n_speaker} rows")
        if len(frontend.tokens) != generator.config.n_vocab:
            raise ValueError(f"tokenlist of {len(frontend.tokens)} symbols for a phoneme table of "
                             f"{generator.config.n_vocab} rows: the tokenlist is not this checkpoint's")
        if prompt_encoder.model.embedding_dim != generator.config.bert_embedding:
            raise ValueError(f"style encoder width {prompt_encoder.model.embedding_dim} != the generator's "
                             f"bert_embedding {generator.config.bert_embedding}")
        # Weight norm folded once (the same outputs): synthesis would otherwise recompute g * v / |v|
        # on every call, and the stages that retype modules (ModelOpt's quantizers, Torch-Pruning)
        # take plain convolutions.
        if any(parametrize.is_parametrized(module) for module in generator.modules()):
            generator = generator.inference_copy()
        self.generator = generator
        self.style_encoder = prompt_encoder.model
        self.prompts = prompt_encoder
        self.frontend = frontend
        self.speakers = list(speakers)
        self.sample_rate_hz = generator.config.sample_rate_hz
        self._sentences: OrderedDict[tuple[int, ...], str] = OrderedDict()

    @property
    def hop_length(self) -> int:
        return self.generator.config.upsample_factor

    @property
    def device(self) -> torch.device:
        return next(self.generator.parameters()).device

    def speaker_index(self, speaker: str | int) -> int:
        """A speaker table row from its name in ``speaker2`` ('8051') or its row number."""
        if isinstance(speaker, str) and speaker in self.speakers:
            return self.speakers.index(speaker)
        if str(speaker).isdigit() and int(speaker) < len(self.speakers):
            return int(speaker)
        raise ValueError(f"speaker {speaker!r} is neither a name in speaker2 (e.g. {self.speakers[:3]}) "
                         f"nor a row below {len(self.speakers)}")

    def text_to_utterances(self, text: str) -> list[Utterance]:
        utterances = self.frontend(text)
        for utterance in utterances:
            self._sentences[utterance.phoneme_ids] = utterance.text
            self._sentences.move_to_end(utterance.phoneme_ids)
        while len(self._sentences) > REMEMBERED_SENTENCES:
            self._sentences.popitem(last=False)
        return utterances

    def parts(self) -> dict[str, nn.Module]:
        return {"style_encoder": self.style_encoder, "acoustic": self.generator.am, "vocoder": self.generator.generator}

    def replace_part(self, role: str, module: nn.Module) -> None:
        """Swap one part for a module with its call signature; a new style encoder empties the
        prompt cache, whose embeddings the old one made."""
        if role == "style_encoder":
            self.style_encoder = module
            self.prompts.model = module
            self.prompts.clear()
        elif role == "acoustic":
            self.generator.am = module
        elif role == "vocoder":
            self.generator.generator = module
        else:
            raise ValueError(f"EmotiVoice has no part {role!r}; its parts are {list(PART_ROLES)}")

    def sentence_text(self, phoneme_ids: tuple[int, ...]) -> str:
        """The text of a sentence's ids for its content embedding (module docstring)."""
        known = self._sentences.get(tuple(phoneme_ids))
        return known if known is not None else " ".join(self.frontend.tokens[i] for i in phoneme_ids)

    def sentence_texts(self, request: SynthesisRequest) -> list[str]:
        """Each row's text for its content embedding."""
        # One conversion to lists, not a Python int per tensor element: 17.5 against 0.6 ms for a batch of 512 on
        # this project's CPU, on the server's model thread.
        return [self.sentence_text(tuple(row[:length]))
                for row, length in zip(request.phoneme_ids.tolist(), request.phoneme_lengths.tolist())]

    def style_embeddings(self, request: SynthesisRequest) -> torch.Tensor:
        """(B, H): the request's style tensor, or its prompt / emotion (default 普通) through the cache."""
        batch = request.phoneme_ids.shape[0]
        voice = request.voice
        if voice is not None and voice.style is not None:
            if voice.prompt is not None or voice.emotion is not None:
                raise ValueError("give a style tensor or a prompt / emotion, not both")
            return voice.style.float().expand(batch, -1)
        if voice is not None and voice.prompt is not None and voice.emotion is not None:
            raise ValueError(f"give a prompt ({voice.prompt!r}) or an emotion ({voice.emotion!r}), not both")
        prompt = DEFAULT_PROMPT
        if voice is not None and voice.emotion is not None:
            if voice.emotion not in EMOTION_PROMPTS:
                raise ValueError(f"emotion {voice.emotion!r} is unknown; use one of {sorted(EMOTION_PROMPTS)} "
                                 "or a free-text prompt")
            prompt = EMOTION_PROMPTS[voice.emotion]
        elif voice is not None and voice.prompt is not None:
            prompt = voice.prompt
        return self.prompts.embed([prompt]).expand(batch, -1)

    def _speaker_ids(self, request: SynthesisRequest) -> torch.Tensor:
        batch = request.phoneme_ids.shape[0]
        if request.voice is None or request.voice.speaker_id is None:
            return torch.zeros(batch, dtype=torch.long)
        speaker_ids = request.voice.speaker_id.long().reshape(-1).expand(batch)
        if int(speaker_ids.min()) < 0 or int(speaker_ids.max()) >= len(self.speakers):
            raise ValueError(f"speaker_id {speaker_ids.tolist()} outside this voice's {len(self.speakers)} speakers")
        return speaker_ids

    def generator_inputs(self, request: SynthesisRequest, device: torch.device) -> tuple[torch.Tensor, ...]:
        """What the generator reads for ``request`` (its voice condition checked), on ``device``: ids (B, T),
        lengths (B,), speaker rows (B,), style and content embeddings (B, H) through the prompt cache."""
        self.capabilities.check(request.voice, self.family)
        style = self.style_embeddings(request)
        content = self.prompts.embed(self.sentence_texts(request))
        return tuple(t.to(device) for t in (request.phoneme_ids, request.phoneme_lengths, self._speaker_ids(request),
                                            style, content))

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        sampling = Sampling.of(request.sampling)
        out = self.generator(*self.generator_inputs(request, self.device), masked=True,
                             length_scale=sampling.length_scale)
        return SynthesisResult(out["audio"].float().cpu(), out["audio_lengths"].cpu(), self.sample_rate_hz,
                               durations=out["used_durations"].cpu())
