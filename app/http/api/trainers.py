"""``GET /api/trainers``: every trainer's dialects on the canonical episodes, computed live."""

from __future__ import annotations

from functools import cache
from typing import Any

from fastapi import APIRouter

from app.core import urls
from app.core.schemas import TrainersOut
from estimators.conformance import table

router = APIRouter(tags=["trainers"])


@cache
def _table() -> dict[str, Any]:
    # The registry does not change after start-up: one computation (~2 s of CPU) serves every call.
    return table()


@router.get(urls.API_TRAINERS, response_model=TrainersOut)
def trainers() -> dict[str, Any]:
    """Each trainer (verl, TRL, OpenRLHF, SkyRL, AReaL, NeMo-RL, prime-rl, slime), the version its
    dialects reproduce, and what each of its estimators computes on a handful of canonical episodes
    (tool spans, a reward on a tool token, a group of one, an all-equal group, a truncated row, a
    rejected row) beside our reference, with the policy tokens where they differ."""
    return _table()
