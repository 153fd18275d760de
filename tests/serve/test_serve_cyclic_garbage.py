"""A served request's objects die by reference counting: none is left in a reference cycle for the
garbage collector, in front of every registered family's tiny model, on a real uvicorn, whole and
streamed.

Why it matters: under load the collector's full passes hold the GIL while the GPU waits for its next
batch (serve/gc_pauses.py), and objects in cycles are what bring those passes on and what each pass must
walk. Each of these was a cycle per request: uvicorn's request cycle and the connection object in its
scope (serve/client_limits.py), the end of a stream raised as StopAsyncIteration through
``asyncio.wait_for`` (serve/speech.py), and a ctypes array type made for each text espeak-ng read
(models/text/espeak_ng.py). The client is http.client, in this process, which leaves no cycle of its own.

    python -m pytest -q tests/serve/test_serve_cyclic_garbage.py
"""
from __future__ import annotations

import collections
import gc
import http.client
import json
from urllib.parse import urlsplit

import pytest
from serve_support import running_server, tiny_family_app

from models.registry import FAMILIES

SENTENCES = ["The train to the coast leaves at nine.", "Please keep the window open tonight.",
             "Our neighbour paints the fence every spring.", "A quiet voice carried across the hall."]
REQUESTS = 12


def post_speech(base_url: str, body: dict) -> bytes:
    """One POST /v1/audio/speech on its own connection; the whole body."""
    address = urlsplit(base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request("POST", "/v1/audio/speech", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        assert response.status == 200, payload[:300]
        return payload
    finally:
        connection.close()


def describe(objects: list) -> list[tuple[str, int]]:
    """The commonest types among ``objects`` (frames by their function), for the failure message."""
    names = collections.Counter(
        f"frame {o.f_code.co_filename}:{o.f_code.co_name}" if type(o).__name__ == "frame"
        else f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
    return names.most_common(12)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("family_name", sorted(FAMILIES))
def test_a_served_request_leaves_no_reference_cycle(tmp_path, family_name, stream):
    family = FAMILIES[family_name]
    app, served = tiny_family_app(family, family.tiny_model(0), tmp_path)
    body = {"model": "teacher", "voice": served.voice_name, "input": " ".join(SENTENCES), "response_format": "wav"}
    if stream:
        body["stream_format"] = "audio"
    with running_server(app) as (_, base_url):
        for _ in range(2):  # first calls fill lazily built caches: those live on, they are not garbage
            post_speech(base_url, body)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection would free is kept in gc.garbage instead
        try:
            for _ in range(REQUESTS):
                assert len(post_speech(base_url, body)) > 44  # a WAV header and audio
            gc.collect()
            garbage = list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    # A cycle a request leaves at least two objects a request; fewer than one a request is not the server's
    # (another test's thread in this process, say).
    assert len(garbage) < REQUESTS, f"{len(garbage)} objects in cycles after {REQUESTS} requests: {describe(garbage)}"
