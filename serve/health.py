"""Liveness, readiness and Prometheus metrics: GET /healthz, /readyz, /metrics (never behind the API key)."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serve.context import RETRY_AFTER_S, ServeContext
from serve.schemas import ErrorBody


def health_router(context: ServeContext) -> APIRouter:
    state, served = context.state, context.served
    router = APIRouter()

    @router.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> dict:
        return {"status": "ok"}

    @router.get("/readyz", summary="Readiness: warmed up and taking requests", responses={503: {"model": ErrorBody}})
    async def readyz():
        if state.ready and not state.shutting_down:
            return {"status": "ready", "model": served.model_id, "engine": served.engine}
        reason = "shutting_down" if state.shutting_down else "warming_up"
        return JSONResponse({"error": {"message": state.warmup_error or reason.replace("_", " "), "type": "server_error",
                                       "code": reason, "param": None}},
                            status_code=503, headers={"Retry-After": RETRY_AFTER_S})

    @router.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(context.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
