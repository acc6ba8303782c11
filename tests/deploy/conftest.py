"""Deployment tests: migrations on both databases, the Dockerfile replayed outside Docker."""

from __future__ import annotations

import os
import socket

import pytest

PG_URL = os.environ.get("CREDITLENS_TEST_PG_URL")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pg_url():
    if not PG_URL:
        pytest.skip("CREDITLENS_TEST_PG_URL is not set (.ci/run sets it after starting PostgreSQL)")
    return PG_URL
