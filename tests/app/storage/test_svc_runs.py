"""Runs: the /api/runs contract (201/409/404/401/403, delete), the per-step metrics stored at
ingest (checked against numbers computed by hand and against estimators.explained_variance), and
two concurrent posts of one step against a real server process."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from sqlalchemy import text

from app.core.schemas import EpisodeIn
from app.storage.db import make_engine
from app.storage.store import create_batch
from creditlens import wire
from estimators import explained_variance
from tests.app.svc_helpers import episode, jsonl, make_client, row_counts
from tests.live_server import Server


def new_run(client, name="grpo", config=None) -> dict:
    r = client.post("/api/runs", json={"name": name, "config": config or {"lr": 1e-6}})
    assert r.status_code == 201, r.text
    return r.json()


def post_step(client, run_id, step, episodes, **params):
    return client.post(f"/api/runs/{run_id}/steps/{step}", content=jsonl(episodes), params=params)


def stored_metrics(client, batch_id) -> dict:
    """The metrics as stored in the batch row (not recomputed by any request)."""
    with client.app.state.engine.connect() as conn:
        raw = conn.execute(text("SELECT metrics_json FROM batch WHERE id = :i"), {"i": batch_id}).scalar_one()
    return json.loads(raw)


# ---- the contract ------------------------------------------------------------------------------


def test_create_list_get_and_post_steps(client):
    run = new_run(client, "grpo-0.5b", {"lr": 1e-6, "n": 8})
    assert run["url"] == f"/r/{run['id']}" and len(run["delete_token"]) >= 24
    # The three ways POST /api/uploads takes a file: multipart, raw bytes with ?format=, JSON.
    eps = [episode(1.0, "a"), episode(0.0, "a")]
    r1 = client.post(f"/api/runs/{run['id']}/steps/0", files={"file": ("s.jsonl", jsonl(eps))})
    r2 = post_step(client, run["id"], 5, eps, format="native")
    r3 = client.post(f"/api/runs/{run['id']}/steps/2", json=eps)
    for r, step in ((r1, 0), (r2, 5), (r3, 2)):
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["step"] == step and len(body["episodes"]) == 2 and body["delete_token"]
    got = client.get(f"/api/runs/{run['id']}").json()
    assert (got["name"], got["config"], got["n_steps"]) == ("grpo-0.5b", {"lr": 1e-6, "n": 8}, 3)
    assert [s["step"] for s in got["steps"]] == [0, 2, 5]
    assert [s["batch_id"] for s in got["steps"]] == [
        r1.json()["batch_id"],
        r3.json()["batch_id"],
        r2.json()["batch_id"],
    ]
    assert got["steps"][0]["metrics"]["pass_rate"] == 0.5
    series = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert series["pass_rate"] == [[0, 0.5], [2, 0.5], [5, 0.5]]
    assert {"mean_score", "zero_variance_share"} <= set(series)
    assert "mean_entropy" not in series  # no step has entropy: no series
    listed = client.get("/api/runs").json()
    assert listed[0] == {
        k: got[k]
        for k in ("id", "ref", "visibility", "name", "url", "created_at", "n_steps", "last_step")
        + ("keep", "keep_every", "stored_bytes")
    }
    assert got["stored_bytes"] == sum(s["stored_bytes"] for s in got["steps"]) > 0
    assert (got["last_step"], listed[0]["last_step"]) == (5, 5)
    assert client.get("/api/runs", params={"name": "other"}).json() == []
    # The step's batch is a normal batch: its page and API work.
    assert client.get(f"/api/batches/{r1.json()['batch_id']}").json()["n_episodes"] == 2


def test_list_pages_newest_first_with_the_total_and_never_an_unlisted_run(client):
    """limit/offset page the public runs newest first; X-Total-Count counts them all; a run's
    n_steps and last_step are its own; an unlisted run is in no page and no total."""
    runs = [new_run(client, f"page-{i}") for i in range(5)]
    quiet = client.post("/api/runs", json={"name": "page-quiet", "visibility": "unlisted"}).json()
    assert post_step(client, quiet["ref"], 0, [episode(1.0)]).status_code == 201
    for step in (3, 7):
        assert post_step(client, runs[1]["id"], step, [episode(1.0), episode(0.0)]).status_code == 201
    newest_first = [r["id"] for r in reversed(runs)]
    seen, totals = [], set()
    for offset in (0, 2, 4):
        r = client.get("/api/runs", params={"limit": 2, "offset": offset})
        assert r.status_code == 200
        totals.add(r.headers["x-total-count"])
        seen += r.json()
    assert totals == {"5"}
    assert [x["id"] for x in seen] == newest_first
    assert quiet["id"] not in {x["id"] for x in seen}
    by_id = {x["id"]: x for x in seen}
    assert (by_id[runs[1]["id"]]["n_steps"], by_id[runs[1]["id"]]["last_step"]) == (2, 7)
    assert (by_id[runs[0]["id"]]["n_steps"], by_id[runs[0]["id"]]["last_step"]) == (0, None)
    past = client.get("/api/runs", params={"offset": 5})
    assert past.json() == [] and past.headers["x-total-count"] == "5"
    named = client.get("/api/runs", params={"name": "page-quiet"})
    assert named.json() == [] and named.headers["x-total-count"] == "0"
    named = client.get("/api/runs", params={"name": "page-3"})
    assert [x["id"] for x in named.json()] == [runs[3]["id"]] and named.headers["x-total-count"] == "1"
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}):
        assert client.get("/api/runs", params=bad).status_code == 422


def test_existing_step_is_409_and_nothing_changes(client):
    run = new_run(client)
    assert post_step(client, run["id"], 3, [episode()]).status_code == 201
    before = row_counts(client)
    r = post_step(client, run["id"], 3, [episode(), episode()])
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "step_exists" and r.json()["error"]["field"] == "step"
    assert row_counts(client) == before


def test_bad_step_upload_stores_nothing_and_the_step_stays_free(client):
    run = new_run(client)
    r = post_step(client, run["id"], 1, [episode(), episode(values=[0.0])])
    assert r.status_code == 422 and r.json()["error"]["episode"] == 2
    assert row_counts(client) == (0, 0)
    assert post_step(client, run["id"], 1, [episode()]).status_code == 201


def test_unknown_run_and_bad_arguments(client):
    assert client.get("/api/runs/99").status_code == 404
    assert client.get("/api/runs/99/metrics").status_code == 404
    assert client.get(f"/api/runs/{2**63}").status_code == 404
    r = post_step(client, 99, 0, [episode()])
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    run = new_run(client)
    assert post_step(client, run["id"], -1, [episode()]).status_code == 422
    assert client.post("/api/runs", json={"config": {}}).status_code == 422
    assert client.post("/api/runs", json={"name": "x", "config": [1]}).status_code == 422
    assert row_counts(client) == (0, 0)


def test_delete_run_needs_its_token_and_removes_its_batches_and_episodes(client):
    run = new_run(client)
    post_step(client, run["id"], 0, [episode(), episode()])
    post_step(client, run["id"], 1, [episode()])
    other = client.post("/api/uploads", files={"file": ("x.jsonl", jsonl([episode()]))})
    assert row_counts(client) == (3, 4)
    assert client.delete(f"/api/runs/{run['id']}", params={"token": "wrong"}).status_code == 403
    assert client.delete(f"/api/runs/{run['id']}").status_code == 403
    assert row_counts(client) == (3, 4)
    r = client.delete(f"/api/runs/{run['id']}", headers={"x-delete-token": run["delete_token"]})
    assert r.status_code == 204
    assert row_counts(client) == (1, 1)  # the plain upload stays
    assert client.get(f"/api/batches/{other.json()['batch_id']}").status_code == 200
    assert client.get(f"/api/runs/{run['id']}").status_code == 404
    assert client.delete(f"/api/runs/{run['id']}", params={"token": run["delete_token"]}).status_code == 404


def test_write_token_applies(db_url):
    with make_client(db_url, write_token="s3cret") as c:
        assert c.post("/api/runs", json={"name": "x"}).status_code == 401
        auth = {"authorization": "Bearer s3cret"}
        run = c.post("/api/runs", json={"name": "x"}, headers=auth).json()
        assert post_step(c, run["id"], 0, [episode()]).status_code == 401
        ok = c.post(f"/api/runs/{run['id']}/steps/0", content=jsonl([episode()]), headers=auth)
        assert ok.status_code == 201
        assert c.delete(f"/api/runs/{run['id']}", params={"token": run["delete_token"]}).status_code == 401
        assert c.get(f"/api/runs/{run['id']}").status_code == 200  # reading needs no token
        r = c.delete(f"/api/runs/{run['id']}", params={"token": run["delete_token"]}, headers=auth)
        assert r.status_code == 204


def test_the_unique_constraint_decides_a_step(client):
    """Two writers that both passed the existence check: the database lets exactly one in."""
    from sqlalchemy.exc import IntegrityError
    from sqlmodel import Session

    run = new_run(client)
    ep = EpisodeIn(**episode())
    with Session(client.app.state.engine) as s:
        from app.storage.store import create_batch_streaming

        create_batch_streaming(s, [(1, ep)], name="a", source="run:native", run_id=run["id"], step=7)
        with pytest.raises(IntegrityError):
            create_batch_streaming(s, [(1, ep)], name="b", source="run:native", run_id=run["id"], step=7)
    assert row_counts(client) == (1, 1)
    # Plain batches (run_id NULL) never collide with each other.
    with Session(client.app.state.engine) as s:
        create_batch(s, [ep], name="u1", source="upload")
        create_batch(s, [ep], name="u2", source="upload")
    assert row_counts(client) == (3, 3)


# ---- the metrics -------------------------------------------------------------------------------


def hand_batch() -> tuple[bytes, dict]:
    """Four episodes as a safetensors file (padding 255) and the metrics computed by hand."""
    P, A, TL, PAD = 0, 1, 2, 255
    kinds = np.array([[P, A, A, TL, A], [P, A, A, A, PAD], [P, P, A, A, A], [P, P, A, A, A]], np.uint8)
    reward = np.array([1.0, 0.0, 1.0, 1.0])  # group 0: pass/fail; group 1: both pass (zero variance)
    advantages = np.array(
        [[0.5, 1, 1, 0, 1], [0, -1, -1, -1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.float64
    )  # 0.5 on a prompt token: the bug nonpolicy_advantage_share shows
    entropy = np.array([[9, 1, 2, 9, 3], [9, 1, 1, 1, 0], [9, 9, 2, 2, 2], [9, 9, 0, 0, 0]], np.float64)
    logprobs = np.full((4, 5), -1.0)
    ref = logprobs.copy()
    ref[0] = -1.5  # KL term 0.5 on e0's 3 policy tokens
    rollout = logprobs.copy()
    rollout[1, 1:4] = -1.2  # log-ratio +0.2 on e1's policy tokens
    rollout[3, 4] = -0.7  # -0.3 on one token of e3
    values = np.array(
        [[0, 0.5, 0.8, 0, 0.9], [0, 0.2, 0.1, 0.0, 0], [0, 0, 1, 1, 1], [0, 0, 0.6, 0.6, 0.6]], np.float64
    )
    tensors = {
        "kinds": kinds,
        "token_ids": np.arange(20, dtype=np.int64).reshape(4, 5),
        "reward": reward,
        "groups": np.array([0, 0, 1, 1], np.int64),
        "advantages": advantages,
        "entropy": entropy,
        "logprobs": logprobs,
        "ref_logprobs": ref,
        "rollout_logprobs": rollout,
        "values": values,
    }
    calls = [{"effect": "decisive_edit"}, {"effect": "read_file"}]  # e0's two policy runs: 2 and 1 tokens
    body = wire.encode(tensors, {"meta": [{"calls": calls}, {}, {}, {}]})
    policy = kinds == A
    returns = np.array([[1.0] * 3, [0.0] * 3, [1.0] * 3, [1.0] * 3]).ravel()
    ev = explained_variance(torch.tensor(values[policy]), torch.tensor(returns)).item()
    expected = {
        "n_episodes": 4,
        "pass_rate": 0.75,
        "mean_score": 0.75,
        "zero_variance_share": 0.5,
        "zero_variance_all_pass_share": 0.5,
        "zero_variance_all_fail_share": 0.0,
        "mean_policy_tokens": 3.0,
        "mean_tool_tokens": 0.25,
        "mean_abs_advantage": 6 / 12,
        "nonpolicy_advantage_share": 0.5 / 6.5,
        "mean_entropy": 15 / 12,
        "mean_kl": 1.5 / 12,
        "mean_log_ratio": (0.6 - 0.3) / 12,
        "max_abs_log_ratio": 0.3,
        "explained_variance": ev,
        # e0 passes with RLOO advantage 1 - 0 = 1: credit 2 on the decisive edit, 1 on the read.
        "useless_credit_share": 1 / 3,
        # Bypass PPO on e1's log-ratio +0.2 with A = -1 (the pessimistic side) and e3's -0.3 with
        # A = 0: nothing clipped or masked (tests/app/compute/test_svc_loss_metrics.py checks both).
        "clip_fraction": 0.0,
        "masked_fraction": 0.0,
        # e0 and e1 (the episodes with |A|) both have 3 policy tokens: no slope.
        "length_bias_slope": None,
        # No episode's meta names drift: 0 of 4 episodes, 0 of 12 policy tokens.
        "drift_episode_share": 0.0,
        "drift_token_share": 0.0,
    }
    return body, expected


def test_metrics_of_a_hand_computed_step_are_stored_at_ingest(client):
    body, expected = hand_batch()
    run = new_run(client)
    r = client.post(f"/api/runs/{run['id']}/steps/4", content=body, params={"format": "safetensors"})
    assert r.status_code == 201, r.text
    got = stored_metrics(client, r.json()["batch_id"])
    # The step carries the trainer's advantages, so it was also audited: its error count is the
    # audit's own (checked against the corpus in test_steps_with_trainer_advantages_are_audited...).
    audit = client.get(f"/api/batches/{r.json()['batch_id']}/audit").json()
    assert got.pop("audit_errors") == audit["n_errors"]
    assert got.pop("audit_warnings") == sum(f["severity"] == "warning" for f in audit["findings"])
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert got[name] == (None if want is None else pytest.approx(want, abs=1e-12)), name
    assert 0 < expected["explained_variance"] < 1  # a real check, not the degenerate 0 or 1
    api = client.get(f"/api/runs/{run['id']}").json()["steps"][0]["metrics"]
    assert api == {**got, "audit_errors": audit["n_errors"], "audit_warnings": api["audit_warnings"]}
    series = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert series["mean_kl"] == [[4, pytest.approx(0.125)]]


def test_metrics_without_optional_fields_are_null(client):
    run = new_run(client)
    eps = [episode(0.0, "g"), episode(0.0, "g"), episode(2.0, None, n_policy=4)]
    r = post_step(client, run["id"], 0, eps)
    m = stored_metrics(client, r.json()["batch_id"])
    assert m["zero_variance_all_fail_share"] == pytest.approx(2 / 3)
    assert m["mean_score"] == pytest.approx(2 / 3) and m["pass_rate"] == pytest.approx(1 / 3)
    assert m["mean_policy_tokens"] == pytest.approx(10 / 3)
    for name in ("mean_abs_advantage", "mean_entropy", "mean_kl", "mean_log_ratio", "explained_variance"):
        assert m[name] is None


def test_plain_uploads_carry_no_run_and_no_metrics(client):
    r = client.post("/api/uploads", files={"file": ("x.jsonl", jsonl([episode()]))})
    with client.app.state.engine.connect() as conn:
        row = conn.execute(
            text("SELECT run_id, step, metrics_json, source FROM batch WHERE id = :i"),
            {"i": r.json()["batch_id"]},
        ).one()
    assert tuple(row) == (None, None, None, "upload:native")


# ---- a real server: two concurrent posts of one step ---------------------------------------------


@pytest.mark.slow
def test_concurrent_posts_of_one_step_one_wins(tmp_path):
    with Server(tmp_path / "race.db", tmp_path / "server.log") as srv:
        run = httpx.post(f"{srv.base}/api/runs", json={"name": "race"}).json()
        body = jsonl([episode(float(i % 2), f"g{i // 4}") for i in range(400)])
        url = f"{srv.base}/api/runs/{run['id']}/steps/9"
        barrier = threading.Barrier(4)
        codes: list[int] = []

        def post() -> None:
            barrier.wait()
            codes.append(httpx.post(url, content=body, params={"format": "native"}, timeout=120).status_code)

        threads = [threading.Thread(target=post) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes) == [201, 409, 409, 409]
        steps = httpx.get(f"{srv.base}/api/runs/{run['id']}").json()["steps"]
        assert [(s["step"], s["n_episodes"]) for s in steps] == [(9, 400)]
    engine = make_engine(f"sqlite:///{tmp_path / 'race.db'}")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM episode")).scalar_one() == 400
    engine.dispose()


# ---- the audit on the timeline -------------------------------------------------------------------


def test_steps_with_trainer_advantages_are_audited_for_the_timeline(client):
    """A step whose episodes carry the trainer's advantages is audited at ingest and its number
    of error findings is one of the stored metrics (`audit_errors`); a step without them is
    stored unaudited. The counts are the corpus manifest's (verl's GAE run with a response mask
    over tool tokens: 2 error findings; verl's correct GAE: none)."""
    corpus = Path(__file__).resolve().parents[3] / "fixtures" / "audit"
    manifest = json.loads((corpus / "manifest.json").read_text())
    run = new_run(client, "audited")
    for step, case in ((0, "gae_tool_mask"), (1, "clean_gae")):
        data = (corpus / manifest[case]["file"]).read_bytes()
        r = client.post(f"/api/runs/{run['id']}/steps/{step}", content=data, params={"format": "native"})
        assert r.status_code == 201, r.text
    r = post_step(client, run["id"], 2, [episode(1.0, "a"), episode(0.0, "a")])
    assert r.status_code == 201, r.text
    want = {
        case: sum(f["severity"] == "error" for f in manifest[case]["findings"])
        for case in ("gae_tool_mask", "clean_gae")
    }
    assert want == {"gae_tool_mask": 2, "clean_gae": 0}
    series = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert series["audit_errors"] == [[0, 2], [1, 0]]  # step 2 has no advantages: not audited
    first = client.get(f"/api/runs/{run['id']}").json()["steps"][0]
    assert stored_metrics(client, first["batch_id"])["audit_errors"] == 2
    assert client.get(f"/api/batches/{first['batch_id']}/audit").json()["n_errors"] == 2
