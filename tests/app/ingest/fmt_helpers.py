"""Helpers for the format tests (tests/app/ingest/test_fmt_*.py): upload a file through the real
POST /api/uploads without naming a format, read the stored episodes back, check that a refused
upload stores nothing, and that no non-policy token is given credit by any scheme the service
offers."""

from __future__ import annotations

import importlib.util
import json
import math
from types import ModuleType

from fastapi.testclient import TestClient

from tests.app.svc_helpers import FORMATS, row_counts


def upload(client: TestClient, name: str, data: bytes | str, **params):
    """The raw response of an upload with the format left to auto-detection."""
    return client.post("/api/uploads", files={"file": (name, data)}, params=params)


def stored(client: TestClient, name: str, data: bytes | str, **params) -> tuple[dict, list[dict]]:
    """(batch, episodes) of a 201 upload."""
    r = upload(client, name, data, **params)
    assert r.status_code == 201, r.text
    body = r.json()
    batch = client.get(f"/api/batches/{body['batch_id']}").json()
    eps = [client.get(f"/api/episodes/{e['slug']}").json() for e in body["episodes"]]
    return batch, eps


def pick(ep: dict, kind: str, key: str = "tokens") -> list:
    """The entries of ``key`` at the tokens of ``kind``."""
    return [x for x, k in zip(ep[key], ep["kinds"], strict=True) if k == kind]


def text(ep: dict, kind: str) -> str:
    return "".join(pick(ep, kind))


def spans(tokens: list[str], kinds: list[str], kind: str) -> list[str]:
    """The text of each maximal run of tokens of ``kind``, in order (a turn of the model, a tool
    result, ...)."""
    out: list[str] = []
    for i, (t, k) in enumerate(zip(tokens, kinds, strict=True)):
        if k == kind:
            if i == 0 or kinds[i - 1] != kind:
                out.append("")
            out[-1] += t
    return out


def all_schemes(client: TestClient) -> list[str]:
    return [s["name"] for s in client.get("/api/schemes").json()["schemes"]]


def assert_no_credit_off_policy(client: TestClient, ep: dict) -> None:
    """Under every scheme the service offers, prompt and tool tokens have no advantage (null), and
    at least one scheme gives the policy tokens numbers."""
    off = [i for i, k in enumerate(ep["kinds"]) if k != "policy"]
    some = False
    for name in all_schemes(client):
        if name == "uploaded" and not ep.get("advantages"):
            continue
        r = client.get(f"/api/episodes/{ep['slug']}/advantages", params={"scheme": name})
        if r.status_code != 200:  # a scheme this episode lacks the data for (e.g. oracle)
            assert 400 <= r.status_code < 500, r.text
            continue
        adv = r.json()["schemes"][0]["advantages"]
        if name == "uploaded":  # the trainer's own row: shown as uploaded, prompt included
            continue
        assert all(adv[i] is None for i in off), name
        some = some or any(a is not None and math.isfinite(a) for a in adv)
    assert some


def example(name: str) -> bytes:
    """The bytes of ``fixtures/formats/<name>`` (a path under that folder)."""
    return (FORMATS / name).read_bytes()


def lines(name: str) -> list[dict]:
    """The JSON objects of the JSONL example ``fixtures/formats/<name>``, one per non-blank line."""
    return [json.loads(s) for s in example(name).decode().splitlines() if s.strip()]


def uploaded_advantages(client: TestClient, slug: str) -> list:
    """The episode's ``uploaded`` row: the trainer's own advantages, as stored."""
    adv = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded"}).json()
    return adv["schemes"][0]["advantages"]


def refused(client: TestClient, name: str, data: bytes | str, **params) -> dict:
    """The error of an upload that must be refused with nothing stored."""
    before = row_counts(client)
    r = upload(client, name, data, **params)
    assert 400 <= r.status_code < 500, r.text
    assert row_counts(client) == before
    return r.json()["error"]


def fixture_module(name: str) -> ModuleType:
    """The generator script ``fixtures/formats/<name>.py`` as a module (its functions rebuild the
    example files)."""
    spec = importlib.util.spec_from_file_location(name.rsplit("/", 1)[-1], FORMATS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The fields of a stored episode that hold what an upload said (for comparing two uploads).
STORED_FIELDS = ("kinds", "token_ids", "logprobs", "rollout_logprobs", "entropy", "reward", "group", "meta")
