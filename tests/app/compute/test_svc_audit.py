"""GET /api/batches/{id}/audit on the real app: the corpus of fixtures/audit/ uploaded through
POST /api/uploads, the cache, the 409 / 413 / upload errors, and the episode page's audit rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sqlalchemy import text

from app.compute.audit import Stats
from app.storage.audits import error_count, error_counts
from estimators.audit import CAP
from tests.app.svc_helpers import episode, make_client, upload

CORPUS = Path(__file__).resolve().parents[3] / "fixtures" / "audit"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())


def upload_case(client, case: str) -> dict:
    data = (CORPUS / MANIFEST[case]["file"]).read_bytes()
    r = client.post("/api/uploads", files={"file": (MANIFEST[case]["file"], data)})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(scope="module")
def corpus_client(module_db_url):
    """An app with every corpus case uploaded, shared by the module's tests (on PostgreSQL a database
    of its own, which the other tests' fresh databases leave alone)."""
    with make_client(module_db_url) as c:
        created = {case: upload_case(c, case) for case in sorted(MANIFEST)}
        yield c, created


@pytest.mark.parametrize("case", sorted(MANIFEST))
def test_corpus_case_through_the_service(corpus_client, case):
    client, created = corpus_client
    spec = MANIFEST[case]
    up = created[case]
    r = client.get(f"/api/batches/{up['batch_id']}/audit")
    assert r.status_code == 200, r.text
    out = r.json()
    bm = out["best_match"]
    assert (bm["scheme"], bm["params"]) == (spec["best_match"]["scheme"], spec["best_match"]["params"])
    assert bm["max_abs_diff"] < 1e-9 and bm["share_within_1e-5"] == 1.0
    assert out["searched"] > 50
    assert [(f["code"], f["severity"]) for f in out["findings"]] == [
        (f["code"], f["severity"]) for f in spec["findings"]
    ]
    slugs = [e["slug"] for e in up["episodes"]]  # upload order = the manifest's episode indices
    episodes = [json.loads(line) for line in (CORPUS / spec["file"]).read_text().splitlines()]
    for f, want in zip(out["findings"], spec["findings"], strict=True):
        assert f["token_count"] == want["token_count"]
        assert f["tokens"] == want["tokens"][:CAP]
        assert f["episodes"] == want["episodes"]
        assert f["slugs"] == [slugs[i] for i in want["episodes"]]
        e, p = want["tokens"][0]
        kinds = episodes[e]["kinds"]
        view = "scheme=uploaded,audit_reference,audit_diff&gamma=1&lam=0.95&baseline=rloo&critic=upload"
        if kinds[p] == "tool":  # the link opens the tool span the token sits in
            start = p
            while kinds[start - 1] == "tool":
                start -= 1
            view += f"&open={start}"
        assert f["first"] == {
            "episode": e,
            "position": p,
            "slug": slugs[e],
            "url": f"/e/{slugs[e]}?{view}&tok={p}",
        }
    assert out["n_errors"] == sum(f["severity"] == "error" for f in spec["findings"])
    with _session(client) as s:
        assert error_count(s, up["batch_id"]) == out["n_errors"]


def _session(client):
    from sqlmodel import Session

    return Session(client.app.state.engine)


def test_clean_batches_have_no_error_finding(corpus_client):
    client, created = corpus_client
    for case in ("clean_gae", "clean_grpo"):
        out = client.get(f"/api/batches/{created[case]['batch_id']}/audit").json()
        assert out["findings"] == [] and out["n_errors"] == 0


def test_audit_is_computed_once_and_stored(db_url):
    with make_client(db_url) as client:
        up = upload_case(client, "reward_row_end")
        bid = up["batch_id"]
        with _session(client) as s:
            assert error_count(s, bid) is None  # not audited yet
        before = Stats.computed
        first = client.get(f"/api/batches/{bid}/audit").json()
        assert Stats.computed == before + 1
        second = client.get(f"/api/batches/{bid}/audit").json()
        assert Stats.computed == before + 1  # the cache answered
        assert second == first
        with client.app.state.engine.connect() as conn:
            rows = conn.execute(text("SELECT batch_id, n_errors, searched FROM batch_audit")).all()
            refs = conn.execute(
                text("SELECT COUNT(*) FROM episode_audit WHERE batch_id = :b"), {"b": bid}
            ).scalar()
        assert rows == [(bid, 1, first["searched"])] and refs == 16
        with _session(client) as s:
            assert error_count(s, bid) == 1
            assert error_counts(s, [bid, bid + 1000]) == {bid: 1}
        # Deleting an episode moves the indices: the stale audit is recomputed, not served.
        slug = up["episodes"][0]["slug"]
        r = client.delete(f"/api/episodes/{slug}", headers={"X-Delete-Token": up["delete_token"]})
        assert r.status_code == 204
        with _session(client) as s:
            assert error_count(s, bid) is None
        third = client.get(f"/api/batches/{bid}/audit").json()
        assert Stats.computed == before + 2
        assert third["findings"][0]["episodes"] == list(range(15))
        # Deleting the batch takes its audit rows with it.
        r = client.delete(f"/api/batches/{bid}", headers={"X-Delete-Token": up["delete_token"]})
        assert r.status_code == 204
        with client.app.state.engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM batch_audit")).scalar() == 0
            assert conn.execute(text("SELECT COUNT(*) FROM episode_audit")).scalar() == 0


def test_batch_without_advantages_is_409_naming_the_field(client):
    r = upload(client, [episode(1.0), episode(0.0)])
    bid = r.json()["batch_id"]
    r = client.get(f"/api/batches/{bid}/audit")
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "no_advantages" and err["field"] == "advantages"
    assert "`advantages`" in err["message"] and "verl_pt" in err["message"] and "nemo_rl" in err["message"]
    assert "none of its episodes" in err["message"]
    # The batch answer says so up front, with the same message, so the page never asks.
    audit = client.get(f"/api/batches/{bid}").json()["audit"]
    assert audit == {
        "possible": False,
        "code": "no_advantages",
        "reason": err["message"],
        "url": f"/api/batches/{bid}/audit",
    }


def test_partly_missing_advantages_names_the_first_episode(client):
    with_adv = episode(1.0, advantages=[0.0, 0.0, 0.5, 0.5, 0.5])
    r = upload(client, [with_adv, episode(0.0), with_adv])
    r = client.get(f"/api/batches/{r.json()['batch_id']}/audit")
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["episode"] == 2 and "1 of its 3 episodes" in err["message"] and "episode 2" in err["message"]
    bid = r.url.path.split("/")[3]
    assert client.get(f"/api/batches/{bid}").json()["audit"]["reason"] == err["message"]
    whole = upload(client, [with_adv, with_adv]).json()["batch_id"]
    assert client.get(f"/api/batches/{whole}").json()["audit"]["possible"] is True


def test_audit_of_an_unknown_batch_is_404(client):
    assert client.get("/api/batches/987654/audit").status_code == 404


def test_work_budget_is_413_saying_what_to_reduce(db_url):
    with make_client(db_url, audit_max_cells=100) as client:
        up = upload_case(client, "clean_grpo")
        r = client.get(f"/api/batches/{up['batch_id']}/audit")
        assert r.status_code == 413
        msg = r.json()["error"]["message"]
        assert "17 episodes" in msg and "CREDITLENS_AUDIT_MAX_CELLS" in msg and "fewer" in msg
        audit = client.get(f"/api/batches/{up['batch_id']}").json()["audit"]
        assert audit["possible"] is False and audit["code"] == "audit_too_large" and audit["reason"] == msg


@pytest.mark.parametrize(
    ("advantages", "needle"),
    [([0.0, 0.0, float("nan"), 0.0, 0.0], "advantages"), ([0.0, 0.0, 1.0], "advantages")],
)
def test_bad_advantages_are_the_uploads_usual_4xx(client, advantages, needle):
    good = episode(1.0, advantages=[0.0] * 5)
    bad = episode(0.0, advantages=advantages)
    body = json.dumps(good) + "\n" + json.dumps(bad).replace("NaN", "NaN") + "\n"
    r = client.post("/api/uploads", files={"file": ("eps.jsonl", body)})
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["line"] == 2 and err["episode"] == 2 and needle in (err["field"] or "")
    assert err["message"].startswith("line 2, episode 2:")
    with client.app.state.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM batch")).scalar() == 0


def test_episode_rows_reference_and_diff(corpus_client):
    client, created = corpus_client
    up = created["gae_truncated"]
    spec = MANIFEST["gae_truncated"]["findings"][0]
    e, p = spec["tokens"][0]
    slug = up["episodes"][e]["slug"]
    r = client.get(
        f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded,audit_reference,audit_diff"}
    )
    assert r.status_code == 200, r.text
    d = r.json()
    rows = {s["name"]: s["advantages"] for s in d["schemes"]}
    up_row, ref, diff = rows["uploaded"], rows["audit_reference"], rows["audit_diff"]
    for i, k in enumerate(d["kinds"]):
        if k != "policy":
            # the uploaded row has every token (this trainer put 0 off-policy); the diff does not
            assert up_row[i] == 0 and diff[i] is None
            continue
        assert math.isclose(diff[i], up_row[i] - ref[i], abs_tol=1e-12)
    # The best match is the trainer's own computation: the difference is zero everywhere.
    assert max(abs(x) for x in diff if x is not None) < 1e-9
    # The finding's tokens of this episode are marked.
    marks = d["audit"]["marks"]
    assert [m["code"] for m in marks] == ["truncated_as_terminated"]
    assert marks[0]["positions"][0] == p
    assert marks[0]["positions"] == [q for ee, q in spec["tokens"] if ee == e]
    assert d["audit"]["best_match"]["scheme"] == "verl_gae"


def test_episode_diff_row_without_advantages_is_4xx(client):
    r = upload(client, [episode(1.0), episode(0.0, advantages=[0.0, 0.0, 0.5, 0.5, 0.5])])
    slugs = [e["slug"] for e in r.json()["episodes"]]
    # This episode has none: the row cannot exist (422 naming the scheme).
    r = client.get(f"/api/episodes/{slugs[0]}/advantages", params={"scheme": "audit_diff"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "scheme"
    assert "`audit_diff` needs advantages" in r.json()["error"]["message"]
    # This one has them, but its batch cannot be audited: the audit's 409.
    r = client.get(f"/api/episodes/{slugs[1]}/advantages", params={"scheme": "uploaded,audit_diff"})
    assert r.status_code == 409 and r.json()["error"]["field"] == "advantages"
    assert r.json()["error"]["episode"] == 1


def test_uploaded_turn_ids_are_used_and_agree_with_the_default(client):
    """Turn ids equal to the default (maximal policy runs) give the same audit as none at all."""
    eps = [json.loads(line) for line in (CORPUS / "clean_gae.jsonl").read_text().splitlines()]
    for e in eps:
        ids, turn, prev = [], -1, False
        for k in e["kinds"]:
            pol = k == "policy"
            turn += pol and not prev
            ids.append(max(turn, 0))
            prev = pol
        e["turn_ids"] = ids
    r = upload(client, eps)
    assert r.status_code == 201, r.text
    out = client.get(f"/api/batches/{r.json()['batch_id']}/audit").json()
    assert out["best_match"]["params"] == MANIFEST["clean_gae"]["best_match"]["params"]
    assert out["findings"] == []


def test_rewards_on_a_tool_token_is_reward_on_non_policy_token(client):
    """A real upload whose per-token ``rewards`` put the outcome on a tool token, with verl's GRPO
    advantages (the row's summed reward): the audit's warning names the reward token and its episode."""
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np
    import torch

    kinds = ["prompt", "policy", "policy", "tool", "tool"]
    scores = [1.0, 0.0, 0.5, 1.0]
    rew = [[0.0, 0.0, s, 0.0, 0.0] if i % 2 else [0.0, 0.0, 0.0, 0.0, s] for i, s in enumerate(scores)]
    pol = torch.tensor([[k == "policy" for k in kinds]] * 4)
    adv, _ = core.compute_grpo_outcome_advantage(
        torch.tensor(rew, dtype=torch.float32), pol.float(), np.array(["a"] * 4, dtype=object)
    )
    adv = (adv * pol).double().tolist()
    eps = [
        {
            "tokens": [f"t{j}" for j in range(5)],
            "kinds": kinds,
            "rewards": rew[i],
            "advantages": adv[i],
            "group": "a",
        }
        for i in range(4)
    ]
    r = upload(client, eps)
    assert r.status_code == 201, r.text
    out = client.get(f"/api/batches/{r.json()['batch_id']}/audit").json()
    assert out["best_match"]["scheme"] == "grpo", out["best_match"]
    (f,) = [f for f in out["findings"] if f["code"] == "reward_on_non_policy_token"]
    assert f["severity"] == "warning" and f["evidence"]["source"] == "rewards"
    assert f["tokens"] == [[0, 4], [2, 4]] and f["episodes"] == [0, 2]
    assert f["first"]["position"] == 4 and f["first"]["slug"] == f["slugs"][0]
    assert out["n_errors"] == 0


def test_large_advantage_clipped_by_ppo_is_credit_clipped(client):
    """A real upload with ``logprobs`` and ``rollout_logprobs``: the one large-|A| token (A = 3, the
    batch's policy |A| otherwise <= 0.4) has ratio exp(logprobs - rollout_logprobs) = 2 > 1 + 0.2, so
    verl's vanilla PPO in bypass mode zeroes it: a ``credit_clipped`` warning naming it, and the loss
    API (the same ratio, bypass) counts its |A| as clipped. Without the log-probs, no such finding."""
    import math

    kinds = ["prompt", "policy", "policy", "policy", "policy"]
    adv = [[0.0, 0.1, 0.2, 0.3, 3.0], [0.0, -0.1, -0.2, -0.3, -0.4]]
    lp = [-1.0] * 5

    def eps(with_lp: bool) -> list[dict]:
        out = []
        for i in range(2):
            e = {"tokens": [f"t{j}" for j in range(5)], "kinds": kinds, "reward": 0.0, "advantages": adv[i]}
            if with_lp:
                rlp = list(lp)
                if i == 0:
                    rlp[4] = -1.0 - math.log(2.0)
                e |= {"logprobs": lp, "rollout_logprobs": rlp}
            out.append(e)
        return out

    r = upload(client, eps(True))
    assert r.status_code == 201, r.text
    bid = r.json()["batch_id"]
    out = client.get(f"/api/batches/{bid}/audit").json()
    (f,) = [f for f in out["findings"] if f["code"] == "credit_clipped"]
    assert f["severity"] == "warning" and f["tokens"] == [[0, 4]] and f["episodes"] == [0]
    assert f["slugs"] == [r.json()["episodes"][0]["slug"]] and f["first"]["position"] == 4
    assert not [f for f in out["findings"] if f["code"] == "credit_masked_by_rollout_correction"]
    loss = client.get(f"/api/batches/{bid}/loss?agg=token-sum&bypass=true").json()
    assert abs(loss["clipped_share"] - 3.0 / 4.6) < 1e-12

    r = upload(client, eps(False))
    assert r.status_code == 201, r.text
    out = client.get(f"/api/batches/{r.json()['batch_id']}/audit").json()
    assert not {f["code"] for f in out["findings"]} & {
        "credit_clipped",
        "credit_masked_by_rollout_correction",
    }
