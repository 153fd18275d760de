"""A GPT-SoVITS v2 voice behind the family-neutral interface: text -> phones, a zero-shot prompt from
a reference clip and its transcript, semantic tokens from the text-to-semantic transformer, audio
from the SoVITS synthesizer at 32 kHz.

    voice = GptSovitsVoice.from_files(gpt="s1.ckpt", sovits="s2G.pth", hubert="chinese-hubert-base",
                                      bert="chinese-roberta-wwm-ext-large", reference=clip)
    result = voice.synthesize(SynthesisRequest.from_utterances(voice.text_to_utterances("Hello."),
                                                               sampling=GptSovitsSampling(seed=0)))

How one sentence is made (the official web UI's order): the reference clip at 16 kHz (plus 0.3 s of
silence) -> HuBERT -> ``ssl_proj`` -> codebook -> the prompt's semantic tokens; the transcript's phones
and the target's phones, with their BERT features (Chinese text only; zeros otherwise), prefix the
decode; the tokens after the prompt, with the target's phones and the clip's spectrogram, go through
SoVITS. A prompt is computed once per clip and kept by content hash.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
from collections import OrderedDict

import numpy as np
import torch
from scipy.signal import resample_poly
from torch import nn

from models.gpt_sovits.capabilities import CAPABILITIES, FAMILY_NAME, GptSovitsSampling
from models.gpt_sovits.prompt import Prompt, pad_results
from models.gpt_sovits.sovits import SovitsSynthesizer
from models.gpt_sovits.spectrogram import reference_spectrogram
from models.gpt_sovits.ssl_encoders import (
    SSL_SAMPLE_RATE_HZ,
    bert_phone_features,
    ssl_features,
)
from models.gpt_sovits.step_decoder import GptSovitsStepDecoder
from models.gpt_sovits.streaming import (
    DEFAULT_CHUNKING,
    ChunkSettings,
    TokenAudioStream,
    frame_noise,
)
from models.gpt_sovits.t2s import Text2SemanticModel
from models.gpt_sovits.t2s_decode import decode
from models.gpt_sovits.text import LanguageRun, PhonemizedSentence, text_to_phones
from models.gpt_sovits.window_graphs import WindowGraphs, noise_frames_bound
from models.interface import (
    ReferenceClip,
    SynthesisRequest,
    SynthesisResult,
    UnspeakableTextError,
    Utterance,
)
from models.sampling import Sampling

REFERENCE_SECONDS = (3.0, 10.0)  # the official web UI refuses clips outside this range
PROMPT_TAIL_SILENCE_S = 0.3  # appended to the clip before HuBERT, as the web UI does
PROMPT_CACHE_ENTRIES = 64
BERT_DIM = 1024
PHRASE_CACHE_ENTRIES = 4096
# A sentence under a voice's ``tokens_per_phone`` still decodes 1 s (25 tokens): a word or two
# spoken alone takes about that long.
MIN_CAPPED_TOKENS = 25


def _resample(waveform: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    if from_hz == to_hz:
        return waveform
    divisor = math.gcd(from_hz, to_hz)
    return resample_poly(waveform, to_hz // divisor, from_hz // divisor).astype(np.float32)


def clip_key(clip: ReferenceClip) -> str:
    """Content hash of a clip and its transcript: equal clips share one prompt."""
    digest = hashlib.sha256(clip.waveform.detach().cpu().numpy().astype(np.float32).tobytes())
    digest.update(f"{clip.sample_rate_hz}|{clip.transcript}".encode())
    return digest.hexdigest()


class GptSovitsVoice(nn.Module):
    """``TTSModel`` of the GPT-SoVITS v2 family (models/interface.py). A module, so that its four
    networks move, count and copy together (``to``, ``parameters``, ``deepcopy``)."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = GptSovitsSampling

    def __init__(self, t2s: Text2SemanticModel, sovits: SovitsSynthesizer, hubert: nn.Module, bert: nn.Module,
                 tokenize, default_reference: ReferenceClip, max_tokens: int, language: str = "auto",
                 tokens_per_phone: float | None = None):
        """``tokenize``: text -> (1, tokens) BERT input ids with [CLS] first and [SEP] last.
        ``max_tokens``: the checkpoint's early stop (50 per second of ``max_sec``), a cap on a
        request's own ``max_tokens``. ``tokens_per_phone``: for weights that never learnt to stop
        (random ones), a sentence's further cap per phone it has (``token_cap``); None for trained
        weights, which stop at their EOS as the official code lets them."""
        super().__init__()
        self.t2s, self.sovits, self.hubert, self.bert = t2s.eval(), sovits.eval(), hubert.eval(), bert.eval()
        self.tokenize = tokenize
        self.default_reference = default_reference
        self.max_tokens = max_tokens
        self.tokens_per_phone = tokens_per_phone
        self.language = language
        self.sample_rate_hz = sovits.config.sample_rate_hz
        self.hop_length = sovits.samples_per_code  # output samples per semantic token
        self._prompts: OrderedDict[str, Prompt] = OrderedDict()
        # Phone ids -> the sentence's language runs: BERT features need a Chinese run's text, and a
        # request carries only ids. Filled by ``text_to_utterances``; ids met without it get the
        # zero features the official front end gives non-Chinese text.
        self._phrases: OrderedDict[tuple[int, ...], tuple[LanguageRun, ...]] = OrderedDict()
        # On CUDA, SoVITS passes run as CUDA graphs (models/gpt_sovits/window_graphs.py), made on
        # first use; ``graph_windows = False`` keeps them eager.
        self.graph_windows = True
        self._window_graphs: WindowGraphs | None = None

    # ----- text
    def text_to_utterances(self, text: str) -> list[Utterance]:
        sentences = text_to_phones(text, self.language)
        if not sentences:
            raise UnspeakableTextError(f"nothing to speak in {text!r}")
        utterances = []
        for sentence in sentences:
            ids = tuple(sentence.phone_ids)
            self._remember(ids, sentence)
            utterances.append(Utterance(sentence.text, tuple(sentence.phones), ids))
        return utterances

    def _remember(self, ids: tuple[int, ...], sentence: PhonemizedSentence) -> None:
        self._phrases[ids] = sentence.runs
        self._phrases.move_to_end(ids)
        while len(self._phrases) > PHRASE_CACHE_ENTRIES:
            self._phrases.popitem(last=False)

    def bert_features(self, phoneme_ids: tuple[int, ...]) -> torch.Tensor:
        """(1024, T) BERT features of a sentence's phones: Chinese runs through BERT, zeros otherwise."""
        runs = self._phrases.get(phoneme_ids)
        if runs is None:
            return torch.zeros(BERT_DIM, len(phoneme_ids))
        features = [bert_phone_features(self.bert, self.tokenize(run.text), run.word2ph) if run.language == "zh"
                    else torch.zeros(BERT_DIM, len(run.phones)) for run in runs]
        return torch.cat(features, dim=1)  # (1024, T)

    # ----- voice
    @torch.inference_mode()
    def prompt_of(self, clip: ReferenceClip) -> Prompt:
        """The clip's prompt, computed once per content hash."""
        key = clip_key(clip)
        if key in self._prompts:
            self._prompts.move_to_end(key)
            return self._prompts[key]
        seconds = clip.waveform.numel() / clip.sample_rate_hz
        if not REFERENCE_SECONDS[0] <= seconds <= REFERENCE_SECONDS[1]:
            raise ValueError(f"a reference clip must last {REFERENCE_SECONDS[0]:g} to {REFERENCE_SECONDS[1]:g} s, "
                             f"got {seconds:.2f} s")
        if not clip.transcript or not clip.transcript.strip():
            raise ValueError("a GPT-SoVITS reference clip needs its transcript (what the clip says)")
        waveform = clip.waveform.detach().cpu().float().numpy()
        at_16k = _resample(waveform, clip.sample_rate_hz, SSL_SAMPLE_RATE_HZ)
        silence = np.zeros(int(PROMPT_TAIL_SILENCE_S * SSL_SAMPLE_RATE_HZ), dtype=np.float32)
        ssl = ssl_features(self.hubert, torch.from_numpy(np.concatenate([at_16k, silence]))[None])  # (1, 768, T)
        tokens = self.sovits.extract_latent(ssl)[0, 0]  # (T_prompt,)
        at_model_rate = torch.from_numpy(_resample(waveform, clip.sample_rate_hz, self.sample_rate_hz))
        spectrogram = reference_spectrogram(at_model_rate[None], self.sovits.config)  # (1, bins, T_spec)
        transcript = self.text_to_utterances(clip.transcript)
        ids = tuple(i for utterance in transcript for i in utterance.phoneme_ids)
        bert = torch.cat([self.bert_features(u.phoneme_ids) for u in transcript], dim=1)  # (1024, T_ref_text)
        prompt = Prompt(tokens.long(), torch.tensor(ids, dtype=torch.long), bert, spectrogram)
        self._prompts[key] = prompt
        while len(self._prompts) > PROMPT_CACHE_ENTRIES:
            self._prompts.popitem(last=False)
        return prompt

    # ----- synthesis
    def token_cap(self, phone_count: int) -> int:
        """The most semantic tokens a sentence of ``phone_count`` phones decodes: the checkpoint's
        early stop, and for weights that never stop, about what a speaker would say for it."""
        if self.tokens_per_phone is None:
            return self.max_tokens
        return min(self.max_tokens, max(MIN_CAPPED_TOKENS, math.ceil(self.tokens_per_phone * phone_count)))

    def sentence_sampling(self, sampling: Sampling, phone_count: int) -> GptSovitsSampling:
        """``sampling`` (a request's) as this family's kind, its max_tokens held to ``token_cap`` of one sentence."""
        sampling, cap = GptSovitsSampling.of(sampling), self.token_cap(phone_count)
        return sampling if sampling.max_tokens <= cap else dataclasses.replace(sampling, max_tokens=cap)

    def decode_input(self, phoneme_ids: tuple[int, ...], prompt: Prompt) -> tuple[torch.Tensor, torch.Tensor]:
        """(phone ids (T,), BERT features (1024, T)) the transformer reads: transcript then target."""
        target = torch.tensor(phoneme_ids, dtype=torch.long)
        return (torch.cat([prompt.phoneme_ids, target]),
                torch.cat([prompt.bert_features, self.bert_features(phoneme_ids)], dim=1))

    def reference_embedding(self, prompt: Prompt) -> torch.Tensor:
        """ge (1, gin, 1): the clip's timbre as SoVITS reads it, on the synthesizer's device and dtype."""
        parameter = next(self.sovits.ref_enc.parameters())
        return self.sovits.reference_embedding([prompt.spectrogram.to(parameter.device, parameter.dtype)])

    @torch.inference_mode()
    def tokens_to_audio(self, tokens: torch.Tensor, phoneme_ids: tuple[int, ...], prompt: Prompt,
                        sampling: GptSovitsSampling, first_token: int = 0,
                        ge: torch.Tensor | None = None) -> torch.Tensor:
        """Semantic tokens (n,) of one sentence -> its waveform (samples,) at 32 kHz. The prior noise
        is drawn from the sentence's seed, so a sentence sounds the same alone or in a batch.
        ``first_token``: where ``tokens`` start in the sentence (a streamed chunk's window), so that
        each latent frame gets the noise one decode of the whole sentence gives it. ``ge``: the
        prompt's ``reference_embedding`` when the caller keeps it (a stream's windows share one)."""
        device = next(self.sovits.parameters()).device
        codes = tokens.reshape(1, 1, -1).to(device, torch.long)  # (1, 1, n)
        target = torch.tensor([phoneme_ids], dtype=torch.long, device=device)  # (1, T_x)
        ge = self.reference_embedding(prompt) if ge is None else ge
        speed = 1.0 / sampling.length_scale
        frames_per_token = self.hop_length // math.prod(self.sovits.config.upsample_rates)
        first_frame = round(first_token * frames_per_token / speed)
        channels, dtype = self.sovits.config.inter_channels, ge.dtype
        if device.type == "cuda" and self.graph_windows:
            frames = noise_frames_bound(codes.shape[-1], frames_per_token, speed)
            noise = (frame_noise(sampling.seed or 0, first_frame, frames, channels) if sampling.noise_scale
                     else torch.zeros(1, channels, frames)).to(device, dtype)  # (1, inter, >= T')
            if self._window_graphs is None:
                self._window_graphs = WindowGraphs()
            audio = self._window_graphs.audio(self.sovits, codes, target, ge, noise, speed, sampling.noise_scale)
            return audio[0, 0].clone()  # the graph's buffer is overwritten by its next replay
        m_p, logs_p, mask = self.sovits.prior(codes, target, ge, speed=speed)
        noise = None
        if sampling.noise_scale != 0:
            noise = frame_noise(sampling.seed or 0, first_frame, m_p.shape[-1], channels).to(m_p)  # (1, inter, T')
        audio = self.sovits.synthesize_latent(m_p, logs_p, mask, ge, noise, sampling.noise_scale)[1]
        return audio[0, 0]

    @torch.inference_mode()
    def audio_stream(self, phoneme_ids: tuple[int, ...], prompt: Prompt, sampling: GptSovitsSampling,
                     settings: ChunkSettings = DEFAULT_CHUNKING) -> TokenAudioStream:
        """One sentence's audio in chunks as its tokens arrive (models/gpt_sovits/streaming.py)."""
        ge = self.reference_embedding(prompt)  # once per sentence, not per window

        def decode_window(tokens: torch.Tensor, first_token: int) -> torch.Tensor:
            audio = self.tokens_to_audio(tokens, phoneme_ids, prompt, sampling, first_token, ge)
            return audio.float().clamp(-1.0, 1.0)

        return TokenAudioStream(decode_window, self.hop_length, settings)

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        self.capabilities.check(request.voice, self.family)
        reference = request.voice.reference if request.voice and request.voice.reference else self.default_reference
        prompt = self.prompt_of(reference)
        sampling = GptSovitsSampling.of(request.sampling)
        waveforms, token_rows = [], []
        with torch.inference_mode():
            for row in range(request.phoneme_ids.shape[0]):
                ids = tuple(int(i) for i in request.phoneme_ids[row, : int(request.phoneme_lengths[row])])
                text_ids, bert = self.decode_input(ids, prompt)
                row_sampling = self.sentence_sampling(sampling, len(ids))
                decoded = decode(self.t2s, text_ids, bert, prompt.tokens, row_sampling)
                tokens = decoded.semantic_for_sovits
                token_rows.append(tokens)
                waveforms.append(self.tokens_to_audio(tokens, ids, prompt, row_sampling))
        return pad_results(waveforms, token_rows, self.sample_rate_hz)

    def step_decoder(self, max_rows: int, chunking: ChunkSettings = DEFAULT_CHUNKING):
        """Token-step decoding for the server (models/gpt_sovits/step_decoder.py); ``chunking``: how
        ``step_chunks`` cuts a sentence's audio while it decodes."""
        return GptSovitsStepDecoder(self, max_rows, chunking=chunking)

    # ----- parts
    def parts(self) -> dict[str, nn.Module]:
        return {"t2s": self.t2s, "sovits": self.sovits}

    def replace_part(self, role: str, module: nn.Module) -> None:
        if role not in self.parts():
            raise ValueError(f"{self.family} has no part {role!r}; parts: {list(self.parts())}")
        setattr(self, role, module)

    def __deepcopy__(self, memo: dict) -> GptSovitsVoice:
        """A copy whose parts are its own and whose HuBERT and BERT are this voice's: they are no
        parts, so no stage changes them, and at full size they weigh 1.7 GB (the compress pipeline
        holds a copy per variant on the CPU)."""
        memo[id(self.hubert)], memo[id(self.bert)] = self.hubert, self.bert
        if self._window_graphs is not None:
            memo[id(self._window_graphs)] = None  # graphs belong to this voice's tensors, not the copy's
        copied = self.__class__.__new__(self.__class__)
        memo[id(self)] = copied
        copied.__dict__.update({key: copy.deepcopy(value, memo) for key, value in self.__dict__.items()})
        return copied
