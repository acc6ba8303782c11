"""The audit's token findings through the real API: ``retokenization_drift`` (from each episode's
``meta.drift``) and ``mask_misaligned`` (from ``meta.mask_misaligned``), hand-made native episodes
with the trainer's advantages (GRPO on rewards 1 and 0: +-1/std([1, 0]) = +-0.7071 per token)."""

from __future__ import annotations

from tests.app.svc_helpers import episode, upload

A = 0.7071067811865475


def _batch(meta0: dict, logprobs0: list[float] | None = None) -> list[dict]:
    e0 = episode(1.0, "g", advantages=[0, 0, A, A, A], meta=meta0)
    e1 = episode(0.0, "g", advantages=[0, 0, -A, -A, -A])
    if logprobs0 is not None:
        e0["logprobs"] = logprobs0
    return [e0, e1]


def _findings(client, eps: list[dict]) -> dict[str, dict]:
    r = upload(client, eps)
    assert r.status_code == 201, r.text
    body = client.get(f"/api/batches/{r.json()['batch_id']}/audit").json()
    return {f["code"]: f for f in body["findings"]}


DRIFT = {
    "drift": [
        {
            "turn": 1,
            "position": 3,
            "sampled": 2,
            "rerendered_ids": [9, 8],
            "differing": 1,
            "first": [7, 9],
            "at": [3],
        }
    ]
}


def test_drift_is_a_warning_naming_the_re_rendered_tokens(client):
    f = _findings(client, _batch(DRIFT))
    d = f["retokenization_drift"]
    assert d["severity"] == "warning" and d["tokens"] == [[0, 3]] and d["token_count"] == 1
    assert d["evidence"] == {"tokens": 1, "episodes": 1, "improbable_tokens": 0}
    assert "mask_misaligned" not in f


def test_drift_at_an_improbable_token_is_an_error(client):
    # The upload's log-prob at the re-rendered position 3 is -12.5 < -10.
    f = _findings(client, _batch(DRIFT, logprobs0=[0, 0, -0.1, -12.5, -0.2]))
    d = f["retokenization_drift"]
    assert d["severity"] == "error" and d["tokens"] == [[0, 3]] and d["evidence"]["improbable_tokens"] == 1


def test_no_drift_no_finding(client):
    assert "retokenization_drift" not in _findings(client, _batch({}))


def test_mask_misaligned_names_its_positions(client):
    meta = {"mask_misaligned": {"reason": "loss mask makes tool tokens trainable", "at": [0, 1]}}
    f = _findings(client, _batch(meta))
    m = f["mask_misaligned"]
    assert m["severity"] == "error" and m["tokens"] == [[0, 0], [0, 1]]
