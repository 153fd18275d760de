"""Request and response bodies of the HTTP API; their descriptions become the OpenAPI spec (/openapi.json)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range for `speed`


class VoiceReference(BaseModel):
    """A voice given as an object, as OpenAI's client sends custom voices."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(..., min_length=1, max_length=200, description="A voice id from GET /v1/voices.")


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech. Fields beyond OpenAI's (noise_scale, noise_scale_w, seed, emotion, prompt) are ours."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1, max_length=200, description=(
        "The served model's id (GET /v1/voices lists it as `model`), or an alias from `serve.model_aliases` "
        "(default: tts-1, tts-1-hd, gpt-4o-mini-tts). Never a file path."))
    input: str = Field(..., min_length=1, description=(
        "Text to speak, at most `serve.max_input_chars` characters (4096 by default). Sentences longer than "
        "`serve.max_sentence_chars` are split at clause marks or spaces, not rejected."))
    voice: str | VoiceReference = Field(..., description=(
        "A voice id from GET /v1/voices (e.g. `joe`), an alias from `serve.voice_aliases` (OpenAI's voice "
        "names, all mapped to the served voice), or `{\"id\": ...}`. Uploaded reference voices (`voice_...`) "
        "speak for families with zero-shot voices and answer 400 `zero_shot_unsupported` for the others."))
    response_format: Literal["wav", "pcm", "flac"] = Field("wav", description=(
        "`wav`: 16-bit mono PCM WAV (streamed: header sizes 0xFFFFFFFF); `pcm`: raw 16-bit little-endian mono "
        "samples at the voice's rate (22050 Hz for joe; also in the `X-Sample-Rate` header); `flac`: 16-bit "
        "FLAC, sent whole once synthesized. OpenAI's mp3/opus/aac are not offered."))
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, description=(
        "Speaking rate, 0.25 to 4.0; the model's length_scale is 1/speed."))
    stream_format: Literal["audio", "sse"] = Field("audio", description=(
        "`audio`: the audio bytes as they are made (chunked transfer); `sse`: server-sent events "
        "`speech.audio.delta` (base64 bytes of the chosen format) then `speech.audio.done`. `sse` takes "
        "wav or pcm."))
    noise_scale: float | None = Field(None, ge=0.0, le=2.0, description=(
        "Prior noise of VITS-style families (variation in timbre and pitch); default: the family's (0.667 for "
        "VITS). 0 makes it deterministic. Families without it: 400 `unsupported_parameter`."))
    noise_scale_w: float | None = Field(None, ge=0.0, le=2.0, description=(
        "Duration-predictor noise of VITS-style families (variation in rhythm); default: the family's (0.8 for "
        "VITS). Families without it: 400 `unsupported_parameter`."))
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description=(
        "Noise seed: the same text, voice, scales and seed give the same audio, batched or not. Sentence k of "
        "the input uses seed + k. Default: `serve.default_seed` (0), or a fresh seed when that is null."))
    emotion: str | None = Field(None, max_length=200, description=(
        "Emotion label for families that take style prompts (e.g. EmotiVoice). Families without them: 400 "
        "`unsupported_parameter`."))
    prompt: str | None = Field(None, max_length=2000, description=(
        "Style prompt for families that take one. Families without them: 400 `unsupported_parameter`."))
    instructions: str | None = Field(None, max_length=4096, description=(
        "OpenAI's name for a style prompt; treated as `prompt` (give one of the two)."))


class VoiceObject(BaseModel):
    id: str = Field(..., description="What to pass as `voice`.")
    object: Literal["voice"] = "voice"
    kind: Literal["builtin", "reference"] = Field(..., description=(
        "`builtin`: a speaker of the served model; `reference`: an uploaded clip (zero-shot voice)."))
    name: str = Field(..., description="A label: the speaker's name, or the name given at upload.")
    model: str = Field(..., description="The served model's id.")
    usable: bool = Field(..., description="Whether POST /v1/audio/speech can speak with this voice now.")
    aliases: list[str] = Field(default_factory=list, description="Other names that select this voice.")
    note: str = Field("", description="Why a voice is not usable, for example a family without zero-shot voices.")
    sha256: str | None = Field(None, description="Content hash of the uploaded clip (the speaker-cache key).")
    duration_s: float | None = Field(None, description="Length of the uploaded clip in seconds.")
    sample_rate_hz: int | None = Field(None, description="Sample rate of the uploaded clip as sent.")
    created_at: int | None = Field(None, description="Upload time, unix seconds.")
    transcript: str | None = Field(None, description="What the uploaded clip says, as given at upload.")
    embedding_cached: bool | None = Field(None, description=(
        "On upload: true when the clip's speaker embedding came from the cache (same bytes seen before)."))


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceObject]


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(..., description="invalid_request_error, server_error or ... as in OpenAI's API.")
    code: str = Field(..., description="A stable machine-readable reason, e.g. `unknown_voice`, `queue_full`.")
    param: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
