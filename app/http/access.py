"""Who may read: the optional read token (setting CREDITLENS_READ_TOKEN) that makes a server private.

When it is set, every page and API answer needs it, except ``/healthz`` and the static files
(``/static``, ``/vendor``: scripts, styles, no data) and the sign-in page itself:

* the API (and anything asking for JSON) takes ``Authorization: Bearer <read token>``; without it
  a 401 in the project's one error shape. The write token (CREDITLENS_WRITE_TOKEN), when set,
  also reads: a client that writes sends one token.
* a browser signs in once at ``/sign-in``, which sets an HttpOnly, SameSite=Strict cookie holding
  an HMAC of the token (never the token), and returns to the page it came from (a same-site
  relative path only). Pages without it redirect there.

Every comparison is constant-time (``hmac.compare_digest``). Link previews of a private server
leak nothing: a crawler without the token gets the sign-in redirect, no preview image, no tags.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core import urls
from app.core.errors import error_body

COOKIE = "creditlens_read"
COOKIE_MAX_AGE = 30 * 24 * 3600  # 30 days
# Paths open without the token: liveness, and files that hold no data.
OPEN_EXACT = {"/healthz", urls.SIGN_IN}
OPEN_PREFIXES = ("/static/", "/vendor/")
MAX_NEXT = 2000

router = APIRouter(include_in_schema=False)


def cookie_value(token: str) -> str:
    """What the sign-in cookie holds: an HMAC of a fixed message keyed by the read token. It proves
    the browser once had the token without storing the token (changing the token signs everyone
    out)."""
    return hmac.new(token.encode(), b"creditlens read cookie v1", hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    """Constant-time equality of two strings of any lengths (digests first: equal lengths)."""
    a = hashlib.sha256(given.encode()).digest()
    b = hashlib.sha256(expected.encode()).digest()
    return hmac.compare_digest(a, b)


def _bearer(headers: Headers) -> str | None:
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" and given.strip() else None


def _cookie(headers: Headers, name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def is_authorized(headers: Headers, read_token: str, write_token: str | None = None) -> bool:
    """True when the request carries the read token (or the write token) as a Bearer header, or
    the sign-in cookie."""
    given = _bearer(headers)
    if given is not None:
        # Both compared, always: the time taken does not say which token matched.
        ok_read = _same(given, read_token)
        ok_write = _same(given, write_token) if write_token else False
        if ok_read or ok_write:
            return True
    cookie = _cookie(headers, COOKIE)
    return cookie is not None and _same(cookie, cookie_value(read_token))


def safe_next(target: str | None) -> str:
    """Where sign-in returns to: a same-site relative path ("/..."), never another site
    ("//evil", "/\\evil", "https://..."), else the home page."""
    if not target or len(target) > MAX_NEXT or not target.startswith("/"):
        return urls.HOME
    if target.startswith("//") or "\\" in target or any(ord(c) < 32 or ord(c) == 127 for c in target):
        return urls.HOME
    return target


def _wants_json(scope: Scope, headers: Headers) -> bool:
    path = scope["path"]
    if path.startswith("/api/") or path == "/openapi.json":
        return True
    if b"format=json" in scope.get("query_string", b""):
        return True
    accept = headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


class ReadTokenMiddleware:
    """Pure ASGI middleware: with a read token set, lets a request through only with the token (or
    to an open path); otherwise 401 (API, JSON, non-GET) or a redirect to the sign-in page."""

    def __init__(self, app: ASGIApp, read_token: str | None, write_token: str | None = None) -> None:
        self.app = app
        self.read_token = read_token
        self.write_token = write_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.read_token:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in OPEN_EXACT or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if is_authorized(headers, self.read_token, self.write_token):
            await self.app(scope, receive, send)
            return
        if _wants_json(scope, headers) or scope["method"] not in ("GET", "HEAD"):
            body = error_body(
                401,
                "read_token_required",
                "this server is private: send `Authorization: Bearer <token>` (the server's "
                "CREDITLENS_READ_TOKEN), or sign in at /sign-in in a browser.",
            )
            response: Response = Response(
                json.dumps(body),
                status_code=401,
                media_type="application/json",
                headers={"www-authenticate": 'Bearer realm="creditlens"', "cache-control": "no-store"},
            )
        else:
            query = scope.get("query_string", b"").decode("latin-1")
            target = path + (f"?{query}" if query else "")
            response = RedirectResponse(sign_in_url(target), status_code=303)
            response.headers["cache-control"] = "no-store"
        await response(scope, receive, send)


def sign_in_url(next_path: str) -> str:
    """The sign-in page that returns to ``next_path`` afterwards."""
    nxt = safe_next(next_path)
    return urls.SIGN_IN if nxt == urls.HOME else f"{urls.SIGN_IN}?{urlencode({'next': nxt}, quote_via=quote)}"


def _page(request: Request, nxt: str, error: str | None, status_code: int) -> HTMLResponse:
    from app.http.templating import templates

    ctx = {"next": nxt, "error": error, "og": None}
    resp = templates.TemplateResponse(request, "sign_in.html", ctx, status_code=status_code)
    resp.headers["cache-control"] = "no-store"
    return resp


@router.get(urls.SIGN_IN, response_class=HTMLResponse)
async def sign_in_page(request: Request) -> Response:
    """The sign-in form (a public server has nothing to sign in to: home)."""
    nxt = safe_next(request.query_params.get("next"))
    if not request.app.state.settings.read_token:
        return RedirectResponse(nxt, status_code=303)
    return _page(request, nxt, None, 200)


@router.post(urls.SIGN_IN, response_class=HTMLResponse)
async def sign_in(request: Request) -> Response:
    """Check the token from the form; right: set the cookie and go back to ``next``; wrong: the
    form again with an error (401)."""
    settings = request.app.state.settings
    form = await request.form()
    token = form.get("token")
    raw_next = form.get("next")
    nxt = safe_next(raw_next if isinstance(raw_next, str) else None)
    read_token = settings.read_token
    if not read_token:
        return RedirectResponse(nxt, status_code=303)
    if not isinstance(token, str) or not _same(token.strip(), read_token):
        return _page(request, nxt, "That token is not this server's read token.", 401)
    resp = RedirectResponse(nxt, status_code=303)
    resp.set_cookie(
        COOKIE,
        cookie_value(read_token),
        max_age=COOKIE_MAX_AGE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return resp


@router.post(urls.SIGN_OUT)
async def sign_out() -> Response:
    """Forget the sign-in cookie."""
    resp = RedirectResponse(urls.SIGN_IN, status_code=303)
    resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return resp
