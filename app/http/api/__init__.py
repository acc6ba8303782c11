"""The JSON API: one router per resource, combined here (app/main.py includes ``router``)."""

from fastapi import APIRouter

from app.http.api import audit, batches, episodes, logged_metrics, losses, runs, schema, trainers, uploads

router = APIRouter()
for _mod in (uploads, episodes, batches, audit, runs, logged_metrics, schema, trainers, losses):
    router.include_router(_mod.router)
