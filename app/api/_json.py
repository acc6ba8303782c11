"""Fast JSON responses for the big per-token payloads (orjson when installed)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import Response

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
except ImportError:  # pragma: no cover

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, allow_nan=False).encode()


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(content=dumps(obj), status_code=status_code, media_type="application/json")
