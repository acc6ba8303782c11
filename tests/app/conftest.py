"""The real app on a temp SQLite FILE, through FastAPI's TestClient (lifespan included)."""

from __future__ import annotations

import pytest
from svc_helpers import make_client


@pytest.fixture
def client(tmp_path):
    with make_client(tmp_path) as c:
        yield c
