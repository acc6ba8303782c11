"""The wire protocol versions this server reads: what a client sends says which one it speaks.

The client (``creditlens.wire.PROTOCOL_VERSION``) sends its version in the ``X-Creditlens-Protocol``
header of every request, may send it as ``protocol`` in the body of ``POST /api/runs``, and writes
it into each safetensors file's metadata (``creditlens_protocol``). A request or file without one
is version 1 (clients from before the versioning). Every version up to :data:`PROTOCOL_VERSION`
is read; a newer one is a 400 naming both versions, so a client newer than its server says what to
upgrade instead of being misread. The constant is the server's own, not imported from the client
package: a newer client installed beside the server must not raise what the server claims.
"""

from __future__ import annotations

from app.core.errors import ApiError

__all__ = ["PROTOCOL_HEADER", "PROTOCOL_KEY", "PROTOCOL_VERSION", "check_protocol"]

PROTOCOL_VERSION = 1
PROTOCOL_HEADER = "X-Creditlens-Protocol"
PROTOCOL_KEY = "creditlens_protocol"


def check_protocol(value: object, field: str) -> int:
    """The protocol version ``value`` names (None: 1); ApiError 422 when it is not a positive
    integer, 400 when it is newer than this server's."""
    if value is None:
        return 1
    try:
        version = int(str(value).strip())
    except ValueError:
        version = 0
    if version < 1 or isinstance(value, bool):
        raise ApiError(
            422,
            "invalid_protocol",
            f"`{field}` must be a positive integer; got {str(value)[:40]!r}.",
            field=field,
        )
    if version > PROTOCOL_VERSION:
        raise ApiError(
            400,
            "protocol_too_new",
            f"this client speaks creditlens wire protocol {version}; this server reads protocol "
            f"{PROTOCOL_VERSION} and older. Upgrade the server (creditlens-server), or install a "
            f"client that speaks protocol {PROTOCOL_VERSION}.",
            field=field,
        )
    return version
