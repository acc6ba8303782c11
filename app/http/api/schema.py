"""The native episode format as JSON Schema, and the list of advantage schemes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.core import schemes as sc
from app.core import urls
from app.core.schemas import EpisodeIn

router = APIRouter(tags=["schema"])


@router.get("/api/schema/episode", summary="JSON Schema of the native episode format")
def episode_schema() -> dict[str, Any]:
    schema = EpisodeIn.model_json_schema()
    schema["$id"] = urls.API_EPISODE_SCHEMA
    schema["title"] = "creditlens episode"
    return schema


@router.get("/api/schemes", summary="Advantage schemes accepted by /api/episodes/{slug}/advantages")
def schemes() -> dict[str, Any]:
    return {"default": list(sc.DEFAULT_SCHEMES), "baselines": list(sc.BASELINES), "schemes": sc.catalog()}
