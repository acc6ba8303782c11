"""Fast JSON responses for the big per-token payloads (orjson when installed)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import Response

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
except ImportError:  # pragma: no cover - orjson is a dependency; this keeps the API working without it
    import numpy as np

    def _default(o: Any) -> Any:
        if isinstance(o, np.ndarray):
            return [None if (isinstance(x, float) and x != x) else x for x in o.tolist()]  # NaN -> null
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"not JSON serialisable: {type(o).__name__}")

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, default=_default).encode()


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(content=dumps(obj), status_code=status_code, media_type="application/json")
