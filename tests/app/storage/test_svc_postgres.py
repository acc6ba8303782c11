"""The same store and API on PostgreSQL (CREDITLENS_TEST_PG_URL; .ci/run sets it)."""

from __future__ import annotations

import secrets

import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from tests.app.svc_helpers import FORMATS, episode, upload

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_client(postgres):
    with TestClient(create_app(Settings(database_url=postgres.fresh()))) as c:
        yield c


def test_round_trip_advantages_and_delete_on_postgresql(pg_client):
    c = pg_client
    name = "pg-" + secrets.token_hex(6)  # the database outlives the test
    eps = [episode(reward=1.0, values=[0, 0, 0.25, 1 / 3, 0.5]), episode(reward=0.0, values=[0.0] * 5)]
    body = upload(c, eps, name=name).json()
    got = c.get(f"/api/episodes/{body['episodes'][0]['slug']}").json()
    assert got["values"] == eps[0]["values"] and got["kinds"] == eps[0]["kinds"]
    a = c.get(f"/api/episodes/{body['episodes'][0]['slug']}/advantages").json()
    assert a["schemes"][0]["advantages"][2:] == [1.0, 1.0, 1.0]  # RLOO in a pair: 1 - 0
    b = c.get(f"/api/batches/{body['batch_id']}").json()
    assert b["name"] == name and b["created_at"].endswith("Z") and b["diagnostics"]["pass_rate"] == 0.5
    assert [x["name"] for x in c.get("/api/batches", params={"q": name.upper()}).json()] == [name]
    # A bad upload leaves nothing behind.
    r = upload(c, [episode(), episode(values=[1.0])], name=name + "-bad")
    assert r.status_code == 422
    assert c.get("/api/batches", params={"q": name + "-bad"}).json() == []
    chat = c.post("/api/uploads", files={"file": ("c.jsonl", (FORMATS / "openai_chat.jsonl").read_bytes())})
    assert chat.status_code == 201
    assert (
        c.delete(f"/api/batches/{body['batch_id']}", params={"token": body["delete_token"]}).status_code
        == 204
    )
    assert c.get(f"/api/batches/{body['batch_id']}").status_code == 404
    chat = chat.json()
    assert (
        c.delete(f"/api/batches/{chat['batch_id']}", params={"token": chat["delete_token"]}).status_code
        == 204
    )
