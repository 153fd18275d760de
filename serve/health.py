"""Liveness, readiness and Prometheus metrics: GET /healthz, /readyz, /metrics (never behind the API key).
HEAD /healthz and /readyz answer the same status and headers as GET, without the body."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serve.context import RETRY_AFTER_S, ServeContext
from serve.schemas import ErrorBody


def _answer(request: Request, response: JSONResponse) -> Response:
    """``response``, or for HEAD its status and headers without the body (probes and load balancers send HEAD)."""
    if request.method != "HEAD":
        return response
    return Response(status_code=response.status_code, headers=dict(response.headers))


def health_router(context: ServeContext) -> APIRouter:
    state, served = context.state, context.served
    router = APIRouter()

    @router.api_route("/healthz", methods=["GET", "HEAD"], summary="Liveness: the process answers")
    async def healthz(request: Request) -> Response:
        return _answer(request, JSONResponse({"status": "ok"}))

    @router.api_route("/readyz", methods=["GET", "HEAD"], summary="Readiness: warmed up and taking requests",
                      responses={503: {"model": ErrorBody}})
    async def readyz(request: Request) -> Response:
        if state.ready and not state.shutting_down:
            return _answer(request, JSONResponse({"status": "ready", "model": served.model_id,
                                                  "engine": served.engine}))
        reason = "shutting_down" if state.shutting_down else "warming_up"
        return _answer(request, JSONResponse(
            {"error": {"message": state.warmup_error or reason.replace("_", " "), "type": "server_error",
                       "code": reason, "param": None}},
            status_code=503, headers={"Retry-After": RETRY_AFTER_S}))

    @router.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(context.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
