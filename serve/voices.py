"""Voices and models: GET /v1/voices, POST /v1/voices (reference uploads), GET /v1/models.

    router = voices_router(context)   # serve/app.py includes it behind the API key

GET /v1/voices lists, a page at a time (``?limit=&offset=``), the served voice, every row of the
family's speaker table (``Family.speaker_names``: EmotiVoice's 2014 speakers), then the uploads; the
list also says which emotions ``emotion`` accepts (``Capabilities.emotions``).

An upload is decoded and checked (serve/uploads.py), its speaker embedding computed (resemblyzer,
cached by the sha256 of its bytes) and the clip kept with its optional transcript, so a family
with ``capabilities.zero_shot`` speaks with it (``VoiceCondition.reference``). Other families
list it with ``usable: false``.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

import numpy as np
import torch
from fastapi import APIRouter, File, Form, Query, Request, UploadFile

from models.interface import ReferenceClip
from models.text.sanitize import UnsafeTextError, speakable_text
from serve.context import ERROR_RESPONSES, ServeContext
from serve.errors import ApiError
from serve.schemas import ErrorBody, VoiceList, VoiceObject
from serve.speaker_cache import content_key
from serve.uploads import TARGET_SAMPLE_RATE_HZ, UploadRejected, decode_reference

UPLOAD_ID_PREFIX = "voice_"
VOICE_UPLOAD_PACKAGES = "Resemblyzer and librosa"  # what POST /v1/voices needs beyond the serving wheels
# GET /v1/voices pages: EmotiVoice's 2014 speakers are 514 kB of JSON in all (measured on the test
# client); 100 a page answers 26 kB, and 1000 lets a client take the whole table in three calls.
DEFAULT_VOICES_PER_PAGE = 100
MAX_VOICES_PER_PAGE = 1000
MAX_VOICES_OFFSET = 2**31 - 1
VOICE_LIST_PARAMETERS = ("limit", "offset")


def _speaker_encoder() -> Callable[..., np.ndarray]:
    """``evaluate.speaker.speaker_embedding``, imported on the first upload (about 2 s, off the event loop)."""
    # Lazy: resemblyzer (with librosa, scipy, webrtcvad) and torchmetrics are too heavy for a serving machine,
    # which then answers POST /v1/voices 501 and serves speech as usual.
    import librosa  # noqa: F401  decode_reference resamples with it
    from evaluate.speaker import speaker_embedding
    return speaker_embedding


def voices_router(context: ServeContext) -> APIRouter:
    settings, served, state, metrics = context.settings, context.served, context.state, context.metrics
    family, capabilities = served.family, served.capabilities
    router = APIRouter()

    def unusable_because(transcript: str) -> str:
        """Why speech cannot use an upload with ``transcript`` ("" when it can)."""
        if not capabilities.zero_shot:
            return f"family {family.name} does not support zero-shot voices"
        if capabilities.zero_shot_needs_transcript and not transcript:
            return f"family {family.name} needs the clip's transcript: upload it again with the `transcript` field"
        return ""

    def form_text(field: str, text: str) -> str:
        """``text`` of the form field ``field`` under models.text.sanitize (a transcript reaches the family)."""
        try:
            return speakable_text(text)
        except UnsafeTextError as error:
            raise ApiError(400, f"{field}: {error}", "invalid_text", param=field) from error

    def builtin_voice() -> VoiceObject:
        return VoiceObject(id=served.voice_name, kind="builtin", name=served.voice_name, model=served.model_id,
                           usable=True, aliases=list(settings.voice_aliases))

    def speaker_voices() -> tuple[VoiceObject, ...]:
        """A voice per speaker-table row, by the name serve/speech.py takes first; the row number is an alias
        unless a speaker is named by that number (the name would win). A name the served voice has is skipped:
        its id already means the served voice."""
        names = family.speaker_names(served.model) if family.speaker_names is not None else ()
        taken = set(names) | set(context.builtin_voices)
        return tuple(VoiceObject(id=name, kind="speaker", name=name, model=served.model_id, usable=True,
                                 speaker_row=row, aliases=[] if str(row) in taken else [str(row)])
                     for row, name in enumerate(names) if name not in context.builtin_voices)

    speakers = speaker_voices()  # the table is the model's: built once, not per listing
    emotions = list(capabilities.emotions) if capabilities.prompt_style else []

    def check_query(request: Request) -> None:
        """Refuse a query parameter the listing does not read, or one given twice: the client would page
        through other voices than it believes. ``param`` reads ``query.<name>``, as FastAPI's own checks of
        the values name it (serve/errors.py)."""
        for name in request.query_params:
            if name not in VOICE_LIST_PARAMETERS:
                raise ApiError(400, f"unknown query parameter {name!r}: GET /v1/voices takes "
                                    f"{list(VOICE_LIST_PARAMETERS)}", "unknown_parameter", param=f"query.{name}")
            if len(request.query_params.getlist(name)) > 1:
                raise ApiError(400, f"query parameter {name!r} appears more than once: give it once",
                               "duplicate_parameter", param=f"query.{name}")

    @router.get("/v1/voices", response_model=VoiceList, responses=ERROR_RESPONSES,
                summary="Voices of the served model (its speakers too) and uploaded references, a page at a time")
    async def list_voices(request: Request,
                          limit: int = Query(DEFAULT_VOICES_PER_PAGE, ge=1, le=MAX_VOICES_PER_PAGE, description=(
                              f"The most voices to return, 1 to {MAX_VOICES_PER_PAGE}.")),
                          offset: int = Query(0, ge=0, le=MAX_VOICES_OFFSET, description=(
                              "How many voices to skip: the previous page's offset + limit."))) -> VoiceList:
        check_query(request)
        voices = [builtin_voice(), *speakers, *state.uploaded_voices.values()]
        page = voices[offset:offset + limit]
        return VoiceList(data=page, total=len(voices), offset=offset, limit=limit,
                         has_more=offset + len(page) < len(voices), style_prompts=capabilities.prompt_style,
                         emotions=emotions)

    @router.post("/v1/voices", response_model=VoiceObject, status_code=201,
                 responses={**ERROR_RESPONSES, 501: {"model": ErrorBody}},
                 summary="Upload a reference clip (zero-shot voice)")
    async def upload_voice(request: Request,
                           file: UploadFile = File(..., description=(
                               "The clip's bytes as a multipart file (WAV, FLAC or OGG; 1-30 s of speech, "
                               "16-48 kHz). Server-side paths and URLs are not accepted.")),
                           name: str = Form("", max_length=200, description="A label for the voice."),
                           transcript: str = Form("", max_length=2000, description=(
                               "What the clip says; families that align their reference to its text need it."))
                           ) -> VoiceObject:
        """Decode and check the clip, compute its speaker embedding (resemblyzer, cached by sha256 of the
        bytes), keep the clip and its transcript, and store it as ``voice_<hash>``. A family without zero-shot
        voices lists it with ``usable: false``, and speech with it answers 400 ``zero_shot_unsupported``. A
        server without resemblyzer and librosa answers 501 ``voice_upload_unavailable``."""
        name, transcript = form_text("name", name), form_text("transcript", transcript)
        declared_bytes = int(request.headers.get("content-length") or 0)
        if declared_bytes > settings.max_upload_bytes + 64_000:  # room for the multipart framing
            raise ApiError(413, f"file: the upload is {declared_bytes} bytes; the limit is "
                                f"{settings.max_upload_bytes}", "upload_too_large", param="file")
        try:
            speaker_embedding = await asyncio.to_thread(_speaker_encoder)
        except ModuleNotFoundError as error:
            raise ApiError(501, f"voice uploads need the Python package {error.name!r}, which this server lacks: "
                                f"install {VOICE_UPLOAD_PACKAGES} to take reference clips",
                           "voice_upload_unavailable", "server_error") from error
        data = await file.read(settings.max_upload_bytes + 1)
        try:
            clip = await asyncio.to_thread(decode_reference, data, context.upload_limits)
        except UploadRejected as error:
            raise ApiError(error.status_code, str(error), error.code, param="file") from error
        key = content_key(data)
        embedding = await asyncio.to_thread(state.speaker_cache.get, key)
        cached = embedding is not None
        metrics.speaker_cache.labels("hit" if cached else "miss").inc()
        if not cached:
            try:
                embedding = await asyncio.to_thread(speaker_embedding, clip.waveform, TARGET_SAMPLE_RATE_HZ, "file")
            except ValueError as error:
                raise ApiError(400, str(error), "no_speech", param="file") from error
            await asyncio.to_thread(state.speaker_cache.put, key, embedding)
        voice_id = UPLOAD_ID_PREFIX + key[:24]
        note = unusable_because(transcript)
        voice = VoiceObject(
            id=voice_id, kind="reference", name=name or voice_id, model=served.model_id, usable=not note,
            note=note, sha256=key, duration_s=round(clip.duration_s, 3), sample_rate_hz=clip.source_sample_rate_hz,
            created_at=int(time.time()), embedding_cached=cached, transcript=transcript or None)
        state.reference_clips[voice_id] = ReferenceClip(torch.from_numpy(clip.waveform), TARGET_SAMPLE_RATE_HZ,
                                                        transcript or None)
        state.uploaded_voices[voice_id] = voice
        return voice

    @router.get("/v1/models", responses=ERROR_RESPONSES, summary="The served model and its aliases")
    async def list_models() -> dict:
        return {"object": "list", "data": [
            {"id": model_id, "object": "model", "owned_by": "tts-compress", "engine": served.engine,
             "family": family.name, "variant": served.model_id} for model_id in context.model_ids]}

    return router
