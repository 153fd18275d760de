"""Fuzz the OpenAPI spec with schemathesis against a real server: no 5xx but the deliberate ones.

    python -m pytest -q tests/test_serve_fuzz.py

503 (queue full, warming up) and 504 (first audio timeout) are answers the API documents; any other
5xx is a bug. Inputs are capped at 60 characters so that the generated texts speak quickly.
"""
from __future__ import annotations

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis", reason="`pip install schemathesis` to fuzz the API")
from hypothesis import HealthCheck, given, settings  # noqa: E402  (hypothesis comes with schemathesis)

from serve.app import create_app  # noqa: E402
from serve_support import running_server, serve_settings, served_variant, wait_until  # noqa: E402

pytestmark = pytest.mark.slow  # loads the real voice

DELIBERATE_5XX = (503, 504)


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    settings = serve_settings(tmp_path_factory.mktemp("fuzz"), "serve.warmup=false", "serve.max_input_chars=60",
                              "serve.max_upload_bytes=200000", "serve.first_audio_timeout_s=20")
    with running_server(create_app(settings, served_variant("original_onnx"))) as (_, base_url):
        wait_until(lambda: httpx.get(f"{base_url}/readyz").status_code == 200, what="ready")
        yield schemathesis.openapi.from_url(f"{base_url}/openapi.json")


def test_no_unexpected_server_error(api_schema):
    # Operations one by one with hypothesis: schemathesis' pytest plugin does not load under this pytest.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {operation.path for operation in operations} >= {"/v1/audio/speech", "/v1/voices", "/readyz"}
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            response = case.call(timeout=30)
            assert response.status_code < 500 or response.status_code in DELIBERATE_5XX, (
                f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}")
            if response.status_code >= 400:
                error = response.json()["error"]  # every error has OpenAI's shape
                assert error["message"] and error["type"] and error["code"]

        check()
