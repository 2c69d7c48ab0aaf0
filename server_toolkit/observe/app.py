"""The dashboard's web app (Starlette), read-only: ``/`` the page, ``/fragment`` its live part,
``/api/state`` the snapshot as JSON, ``/metrics`` Prometheus' text format. Every route needs the
token when there is one (``observe/access.py``); without it: 401."""

from __future__ import annotations

import dataclasses

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from . import pages
from .access import authorized
from .prometheus_metrics import CONTENT_TYPE, exposition, metrics_registry
from .state import DashboardState


def build_app(state: DashboardState, token: str | None) -> Starlette:
    metrics = metrics_registry(state)

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            if not authorized(token, request.headers.get("authorization"), request.query_params.get("token")):
                return PlainTextResponse("a token is required (?token=... or Authorization: Bearer ...)\n",
                                         status_code=401, headers={"WWW-Authenticate": "Bearer"})
            return await run_in_threadpool(handler)  # a snapshot may read the registry file
        return endpoint

    def index() -> Response:
        return HTMLResponse(pages.page(state.snapshot()), headers={"Cache-Control": "no-store"})

    def fragment() -> Response:
        return HTMLResponse(pages.fragment(state.snapshot()), headers={"Cache-Control": "no-store"})

    def api_state() -> Response:
        return JSONResponse(dataclasses.asdict(state.snapshot()))

    def scrape() -> Response:
        return Response(exposition(metrics), media_type=CONTENT_TYPE)

    routes = [Route(path, guarded(handler), methods=["GET", "HEAD"]) for path, handler in
              (("/", index), ("/fragment", fragment), ("/api/state", api_state), ("/metrics", scrape))]
    return Starlette(routes=routes)
