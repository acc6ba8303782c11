"""POST /api/samples end to end: the real app on a temp SQLite file through TestClient."""

import time

import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app


def _client(tmp_path, **settings):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'sim.db'}", **settings))
    return TestClient(app)


@pytest.fixture
def client(tmp_path):
    with _client(tmp_path) as c:
        yield c


def test_sample_with_critic_is_stored_and_served(client):
    r = client.post(
        "/api/samples",
        json={
            "env": "bugfix",
            "n_tasks": 3,
            "n_per_task": 4,
            "seed": 7,
            "critic": True,
            "critic_steps": 15,
            "call_cost": 0.05,
        },
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert len(body["episodes"]) == 12
    assert {"id", "slug", "url"} <= set(body["episodes"][0])
    d = body["diagnostics"]
    assert d["n_episodes"] == 12 and d["n_groups"] == 3
    assert set(d["critic"]) >= {"explained_variance_train", "explained_variance_fresh", "trace"}

    batch = client.get(f"/api/batches/{body['batch_id']}").json()
    assert batch["n_episodes"] == 12
    assert batch["source"] == "sample:bugfix"
    assert (
        batch["meta"]["diagnostics"]["critic"]["explained_variance_train"]
        == d["critic"]["explained_variance_train"]
    )

    slug = body["episodes"][0]["slug"]
    ep = client.get(f"/api/episodes/{slug}").json()
    assert ep["group"] == "limit" and ep["meta"]["task"] == "limit"
    assert ep["values"] is not None and len(ep["values"]) == len(ep["tokens"])
    assert len(ep["meta"]["turn_values"]) == len(ep["meta"]["calls"])

    # The critic's values feed token/turn GAE, and the true values the oracle row.
    adv = client.get(f"/api/episodes/{slug}/advantages?scheme=token_gae&scheme=turn_gae&scheme=oracle").json()
    names = [s["name"] for s in adv["schemes"]]
    assert names == ["token_gae", "turn_gae", "oracle"]
    assert [t["effect"] for t in adv["turns"]] == [c["effect"] for c in ep["meta"]["calls"]]


def test_same_request_same_episodes(client):
    req = {"n_tasks": 2, "n_per_task": 3, "seed": 5}
    a = client.post("/api/samples", json=req).json()
    b = client.post("/api/samples", json=req).json()
    ta = [client.get(f"/api/episodes/{e['slug']}").json()["tokens"] for e in a["episodes"]]
    tb = [client.get(f"/api/episodes/{e['slug']}").json()["tokens"] for e in b["episodes"]]
    assert ta == tb
    assert a["batch_id"] != b["batch_id"]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"n_tasks": 0}, "n_tasks"),
        ({"n_tasks": 21}, "n_tasks"),
        ({"n_per_task": 1000}, "n_per_task"),
        ({"env": "sokoban"}, "env"),
        ({"policy": {"bravery": 1.0}}, "policy"),
        ({"policy": {"temperature": 0.0}}, "policy"),
        ({"call_cost": -1}, "call_cost"),
        ({"unexpected": 1}, "unexpected"),
    ],
)
def test_bad_parameters_answer_422_in_the_error_shape(client, body, field):
    r = client.post("/api/samples", json=body)
    assert r.status_code == 422
    err = r.json()["error"]
    assert set(err) == {"status", "code", "message", "line", "episode", "field"}
    assert err["status"] == 422 and err["field"] == field and err["message"]


def test_async_job_reports_progress_then_the_batch(client):
    r = client.post("/api/samples?async=true", json={"n_tasks": 4, "n_per_task": 2, "seed": 1})
    assert r.status_code == 202
    url = r.json()["url"]
    seen = []
    for _ in range(600):
        job = client.get(url).json()
        seen.append(job["progress"])
        if job["state"] in ("done", "error"):
            break
        time.sleep(0.05)
    assert job["state"] == "done", job
    assert job["progress"] == 1.0 and seen == sorted(seen)
    assert client.get(f"/api/batches/{job['batch_id']}").json()["n_episodes"] == 8
    missing = client.get("/api/samples/jobs/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_write_token_is_enforced(tmp_path):
    with _client(tmp_path, write_token="s3cret") as c:
        assert c.post("/api/samples", json={"n_tasks": 1, "n_per_task": 1}).status_code == 401
        wrong = c.post(
            "/api/samples", json={"n_tasks": 1, "n_per_task": 1}, headers={"authorization": "Bearer no"}
        )
        assert wrong.status_code == 403
        ok = c.post(
            "/api/samples", json={"n_tasks": 1, "n_per_task": 1}, headers={"authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 201


def test_sample_page_and_options(client):
    page = client.get("/sample")
    assert page.status_code == 200
    assert 'id="sample-form"' in page.text and "/static/sample.js" in page.text and "<progress" in page.text
    opts = client.get("/api/samples/options").json()
    assert len(opts["tasks"]) == 20 and "exploit_propensity" in opts["policy"]


def test_monte_carlo_truth_option(client):
    r = client.post("/api/samples", json={"n_tasks": 2, "n_per_task": 2, "truth": "mc", "n_rollouts": 4})
    assert r.status_code == 201
    ep = client.get(f"/api/episodes/{r.json()['episodes'][0]['slug']}").json()
    assert ep["meta"]["n_rollouts"] == 4
    assert len(ep["meta"]["turn_values"]) == len(ep["meta"]["turn_values_exact"]) == len(ep["meta"]["calls"])
    # With 4 rollouts of a 0/1 outcome the estimate is a multiple of 1/4.
    assert all(abs(v * 4 - round(v * 4)) < 1e-6 for v in ep["meta"]["turn_values"])


def test_large_synchronous_request_is_sent_to_the_background(client):
    """20 x 64 attempts would keep a request busy for a minute: 413 naming the fix, nothing stored."""
    before = client.get("/api/batches").json()
    r = client.post("/api/samples", json={"n_tasks": 20, "n_per_task": 64})
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "use_async" and "1280 episodes" in err["message"] and "async=true" in err["message"]
    r = client.post(
        "/api/samples", json={"n_tasks": 2, "n_per_task": 2, "critic": True, "critic_steps": 1000}
    )
    assert r.status_code == 413 and "critic steps" in r.json()["error"]["message"]
    assert client.get("/api/batches").json() == before
