"""Security headers on every HTTP response: a strict Content-Security-Policy and friends.

Pages carry no inline scripts (initial state travels in ``<script type="application/json">``
blocks, which CSP does not execute), so ``script-src 'self'`` holds everywhere. Plotly injects
``<style>`` elements, hence ``style-src 'unsafe-inline'``. /docs and /redoc serve Swagger UI and
ReDoc from local files with a static bootstrap script (app/http/docs.py), so they get the CSP too; ReDoc
renders its search in a blob: worker, hence ``worker-src 'self' blob:``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

BASE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class SecurityHeadersMiddleware:
    """Pure ASGI middleware: adds the headers above unless the response already set them."""

    def __init__(self, app: ASGIApp, csp: str = CSP) -> None:
        self.app = app
        self.csp = csp.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        add = [*BASE_HEADERS, (b"content-security-policy", self.csp)]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers.extend((k, v) for k, v in add if k not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
