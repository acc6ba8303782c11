"""The versioned wire: what a client sends names its protocol version (the X-Creditlens-Protocol
header, ``protocol`` in POST /api/runs, ``creditlens_protocol`` in a safetensors file's metadata).
An older client (no version at all, as before the versioning) is served as version 1; a client
newer than the server gets a 400 in the one error shape naming both versions, and nothing is
stored."""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import save

from app.core.protocol import PROTOCOL_HEADER, PROTOCOL_KEY, PROTOCOL_VERSION
from creditlens import _batch, wire
from tests.app.svc_helpers import episode, jsonl, make_client, row_counts

NEWER = str(PROTOCOL_VERSION + 1)


def test_the_server_and_the_client_release_speak_the_same_version():
    assert (PROTOCOL_VERSION, PROTOCOL_HEADER, PROTOCOL_KEY) == (
        wire.PROTOCOL_VERSION,
        wire.PROTOCOL_HEADER,
        wire.PROTOCOL_KEY,
    )


def _too_new(r, field: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["field"]) == ("protocol_too_new", field)
    assert (
        f"protocol {NEWER}" in err["message"] and f"protocol {PROTOCOL_VERSION} and older" in err["message"]
    )


def test_a_newer_client_is_told_both_versions_and_nothing_is_stored(tmp_path):
    with make_client(tmp_path) as client:
        _too_new(
            client.post("/api/runs", json={"name": "r"}, headers={PROTOCOL_HEADER: NEWER}), PROTOCOL_HEADER
        )
        _too_new(client.post("/api/runs", json={"name": "r", "protocol": int(NEWER)}), "protocol")
        assert client.get("/api/runs").json() == []
        run = client.post("/api/runs", json={"name": "r"}).json()
        r = client.post(
            f"/api/runs/{run['id']}/steps/0", content=jsonl([episode()]), headers={PROTOCOL_HEADER: NEWER}
        )
        _too_new(r, PROTOCOL_HEADER)
        # A safetensors file written by a newer client, posted without the header (a proxy dropped it).
        snap = _batch.snapshot(tokens=[["a", "b", "c"]], kinds=[["prompt", "policy", "policy"]], reward=[1.0])
        tensors = {"kinds": snap.arrays["kinds"], "reward": snap.arrays["reward"].astype(np.float64)}
        body = save(tensors, metadata={"tokens": json.dumps([["a", "b", "c"]]), PROTOCOL_KEY: NEWER})
        r = client.post(f"/api/runs/{run['id']}/steps/0", content=body, params={"format": "safetensors"})
        _too_new(r, f"__metadata__.{PROTOCOL_KEY}")
        assert row_counts(client) == (0, 0)
        r = client.post("/api/runs", json={"name": "r"}, headers={PROTOCOL_HEADER: "two"})
        assert r.status_code == 422 and r.json()["error"]["field"] == PROTOCOL_HEADER


def test_an_older_client_without_any_version_is_served(tmp_path):
    with make_client(tmp_path) as client:
        run = client.post("/api/runs", json={"name": "old"})  # no header, no protocol field
        assert run.status_code == 201, run.text
        # A safetensors file as clients wrote them before the versioning: no creditlens_protocol.
        body = save(
            {"kinds": np.array([[0, 1, 1]], dtype=np.uint8), "reward": np.array([1.0])},
            metadata={"tokens": json.dumps([["a", "b", "c"]])},
        )
        r = client.post(
            f"/api/runs/{run.json()['id']}/steps/0", content=body, params={"format": "safetensors"}
        )
        assert r.status_code == 201, r.text
        # And today's client, which names its version everywhere.
        body = _batch.build(_batch.snapshot(tokens=[["x", "y"]], kinds=[["prompt", "policy"]], reward=[0.5]))
        assert (
            json.loads(body[8 : 8 + int.from_bytes(body[:8], "little")])["__metadata__"][PROTOCOL_KEY] == "1"
        )
        r = client.post(
            f"/api/runs/{run.json()['id']}/steps/1",
            content=body,
            params={"format": "safetensors"},
            headers={PROTOCOL_HEADER: str(PROTOCOL_VERSION)},
        )
        assert r.status_code == 201, r.text
