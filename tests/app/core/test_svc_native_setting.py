"""CREDITLENS_NATIVE: validated at start-up, and the advantages API gives the same numbers with the
compiled GAE kernel and with the vectorised torch path."""

from __future__ import annotations

import pydantic
import pytest

from app.core.settings import Settings
from estimators import native
from tests.app.svc_helpers import make_client, upload


@pytest.fixture(autouse=True)
def _restore_default():
    yield
    native.set_default(None)


def test_bad_value_stops_start_up(monkeypatch):
    monkeypatch.setenv("CREDITLENS_NATIVE", "maybe")
    with pytest.raises(pydantic.ValidationError, match="native"):
        Settings()


def _episode():
    # prompt, call 1, tool span, call 2 (with a per-call cost), critic values on every token.
    kinds = ["prompt"] * 2 + ["policy"] * 3 + ["tool"] * 4 + ["policy"] * 3
    values = [0.1 * i - 0.3 for i in range(len(kinds))]
    rewards = [0.0] * len(kinds)
    rewards[4] = -0.05
    return {
        "tokens": [f"t{i}" for i in range(len(kinds))],
        "kinds": kinds,
        "reward": 1.0,
        "values": values,
        "rewards": rewards,
        "group": "g",
    }


def test_api_numbers_equal_on_both_paths(new_db):
    got = {}
    for on in (True, False):
        with make_client(new_db(), native=on) as client:
            assert native.enabled() is on
            slug = upload(client, [_episode()]).json()["episodes"][0]["slug"]
            r = client.get(
                f"/api/episodes/{slug}/advantages",
                params={"scheme": "token_gae,turn_gae", "gamma": 0.9, "lam": 0.8},
            )
            assert r.status_code == 200, r.text
            got[on] = r.json()
    rows_on, rows_off = ({row["name"]: row["advantages"] for row in got[k]["schemes"]} for k in (True, False))
    assert rows_on.keys() == rows_off.keys() == {"token_gae", "turn_gae"}
    for name in rows_on:
        assert [a is None for a in rows_on[name]] == [a is None for a in rows_off[name]]
        for a, b in zip(rows_on[name], rows_off[name], strict=True):
            assert a == pytest.approx(b, abs=1e-12)
    # Tool tokens carry no credit on either path; the first call's credit is nonzero.
    assert rows_on["token_gae"][5:9] == [None] * 4
    assert rows_on["token_gae"][2] != 0
