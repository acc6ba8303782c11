"""Prompt history (GET /api/runs/{id}/prompts): the same prompt followed across steps, keyed by its
tokens, counted over every episode of a step, kept or not. The real app on a real SQLite file;
expected numbers worked out by hand in the comments."""

from __future__ import annotations

import pytest

from tests.app.svc_helpers import jsonl


def ep(prompt: list[str], reward: float, adv: float, group: str, n_resp: int = 2) -> dict:
    return {
        "tokens": prompt + [f"r{i}" for i in range(n_resp)],
        "kinds": ["prompt"] * len(prompt) + ["policy"] * n_resp,
        "reward": reward,
        "group": group,
        "advantages": [0.0] * len(prompt) + [adv] * n_resp,
    }


A = ["What", " is", " 2+2?"]
B = ["Name", " a", " cat."]


def post(client, run, step, eps):
    r = client.post(f"/api/runs/{run['ref']}/steps/{step}", content=jsonl(eps), params={"format": "native"})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_prompt_followed_over_the_steps(client):
    run = client.post("/api/runs", json={"name": "prompts", "keep": 2}).json()
    # Step 0: A four times (uid u1, 1 of 4 passes), B twice (uid u2). Keep 2: one group of 2 or
    # less is stored, so most of A's episodes are dropped, yet they all count.
    s0 = post(
        client,
        run,
        0,
        [ep(A, 1.0, 0.5, "u1"), ep(A, 0.0, -0.5, "u1"), ep(A, 0.0, 1.5, "u1"), ep(A, 0.0, 0.5, "u1")]
        + [ep(B, 1.0, 0.25, "u2"), ep(B, 1.0, 0.25, "u2")],
    )
    # Step 3: A again under a new uid (verl's uid changes every step), 2 of 2 pass.
    s3 = post(client, run, 3, [ep(A, 1.0, 2.0, "u9"), ep(A, 1.0, 2.0, "u9")])
    r = client.get(f"/api/runs/{run['ref']}/prompts")
    assert r.status_code == 200 and r.headers["X-Total-Count"] == "2"
    prompts = r.json()
    a, b = prompts  # A first: seen in 2 steps
    assert a["prompt"] == "What is 2+2?" and b["prompt"] == "Name a cat."
    assert [s["step"] for s in a["steps"]] == [0, 3]
    first, second = a["steps"]
    # Step 0: 4 episodes, 1 passed; |A| on the 8 policy tokens: 2 x (0.5 + 0.5 + 1.5 + 0.5) / 8 = 0.75.
    assert (first["n"], first["pass_rate"], first["mean_abs_adv"]) == (4, 0.25, pytest.approx(0.75))
    assert first["batch_id"] == s0["batch_id"] and first["group"] == "u1"
    assert first["n_kept"] == 0 and first["group_url"] is None  # A's group of 4 does not fit keep=2
    assert (second["n"], second["pass_rate"], second["mean_abs_adv"]) == (2, 1.0, 2.0)
    assert second["batch_id"] == s3["batch_id"] and second["group_url"] == f"/b/{s3['batch_id']}/g/u9"
    assert b["steps"][0]["n_kept"] == 2  # B's group of 2 is the one kept at step 0
    # One prompt, by its key; the page's JSON twin says the same.
    one = client.get(f"/api/runs/{run['ref']}/prompts/{a['key']}").json()
    assert one["steps"] == a["steps"] and a["url"] == f"/r/{run['ref']}/prompts/{a['key']}"
    page = client.get(a["url"], headers={"accept": "text/html"})
    assert page.status_code == 200 and a["key"] in page.text
    twin = client.get(a["url"], headers={"accept": "application/json"}).json()
    assert twin["data"]["steps"] == a["steps"]


def test_keys_follow_the_tokens(client):
    run = client.post("/api/runs", json={"name": "keys"}).json()
    post(client, run, 0, [ep(A, 1.0, 0.1, "x"), ep(["What", " is", " 2+3?"], 1.0, 0.1, "x")])
    keys = [p["key"] for p in client.get(f"/api/runs/{run['ref']}/prompts").json()]
    assert len(set(keys)) == 2 and all(len(k) == 16 for k in keys)


def test_paging_and_unknowns(client):
    run = client.post("/api/runs", json={"name": "paging"}).json()
    post(client, run, 0, [ep([f"q{i}"], 1.0, 0.1, f"g{i}") for i in range(5)])
    page = client.get(f"/api/runs/{run['ref']}/prompts", params={"limit": 2, "offset": 4})
    assert len(page.json()) == 1 and page.headers["X-Total-Count"] == "5"
    assert client.get(f"/api/runs/{run['ref']}/prompts/ffffffffffffffff").status_code == 404
    assert client.get("/api/runs/987654/prompts").status_code == 404
    r = client.get(f"/api/runs/{run['ref']}/prompts", params={"limit": 0})
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"
