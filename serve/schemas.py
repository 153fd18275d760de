"""Request and response bodies of the HTTP API; their descriptions become the OpenAPI spec (/openapi.json).

    router = APIRouter(route_class=JsonBodyRoute)     # JSON bodies checked before FastAPI parses them
    async def create_speech(body: SpeechRequest): ...

A request body is taken as it was sent or refused, never repaired: Content-Type application/json
(415 ``unsupported_media_type`` otherwise), UTF-8 (400 ``invalid_encoding``), each key once per
object (400 ``duplicate_key``), numbers as JSON numbers (``"1.5"`` or ``true`` for ``speed``: 400
naming the field), and text a family speaks through ``models.text.sanitize`` (400 ``invalid_text``
naming the character and its position).
"""
from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import Request, Response, params
from fastapi.routing import APIRoute
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from models.text.sanitize import UnsafeTextError, speakable_text
from serve.errors import ApiError

MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range for `speed`
JSON_MEDIA_TYPE = "application/json"


def check_json_content_type(content_type: str | None) -> None:
    """Raise 415 ``unsupported_media_type`` unless ``content_type`` is application/json (or a ``+json``
    type) in UTF-8, the only encoding JSON has (RFC 8259)."""
    message = email.message.Message()
    message["content-type"] = content_type or ""
    subtype = message.get_content_subtype()
    is_json = content_type and message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json"))
    charset = message.get_content_charset("utf-8")
    if not is_json or charset not in ("utf-8", "utf8"):
        sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        raise ApiError(415, f"the request body came with {sent}; this endpoint takes a JSON object sent as "
                            f"Content-Type: {JSON_MEDIA_TYPE} (UTF-8)", "unsupported_media_type")


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # With json.loads' last-wins merge, a proxy or log that reads the first `voice` of
    # {"voice": "../x", "voice": "alloy"} sees another request than the one the server runs.
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ApiError(400, f"key {key!r} appears twice in one JSON object: give each field once",
                           "duplicate_key", param=key)
        seen[key] = value
    return seen


def _refuse_constant(name: str) -> float:
    raise ApiError(400, f"the request body holds {name}, which is not JSON: send finite numbers", "invalid_json")


def parse_json_body(raw: bytes) -> Any:
    """The JSON value of a request body; ApiError 400 for bytes that are not UTF-8 (``invalid_encoding``),
    a syntax error, NaN or Infinity, or nesting deeper than Python's recursion limit (``invalid_json``), or a
    key twice in one object (``duplicate_key``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(400, f"the request body is not UTF-8: byte 0x{raw[error.start]:02X} at offset {error.start} "
                            "cannot start or continue a UTF-8 character; send JSON encoded as UTF-8",
                       "invalid_encoding") from error
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicate_keys, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise ApiError(400, f"the request body is not valid JSON: {error.msg} at line {error.lineno} column "
                            f"{error.colno}", "invalid_json") from error
    except RecursionError as error:  # "[[[[..." a few thousand deep: refused, not a 500
        raise ApiError(400, "the request body nests arrays or objects too deeply: send a flat JSON object",
                       "invalid_json") from error


class JsonBodyRoute(APIRoute):
    """An APIRoute whose JSON body passes ``check_json_content_type`` and ``parse_json_body`` before FastAPI
    parses it. FastAPI alone hands a body of another Content-Type to validation as bytes (400 "Input
    should be a valid dictionary"), keeps the last of duplicate keys and answers bytes that are not
    UTF-8 with a bare 400. Routes without a body, or with a form body, run unchanged."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        if self.body_field is None or isinstance(self.body_field.field_info, params.Form):
            return handle

        async def handle_checked_json(request: Request) -> Response:
            try:
                raw = await request.body()  # cached on the request: FastAPI reads the same bytes after this
            except Exception as error:  # the client left, or a body-limit middleware stopped the read
                # FastAPI answers this 400 too; a middleware that stopped the read sends its own answer instead.
                raise ApiError(400, "the request body could not be read to its end", "unreadable_body") from error
            if raw:  # an empty body is FastAPI's "missing" answer, whatever its Content-Type
                check_json_content_type(request.headers.get("content-type"))
                parse_json_body(raw)
            return await handle(request)

        return handle_checked_json


def _speakable(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # str validation refuses it, naming the JSON type
    try:
        return speakable_text(value)
    except UnsafeTextError as error:
        raise PydanticCustomError("invalid_text", "{reason}", {"reason": str(error), "codepoint": error.codepoint,
                                                               "position": error.position}) from error


# Text a family reads: NFKC but full-width punctuation kept as sent, one space per whitespace run;
# control and format characters refused. Runs before str validation, which would refuse a lone
# surrogate without naming it; length limits apply to the result.
SpeakableText = Annotated[str, BeforeValidator(_speakable)]


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
    input: SpeakableText = Field(..., min_length=1, description=(
        "Text to speak, at most `serve.max_input_chars` characters (4096 by default). Sentences longer than "
        "`serve.max_sentence_chars` are split at clause marks or spaces, not rejected. Taken in Unicode NFKC "
        "(full-width punctuation such as \u201c\uff0c\u201d kept as sent: Mandarin frontends read it as pauses) "
        "with each whitespace run read as one space; a control or format character (NUL, BEL, U+202E...; "
        "ZWJ and ZWNJ are fine) answers 400 `invalid_text` naming it and its position."))
    voice: str | VoiceReference = Field(..., description=(
        "A voice id from GET /v1/voices (e.g. `joe`), an alias from `serve.voice_aliases` (OpenAI's voice "
        "names, all mapped to the served voice), or `{\"id\": ...}`. Uploaded reference voices (`voice_...`) "
        "speak for families with zero-shot voices and answer 400 `zero_shot_unsupported` for the others."))
    response_format: Literal["wav", "pcm", "flac"] = Field("wav", description=(
        "`wav`: 16-bit mono PCM WAV (streamed: header sizes 0xFFFFFFFF); `pcm`: raw 16-bit little-endian mono "
        "samples at the voice's rate (22050 Hz for joe; also in the `X-Sample-Rate` header); `flac`: 16-bit "
        "FLAC, sent whole once synthesized. OpenAI's mp3/opus/aac are not offered."))
    speed: float = Field(1.0, strict=True, ge=MIN_SPEED, le=MAX_SPEED, description=(
        "Speaking rate, a JSON number from 0.25 to 4.0; the model's length_scale is 1/speed."))
    stream_format: Literal["audio", "sse"] = Field("audio", description=(
        "`audio`: the audio bytes as they are made (chunked transfer); `sse`: server-sent events "
        "`speech.audio.delta` (base64 bytes of the chosen format) then `speech.audio.done`. `sse` takes "
        "wav or pcm."))
    noise_scale: float | None = Field(None, strict=True, ge=0.0, le=2.0, description=(
        "Prior noise of VITS-style families (variation in timbre and pitch); default: the family's (0.667 for "
        "VITS). 0 makes it deterministic. Families without it: 400 `unsupported_parameter`."))
    noise_scale_w: float | None = Field(None, strict=True, ge=0.0, le=2.0, description=(
        "Duration-predictor noise of VITS-style families (variation in rhythm); default: the family's (0.8 for "
        "VITS). Families without it: 400 `unsupported_parameter`."))
    seed: int | None = Field(None, strict=True, ge=0, le=2**31 - 1, description=(
        "Noise seed, a JSON integer: the same text, voice, scales and seed give the same audio, batched or not. "
        "Sentence k of the input uses seed + k. Default: `serve.default_seed` (0), or a fresh seed when that is null."))
    emotion: SpeakableText | None = Field(None, max_length=200, description=(
        "Emotion label for families that take style prompts (e.g. EmotiVoice). Families without them: 400 "
        "`unsupported_parameter`."))
    prompt: SpeakableText | None = Field(None, max_length=2000, description=(
        "Style prompt for families that take one. Families without them: 400 `unsupported_parameter`."))
    instructions: SpeakableText | None = Field(None, max_length=4096, description=(
        "OpenAI's name for a style prompt; treated as `prompt` (give one of the two)."))


class VoiceObject(BaseModel):
    id: str = Field(..., description="What to pass as `voice`.")
    object: Literal["voice"] = "voice"
    kind: Literal["builtin", "speaker", "reference"] = Field(..., description=(
        "`builtin`: the served model's own voice; `speaker`: a row of its speaker table (families with "
        "several speakers, e.g. EmotiVoice); `reference`: an uploaded clip (zero-shot voice)."))
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
    speaker_row: int | None = Field(None, description=(
        "A `speaker` voice's row in the speaker table; the row number also selects it as `voice` where no "
        "speaker is named so (then it is among `aliases`)."))


class VoiceList(BaseModel):
    """GET /v1/voices: one page of the voices, in a fixed order (the served voice, its speaker table's rows,
    uploads in upload order), and the style conditioning the served model takes."""

    object: Literal["list"] = "list"
    data: list[VoiceObject]
    total: int = Field(..., description="Voices in all pages.")
    offset: int = Field(..., description="Position of this page's first voice among all (the `offset` asked for).")
    limit: int = Field(..., description="The most voices a page holds (the `limit` asked for, or the default).")
    has_more: bool = Field(..., description="Whether voices follow this page: ask again with offset + limit.")
    style_prompts: bool = Field(..., description=(
        "Whether POST /v1/audio/speech takes `emotion`, `prompt` and `instructions` for this model."))
    emotions: list[str] = Field(..., description=(
        "The names `emotion` accepts (several may name one emotion, e.g. `happy` and `开心`). Empty: any name "
        "when `style_prompts` is true, none otherwise."))


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(..., description="invalid_request_error, server_error or ... as in OpenAI's API.")
    code: str = Field(..., description="A stable machine-readable reason, e.g. `unknown_voice`, `queue_full`.")
    param: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
