"""Signal rows of the episode page (logprob, entropy, kl, ratio) and the `uploaded` row on every
token, through the real app on a real SQLite file with real uploads."""

from __future__ import annotations

import math

import pytest

from app.core.views import EpisodeView
from tests.app.svc_helpers import episode, make_client, upload

LOGP = [0.0, 0.0, -0.2, -1.5, -0.05, 0.0, 0.0, -0.7]
REF = [0.0, 0.0, -0.3, -1.0, -0.05, 0.0, 0.0, -0.9]
ROLL = [0.0, 0.0, -0.25, -1.5, 0.05, 0.0, 0.0, -0.6]
ENT = [0.0, 0.0, 0.9, 2.1, 0.3, 0.0, 0.0, 1.2]
KINDS = ["prompt", "prompt", "policy", "policy", "policy", "tool", "tool", "policy"]
# The trainer's advantages, nonzero on prompt token 1 and tool token 6: bugs the row must show.
ADV = [0.0, 0.4, 1.0, -0.5, 0.25, 0.0, -0.75, 0.5]
POLICY = [i for i, k in enumerate(KINDS) if k == "policy"]


def _ep(**fields) -> dict:
    ep = episode(n_prompt=0, n_policy=0)
    ep.update(tokens=[f"t{i}" for i in range(len(KINDS))], kinds=KINDS, reward=1.0, values=[0.5] * len(KINDS))
    ep.update(fields)
    return ep


@pytest.fixture
def client(db_url):
    with make_client(db_url) as c:
        yield c


def _slug(client, ep: dict) -> str:
    r = upload(client, [ep])
    assert r.status_code == 201, r.text
    return r.json()["episodes"][0]["slug"]


@pytest.fixture
def full(client) -> str:
    return _slug(
        client, _ep(logprobs=LOGP, ref_logprobs=REF, rollout_logprobs=ROLL, entropy=ENT, advantages=ADV)
    )


def _rows(body: dict) -> dict:
    return {r["name"]: r for r in body["signals"]}


def test_signal_values_are_the_uploaded_arithmetic_on_policy_tokens(client, full):
    r = client.get(
        f"/api/episodes/{full}/advantages",
        params={"scheme": "uploaded", "signal": "logprob,entropy,kl,ratio"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["available_signals"] == ["logprob", "entropy", "kl", "ratio"]
    assert body["params"]["signals"] == ["logprob", "entropy", "kl", "ratio"]
    rows = _rows(body)
    assert [r["name"] for r in body["signals"]] == ["logprob", "entropy", "kl", "ratio"]
    assert {n: r["scale"] for n, r in rows.items()} == {
        "logprob": "sequential",
        "entropy": "sequential",
        "kl": "diverging",
        "ratio": "ratio",
    }
    for i in range(len(KINDS)):
        if i not in POLICY:
            assert all(rows[n]["values"][i] is None for n in rows), i
            continue
        assert rows["logprob"]["values"][i] == LOGP[i]
        assert rows["entropy"]["values"][i] == ENT[i]
        assert rows["kl"]["values"][i] == pytest.approx(LOGP[i] - REF[i], abs=1e-15)
        assert rows["ratio"]["values"][i] == pytest.approx(math.exp(LOGP[i] - ROLL[i]), rel=1e-15)
    # e.g. token 3: KL 1.5 - 1.0 -> -0.5; token 4: ratio exp(-0.1)
    assert rows["kl"]["values"][3] == pytest.approx(-0.5)
    assert rows["ratio"]["values"][4] == pytest.approx(0.904837418, rel=1e-9)


def test_signals_endpoint_serves_every_available_row(client, full):
    body = client.get(f"/api/episodes/{full}/signals").json()
    assert body["has_advantages"] is True
    assert [r["name"] for r in body["signals"]] == ["logprob", "entropy", "kl", "ratio"]
    one = client.get(f"/api/episodes/{full}/signals", params={"signal": "ratio"}).json()
    assert [r["name"] for r in one["signals"]] == ["ratio"]
    assert one["signals"][0]["values"] == body["signals"][3]["values"]


def test_signals_absent_when_the_data_lacks_them(client):
    only_logp = _slug(client, _ep(logprobs=LOGP))
    body = client.get(
        f"/api/episodes/{only_logp}/advantages", params={"signal": "kl,ratio,entropy,logprob"}
    ).json()
    assert body["available_signals"] == ["logprob"]
    assert [r["name"] for r in body["signals"]] == ["logprob"]
    assert body["has_advantages"] is False
    bare = _slug(client, _ep())
    body = client.get(f"/api/episodes/{bare}/signals").json()
    assert body["available_signals"] == [] and body["signals"] == []
    # no signal asked: no rows, the key is still there
    body = client.get(f"/api/episodes/{bare}/advantages").json()
    assert body["signals"] == [] and body["available_signals"] == []


def test_unknown_signal_is_a_422_naming_the_field(client, full):
    r = client.get(f"/api/episodes/{full}/advantages", params={"signal": "kl,perplexity"})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == "signal" and "perplexity" in err["message"]
    assert client.get(f"/api/episodes/{full}/signals", params={"signal": "nope"}).status_code == 422


def test_uploaded_row_has_every_token_and_policy_only_turn_means(client, full):
    body = client.get(f"/api/episodes/{full}/advantages", params={"scheme": "uploaded,token_gae"}).json()
    assert body["has_advantages"] is True
    up = next(s for s in body["schemes"] if s["name"] == "uploaded")
    assert up["advantages"] == ADV  # prompt and tool tokens too, exactly as uploaded
    gae = next(s for s in body["schemes"] if s["name"] == "token_gae")
    assert [gae["advantages"][i] for i in (0, 1, 5, 6)] == [None] * 4  # other rows stay policy-only
    # the per-call means still average policy tokens only
    first = body["turns"][0]
    assert first["means"]["uploaded"] == pytest.approx((1.0 - 0.5 + 0.25) / 3)


def test_view_state_carries_signals_into_the_api_url(client, full):
    v = EpisodeView.from_query({"scheme": "uploaded", "signals": "kl,bogus,ratio,kl"})
    assert v.signals == ["kl", "ratio"]
    assert v.query().endswith("&signal=kl,ratio")
    assert EpisodeView.from_query(dict(p.split("=") for p in v.query().split("&"))) == v
    assert "signal" not in EpisodeView().query()
    page = client.get(f"/e/{full}", params={"scheme": "uploaded", "signal": "kl,ratio"})
    assert page.status_code == 200
    assert (
        f"/api/episodes/{full}/advantages?scheme=uploaded&amp;gamma=1&amp;lam=0.95&amp;baseline=rloo&amp;critic=upload&amp;signal=kl,ratio"
        in page.text
    )
