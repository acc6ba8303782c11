"""Shared API dependencies: the write-token check (also used by POST /api/samples) and the client's
wire protocol version (``X-Creditlens-Protocol``, see app/core/protocol.py), and the id of a
stored row."""

from __future__ import annotations

import secrets
from typing import Protocol

from fastapi import Request

from app.core.errors import ApiError
from app.core.protocol import PROTOCOL_HEADER, check_protocol


def require_write(request: Request) -> None:
    """When the setting CREDITLENS_WRITE_TOKEN is set, require ``Authorization: Bearer <token>``.

    Use as ``dependencies=[Depends(require_write)]`` on every route that writes."""
    token = request.app.state.settings.write_token
    if not token:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise ApiError(
            401,
            "unauthorized",
            "this server needs a write token: send `Authorization: Bearer <token>` (the server's "
            "CREDITLENS_WRITE_TOKEN).",
        )
    if not secrets.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(403, "forbidden", "the write token is wrong.")


def client_protocol(request: Request) -> int:
    """The wire protocol version the client names in ``X-Creditlens-Protocol`` (none: 1); a 400
    naming both versions when it is newer than this server's. On every route a client writes to."""
    return check_protocol(request.headers.get(PROTOCOL_HEADER), PROTOCOL_HEADER)


class _Row(Protocol):
    @property
    def id(self) -> int | None: ...


def stored_id(row: _Row) -> int:
    """The id of a row read from the database (the models type it ``int | None``: a row not
    flushed yet has none)."""
    if row.id is None:
        raise ValueError(f"a {type(row).__name__} row that was never stored")
    return row.id
