"""Errors as OpenAI's API shapes them: ``{"error": {"message", "type", "code", "param"}}``.

Every failure the server answers, including FastAPI's own (bad JSON, a field out of range, an
unknown route), leaves through here, so clients parse one shape. Validation errors answer 400
(OpenAI's status for a bad parameter) instead of FastAPI's 422.
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    def __init__(self, status_code: int, message: str, code: str, error_type: str = "invalid_request_error",
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code
        self.error_type = error_type
        self.param = param
        self.headers = headers or {}


def error_response(error: ApiError) -> JSONResponse:
    body = {"error": {"message": error.message, "type": error.error_type, "code": error.code, "param": error.param}}
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


# Fields typed strictly (serve.schemas) take only their own JSON type: "1.5" or true is not a speed.
STRICT_TYPE_ERRORS = {"float_type": "a JSON number", "int_type": "a JSON integer", "bool_type": "true or false",
                      "string_type": "a JSON string"}


def _validation_error(exc: RequestValidationError) -> ApiError:
    first = exc.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if param == "file":  # POST /v1/voices got a string (a path, a URL) or nothing where the clip belongs
        return ApiError(400, "file: send the clip's bytes as a multipart/form-data file upload; server-side "
                             "paths and URLs are not accepted", "invalid_upload", param=param)
    if first.get("type") == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first.get('msg')}", "invalid_json")
    if first.get("type") == "extra_forbidden":
        return ApiError(400, f"unknown field {param!r}: see the OpenAPI spec at /openapi.json for accepted fields",
                        "unknown_parameter", param=param)
    if first.get("type") == "missing":
        if param is None:
            return ApiError(400, "the request body is empty: send a JSON object with the fields in /openapi.json",
                            "missing_parameter")
        return ApiError(400, f"missing required field {param!r}", "missing_parameter", param=param)
    if first.get("type") == "invalid_text":  # serve.schemas.SpeakableText: models.text.sanitize refused it
        return ApiError(400, f"{param}: {first.get('msg')}", "invalid_text", param=param)
    if first.get("type") in STRICT_TYPE_ERRORS:
        return ApiError(400, f"{param}: must be {STRICT_TYPE_ERRORS[first['type']]}, not "
                             f"{_json_type(first.get('input'))}", "invalid_value", param=param)
    return ApiError(400, f"{param or 'body'}: {first.get('msg')}", "invalid_value", param=param)


def _json_type(value: object) -> str:
    """What a client sent, as JSON names it (the value itself is not echoed: it may be long or hostile)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "an integer" if isinstance(value, int) else "a decimal number"
    names = {str: "a string", dict: "an object", list: "an array", type(None): "null"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), "another type")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError):
        return error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        return error_response(ApiError(exc.status_code, str(exc.detail), codes.get(exc.status_code, "http_error"),
                                       headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        # Starlette raises ``exc`` again after this answer; serve/error_boundary.py logs it, once.
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}", "internal_error", "server_error"))
