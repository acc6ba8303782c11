"""One error shape for every 4xx, whatever raised it (our code, FastAPI's validation, the router)."""

from __future__ import annotations

import pytest

KEYS = {"status", "code", "message", "line", "episode", "field"}


@pytest.mark.parametrize(
    "method, url, status, code",
    [
        ("get", "/api/no/such/route", 404, "not_found"),
        ("get", "/api/episodes/AAAAAAAAAAAAAAAAAAAAAAAA", 404, "not_found"),
        ("get", "/api/episodes/AAAAAAAAAAAAAAAAAAAAAAAA/advantages", 404, "not_found"),
        ("get", "/api/batches/999", 404, "not_found"),
        ("get", "/api/batches/abc", 404, "not_found"),  # a batch ref: an id, or an unlisted slug
        ("get", "/api/batches/" + "a" * 65, 422, "invalid_request"),  # longer than any slug
        ("get", "/api/batches?limit=0", 422, "invalid_request"),
        ("put", "/api/uploads", 405, "method_not_allowed"),
        ("delete", "/api/batches/999", 404, "not_found"),
    ],
)
def test_every_4xx_has_the_one_shape(client, method, url, status, code):
    r = getattr(client, method)(url)
    assert r.status_code == status
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == KEYS
    assert body["error"]["status"] == status and body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and len(body["error"]["message"]) > 10


def test_validation_error_names_the_parameter(client):
    err = client.get("/api/batches?limit=0").json()["error"]
    assert err["field"] == "limit" and "limit" in err["message"]


def test_schema_and_health(client):
    schema = client.get("/api/schema/episode").json()
    assert schema["required"] == ["tokens", "kinds"]
    assert schema["properties"]["kinds"]["items"]["enum"] == ["prompt", "policy", "tool"]
    assert client.get("/healthz").json() == {"status": "ok"}
    names = [f["name"] for f in client.get("/api/formats").json()]
    assert set(names) == {
        "native",
        "openai_chat",
        "verl_pt",
        "verl_rollout",
        "rl_logging_board",
        "nemo_rl",
        "safetensors",
        "trl_completions",
        "slime_pt",
        "nemo_gym",
        "atropos",
        "verifiers",
        "tau_bench",
        "swe_agent",
        "agentbench",
        "openhands",
        "chat_trajectory",
        "agent_lightning",
        # the trainers' token dumps and the catch-all transcript reader
        "skyrl_dump",
        "prime_rl_tokens",
        "verifiers_trace",
        "miles_parquet",
        "transcript",
    }
    assert "/api/episodes/{slug}/advantages" in client.get("/openapi.json").json()["paths"]
