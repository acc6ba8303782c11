"""Client tests: the service-test helpers (real app, real SQLite file) are reused from tests/app."""

from __future__ import annotations
