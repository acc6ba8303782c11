"""In-process calls to our own API: the pages and the link previews read the same JSON answers the
API serves, with the caller's credentials (no network)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import Request


async def api_get(request: Request, url: str) -> tuple[int, Any]:
    """GET one of our own API URLs in-process (no network) -> (status, parsed JSON or None)."""
    transport = httpx.ASGITransport(app=request.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://creditlens.internal") as client:
        # The caller's credentials go along: a private server (app/http/access.py) checks this call too.
        headers = {"accept": "application/json"}
        headers.update({k: v for k, v in request.headers.items() if k in ("authorization", "cookie")})
        r = await client.get(url, headers=headers)
    try:
        body = r.json()
    except ValueError:
        body = None
    return r.status_code, body
