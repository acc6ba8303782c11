"""The native episode format as JSON Schema, and the list of advantage schemes."""

from __future__ import annotations

from fastapi import APIRouter

from estimators import available

from ..compute import BASELINES, DEFAULT_SCHEMES
from ..schemas import EpisodeIn

router = APIRouter(tags=["schema"])


@router.get("/api/schema/episode", summary="JSON Schema of the native episode format")
def episode_schema() -> dict:
    schema = EpisodeIn.model_json_schema()
    schema["$id"] = "/api/schema/episode"
    schema["title"] = "creditlens episode"
    return schema


@router.get("/api/schemes", summary="Advantage schemes accepted by /api/episodes/{slug}/advantages")
def schemes() -> dict:
    specs = available()
    return {
        "default": list(DEFAULT_SCHEMES),
        "baselines": list(BASELINES),
        "schemes": [
            {
                "name": "outcome",
                "label": "outcome (group baseline chosen by `baseline`)",
                "kind": "outcome",
                "needs_values": False,
                "description": "One number per episode from its group's scores, on every policy token.",
            },
            {
                "name": "oracle",
                "label": "oracle (true turn values)",
                "kind": "turn",
                "needs_values": False,
                "description": "A_k = r_k + gamma V_{k+1} - V_k with meta.turn_values; only for episodes that have them.",
            },
            {
                "name": "uploaded",
                "label": "uploaded advantages",
                "kind": "token",
                "needs_values": False,
                "description": "The advantages stored with the episode (meta.uploaded_advantages, e.g. from NeMo-RL dumps).",
            },
        ]
        + [
            {
                "name": s.name,
                "label": s.label,
                "kind": s.kind,
                "needs_values": s.needs_values,
                "description": s.description,
                "params": s.params,
            }
            for s in specs.values()
        ],
    }
