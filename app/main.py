"""The FastAPI application: one factory, routers from each part of the service."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.resources import static_dir
from app.core.settings import Settings, get_settings
from app.http.docs import install_docs
from app.http.errors import install_error_handlers
from app.malloc import tune_malloc
from app.storage.db import init_db, make_engine
from app.storage.jobs import JobPool

WORKER_HEADER = b"x-creditlens-worker"


class WorkerHeaderMiddleware:
    """Pure ASGI middleware: every HTTP response says which process served it (``X-Creditlens-Worker:
    <pid>``), so `serve --workers N` can be checked, and debugged, worker by worker."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_worker(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (WORKER_HEADER, str(os.getpid()).encode())]
            await send(message)

        await self.app(scope, receive, send_with_worker)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    import torch

    torch.set_num_threads(settings.torch_threads)
    tune_malloc()
    from estimators import native

    native.set_default(settings.native)
    engine = make_engine(settings.database_url)
    jobs = JobPool.from_settings(engine, settings)  # this process's job runners (app/storage/jobs.py)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Threads that run requests' Python at once, per process (see Settings.worker_threads);
        # uploads have their own, smaller share (app/http/api/uploads.py ingest_thread).
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        app.state.ingest_limiter = anyio.CapacityLimiter(settings.ingest_threads)
        init_db(engine)
        if settings.demo:
            from sqlmodel import Session

            from app.sim.demo_runs import load_demo_runs
            from app.storage.store import load_demo

            with Session(engine) as session:
                if load_demo(session):  # an empty database: the demo's runs too
                    load_demo_runs(session, settings)
        jobs.start()
        yield
        jobs.stop()
        engine.dispose()

    app = FastAPI(
        title="creditlens",
        version="0.1.0",
        description="Per-token advantages for multi-turn RL agent episodes.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.jobs = jobs
    install_error_handlers(app)

    from app.http.access import ReadTokenMiddleware
    from app.http.access import router as access_router
    from app.http.api import router as api_router
    from app.http.web import SecurityHeadersMiddleware
    from app.http.web import router as web_router
    from app.lab.routes import router as lab_router
    from app.sim.routes import router as sim_router

    app.include_router(api_router)
    app.include_router(sim_router)
    app.include_router(lab_router)
    app.include_router(web_router)
    app.include_router(access_router)
    install_docs(app)  # /docs and /redoc with local assets (app/http/docs.py)
    # A private server (CREDITLENS_READ_TOKEN): inside the security headers, so its 401s and
    # redirects carry them too (app/http/access.py).
    app.add_middleware(ReadTokenMiddleware, read_token=settings.read_token, write_token=settings.write_token)
    app.add_middleware(SecurityHeadersMiddleware)  # CSP etc. (app/http/web/security.py)
    app.add_middleware(WorkerHeaderMiddleware)
    app.mount("/static", StaticFiles(directory=str(static_dir())), name="static")

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
