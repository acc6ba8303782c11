"""The one error shape for every 4xx answer.

``{"error": {"status", "code", "message", "line", "episode", "field"}}``: ``line`` is the 1-based
line of the uploaded file, ``episode`` the 1-based episode index within the upload, ``field`` the
offending field; each is null when it does not apply. Messages are sentences a person can act on.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A 4xx with a machine code and a human message; raise it anywhere in the service."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        line: int | None = None,
        episode: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.line = line
        self.episode = episode
        self.field = field

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.code, self.message, self.line, self.episode, self.field)


def error_body(
    status: int,
    code: str,
    message: str,
    line: int | None = None,
    episode: int | None = None,
    field: str | None = None,
) -> dict[str, Any]:
    """The JSON body of every 4xx answer."""
    return {
        "error": {
            "status": status,
            "code": code,
            "message": message,
            "line": line,
            "episode": episode,
            "field": field,
        }
    }


def where_prefix(line: int | None = None, episode: int | None = None) -> str:
    """'line 3, episode 2: ' (the start of every message about one place of an upload), or ''."""
    parts = [f"{name} {n}" for name, n in (("line", line), ("episode", episode)) if n is not None]
    return (", ".join(parts) + ": ") if parts else ""


def located(
    status: int, code: str, message: str, *, field: str | None = None, **where: int | None
) -> ApiError:
    """An ApiError about one place of an upload (``where``: ``line``, ``episode``): the message
    starts with :func:`where_prefix`."""
    return ApiError(status, code, where_prefix(**where) + message, field=field, **where)


def not_found(what: str) -> ApiError:
    return ApiError(
        404, "not_found", f"{what} was not found (it may have been deleted, or the link is mistyped)."
    )
