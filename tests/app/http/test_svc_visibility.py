"""Visibility against a real server process: an unlisted batch or run is never listed or searched,
not on the home page, 404 by its integer id (its group pages too), reachable by its random slug;
its episodes keep their slugs; public ones work by id as before; CREDITLENS_DEFAULT_VISIBILITY."""

from __future__ import annotations

import re

import httpx
import pytest
from pydantic import ValidationError

from app.core.settings import Settings
from tests.app.svc_helpers import episode, jsonl
from tests.live_server import Server

SLUG = re.compile(r"^[A-Za-z0-9_-]{24}$")  # 144 random bits, URL-safe


@pytest.fixture(scope="module")
def srv(tmp_path_factory, module_db_url):
    tmp = tmp_path_factory.mktemp("vis")
    # SQLite or PostgreSQL (the module's tests run on both).
    with Server(tmp / "db.sqlite", tmp / "server.log", CREDITLENS_DATABASE_URL=module_db_url) as s:
        yield s


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        yield c


def _upload(http, name: str, group: str, **params) -> dict:
    eps = [episode(reward=r, group=group) for r in (0.0, 1.0)]
    r = http.post("/api/uploads", files={"file": ("e.jsonl", jsonl(eps))}, params={"name": name, **params})
    assert r.status_code == 201, r.text
    return r.json()


def _listed_ids(http, **params) -> set[int]:
    r = http.get("/api/batches", params=params)
    assert r.status_code == 200
    return {b["id"] for b in r.json()}


def test_unlisted_upload_is_never_listed_or_searched_and_only_its_slug_reads_it(http):
    pub = _upload(http, "zebra public", "zebragroup")
    hid = _upload(http, "zebra hidden", "zebragroup", visibility="unlisted")
    assert pub["visibility"] == "public" and pub["url"] == f"/b/{pub['batch_id']}"
    assert hid["visibility"] == "unlisted"
    slug = hid["url"].removeprefix("/b/")
    assert SLUG.match(slug) and hid["api_url"] == f"/api/batches/{slug}"

    # Lists and search: the public one only (by name, by group, by source, unfiltered).
    for params in ({}, {"q": "zebra"}, {"q": "zebragroup"}, {"q": "hidden"}, {"source": "upload"}):
        ids = _listed_ids(http, **params)
        assert hid["batch_id"] not in ids, params
    assert pub["batch_id"] in _listed_ids(http, q="zebra")
    home = http.get("/", params={"q": "zebra", "format": "json"}).json()
    assert [b["id"] for b in home["data"]] == [pub["batch_id"]]

    # By id: 404 everywhere, exactly like a batch that does not exist.
    bid = hid["batch_id"]
    for path in (
        f"/api/batches/{bid}",
        f"/api/batches/{bid}/groups/zebragroup",
        f"/api/batches/{bid}/audit",
        f"/b/{bid}",
        f"/b/{bid}/g/zebragroup",
        f"/b/{bid}/preview.png",
    ):
        r = http.get(path)
        assert r.status_code == 404, path
    missing = http.get("/api/batches/999999").json()["error"]["code"]
    assert http.get(f"/api/batches/{bid}").json()["error"]["code"] == missing

    # By slug: the batch, its group, its page, its group page, its preview.
    b = http.get(hid["api_url"])
    assert b.status_code == 200
    body = b.json()
    assert body["id"] == bid and body["ref"] == slug and body["url"] == hid["url"]
    assert body["visibility"] == "unlisted" and body["n_episodes"] == 2
    g = http.get(f"/api/batches/{slug}/groups/zebragroup")
    assert g.status_code == 200 and len(g.json()["episodes"]) == 2
    assert http.get(hid["url"]).status_code == 200
    page = http.get(f"/b/{slug}/g/zebragroup")
    assert page.status_code == 200 and f'href="/b/{slug}"' in page.text
    assert http.get(f"/b/{slug}/preview.png").headers["content-type"] == "image/png"
    twin = http.get(hid["url"], params={"format": "json"}).json()
    assert twin["batch_id"] == slug and twin["data"]["ref"] == slug

    # Its episodes keep their slugs and link back to the batch by slug.
    ep_slug = hid["episodes"][0]["slug"]
    ep = http.get(f"/api/episodes/{ep_slug}")
    assert ep.status_code == 200 and ep.json()["batch_ref"] == slug
    ep_page = http.get(f"/e/{ep_slug}")
    assert ep_page.status_code == 200 and f'"batch_ref": "{slug}"' in ep_page.text
    assert http.get(f"/api/episodes/{ep_slug}/advantages", params={"scheme": "grpo"}).status_code == 200

    # Public: unchanged, by id.
    assert http.get(f"/api/batches/{pub['batch_id']}").json()["ref"] == pub["batch_id"]
    assert http.get(f"/b/{pub['batch_id']}/g/zebragroup").status_code == 200


def test_delete_an_unlisted_batch_by_slug(http):
    hid = _upload(http, "to delete", "d", visibility="unlisted")
    slug = hid["url"].removeprefix("/b/")
    tok = {"X-Delete-Token": hid["delete_token"]}
    assert http.delete(f"/api/batches/{hid['batch_id']}", headers=tok).status_code == 404
    assert http.delete(f"/api/batches/{slug}", headers=tok).status_code == 204
    assert http.get(f"/api/batches/{slug}").status_code == 404


def test_multipart_field_and_bad_values(http):
    r = http.post(
        "/api/uploads",
        files={"file": ("e.jsonl", jsonl([episode()]))},
        data={"visibility": "unlisted", "name": "form field"},
    )
    assert r.status_code == 201 and r.json()["visibility"] == "unlisted"
    r = http.post(
        "/api/uploads", files={"file": ("e.jsonl", jsonl([episode()]))}, data={"visibility": "secret"}
    )
    assert r.status_code == 422 and r.json()["error"]["field"] == "visibility"
    r = http.post("/api/uploads", content=jsonl([episode()]), params={"visibility": "secret"})
    assert r.status_code == 422
    assert http.post("/api/runs", json={"name": "x", "visibility": "nope"}).status_code == 422


def test_unlisted_run_and_its_steps(http):
    r = http.post("/api/runs", json={"name": "quiet run", "visibility": "unlisted"})
    assert r.status_code == 201
    run = r.json()
    slug = run["ref"]
    assert SLUG.match(slug) and run["url"] == f"/r/{slug}" and run["api_url"] == f"/api/runs/{slug}"
    # The step is posted by slug and inherits the run's visibility.
    step = http.post(f"/api/runs/{slug}/steps/0", content=jsonl([episode(0.0), episode(1.0)]))
    assert step.status_code == 201, step.text
    s = step.json()
    assert s["visibility"] == "unlisted" and s["url"] != f"/b/{s['batch_id']}"
    assert http.post(f"/api/runs/{run['id']}/steps/1", content=jsonl([episode()])).status_code == 404
    assert s["batch_id"] not in _listed_ids(http)
    assert run["id"] not in {x["id"] for x in http.get("/api/runs").json()}
    assert run["id"] not in {x["id"] for x in http.get("/api/runs", params={"name": "quiet run"}).json()}
    for path in (f"/api/runs/{run['id']}", f"/api/runs/{run['id']}/metrics", f"/r/{run['id']}"):
        assert http.get(path).status_code == 404, path
    got = http.get(f"/api/runs/{slug}").json()
    assert got["visibility"] == "unlisted" and got["steps"][0]["url"] == s["url"]
    assert "pass_rate" in http.get(f"/api/runs/{slug}/metrics").json()
    assert http.get(f"/r/{slug}").status_code == 200
    assert http.get(s["url"]).status_code == 200
    tok = {"X-Delete-Token": run["delete_token"]}
    assert http.delete(f"/api/runs/{run['id']}", headers=tok).status_code == 404
    assert http.delete(f"/api/runs/{slug}", headers=tok).status_code == 204


def test_unlisted_sample(http):
    r = http.post("/api/samples", json={"n_tasks": 1, "n_per_task": 2, "visibility": "unlisted"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["visibility"] == "unlisted" and body["url"] != f"/b/{body['batch_id']}"
    assert http.get(body["url"]).status_code == 200
    assert http.get(f"/b/{body['batch_id']}").status_code == 404
    assert body["batch_id"] not in _listed_ids(http, source="sample")


def test_default_visibility_setting(tmp_path, db_url):
    env = {
        "CREDITLENS_DATABASE_URL": db_url,
        "CREDITLENS_DEFAULT_VISIBILITY": "unlisted",
    }
    with Server(tmp_path / "db.sqlite", tmp_path / "s.log", **env) as s:
        with httpx.Client(base_url=s.base, timeout=60) as http:
            quiet = _upload(http, "default", "g")
            loud = _upload(http, "explicit", "g", visibility="public")
            assert quiet["visibility"] == "unlisted" and loud["visibility"] == "public"
            assert _listed_ids(http) == {loud["batch_id"]}
            assert http.post("/api/runs", json={"name": "r"}).json()["visibility"] == "unlisted"
    with pytest.raises(ValidationError):
        Settings(default_visibility="secret")
