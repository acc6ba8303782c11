"""A private server (CREDITLENS_READ_TOKEN) against a real server process: every operation of the
OpenAPI document and every page answers 401 / a redirect to the sign-in page without the token and
works with it; /healthz and the static files stay open; the sign-in cookie is HttpOnly and
SameSite=Strict and holds no token; a wrong token fails; link previews leak nothing."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from app.http.access import COOKIE, cookie_value
from tests.live_server import Server

READ = "read-token-for-tests"
WRITE = "write-token-for-tests"
ERROR_KEYS = {"status", "code", "message", "line", "episode", "field"}


def _eps(n: int = 2) -> str:
    import json

    rows = []
    for i in range(n):
        rows.append(
            {
                "tokens": ["q", "a", "b"],
                "kinds": ["prompt", "policy", "policy"],
                "reward": float(i % 2),
                "group": "sekrit-group",
                "advantages": [0.0, float(i % 2) - 0.5, float(i % 2) - 0.5],
                "values": [0.5, 0.5, 0.5],
                "meta": {"task": "sekrit-task"},
            }
        )
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("private")
    env = {"CREDITLENS_READ_TOKEN": READ, "CREDITLENS_WRITE_TOKEN": WRITE}
    with Server(tmp / "db.sqlite", tmp / "server.log", **env) as s:
        yield s


@pytest.fixture(scope="module")
def data(srv):
    """A batch (public), an unlisted one, a run with a step and a sampling job, made with the write
    token (which also reads)."""
    w = {"authorization": f"Bearer {WRITE}"}
    with httpx.Client(base_url=srv.base, timeout=120, headers=w) as c:
        up = c.post("/api/uploads", content=_eps(), params={"name": "sekrit-batch"})
        assert up.status_code == 201, up.text
        hidden = c.post("/api/uploads", content=_eps(), params={"visibility": "unlisted"}).json()
        run = c.post("/api/runs", json={"name": "sekrit-run"}).json()
        assert c.post(f"/api/runs/{run['id']}/steps/0", content=_eps()).status_code == 201
        other = c.post("/api/runs", json={"name": "sekrit-run-2"}).json()  # for /api/runs/compare
        job = c.post("/api/samples", params={"async": "true"}, json={"n_tasks": 1, "n_per_task": 2})
        assert job.status_code == 202, job.text
        schema = c.get("/openapi.json")
        assert schema.status_code == 200
        key = c.get(f"/api/runs/{run['id']}/prompts").json()[0]["key"]
    up = up.json()
    return {
        "slug": up["episodes"][0]["slug"],
        "batch_id": up["batch_id"],
        "hidden": hidden["url"].removeprefix("/b/"),
        "group": "sekrit-group",
        "run_id": run["id"],
        "step": 1,
        "job_id": job.json()["job_id"],
        "figure": "lambda",
        "schema": schema.json(),
        "key": key,
        "other_run_id": other["id"],
    }


def _fill(path: str, data: dict) -> str:
    return re.sub(r"\{(\w+)(?::path)?\}", lambda m: str(data[m.group(1)]), path)


def _operations(data: dict) -> list[tuple[str, str]]:
    ops = [(m.upper(), p) for p, item in data["schema"]["paths"].items() for m in item if p != "/healthz"]
    assert len(ops) >= 25, ops  # the whole API, not an empty document
    return ops


# Every HTML page of the service (they are not in the OpenAPI document); the test below checks
# this list against the app's own routes so a new page cannot be forgotten.
PAGES = [
    "/",
    "/e/{slug}",
    "/e/{slug}/preview.png",
    "/b/{batch_id}",
    "/b/{batch_id}/preview.png",
    "/b/{batch_id}/g/{group}",
    "/r/{run_id}",
    "/r/{run_id}/preview.png",
    "/r/{run_id}/prompts/{key}",
    "/r/compare",
    "/talk",
    "/talk/{step}",
    "/lab",
    "/lab/{figure}",
    "/sample",
    "/trainers",
    "/docs",
    "/redoc",
    "/openapi.json",
]
OPEN = [
    "/healthz",
    "/static/app.css",
    "/static/util.js",
    "/vendor/plotly.min.js",
    "/vendor/plotly-basic.min.js",
    "/vendor/docs/redoc.standalone.js",
    "/sign-in",
]


def _app_get_pages(tmp) -> set[str]:
    """GET routes of the app that the OpenAPI document leaves out (pages), walked in-process."""
    from app.core.settings import Settings
    from app.main import create_app

    app = create_app(Settings(database_url=f"sqlite:///{tmp}/pages.db"))
    out: set[str] = set()

    def walk(routes):
        for r in routes:
            inner = getattr(r, "original_router", None)  # FastAPI's included routers
            if inner is not None:
                walk(inner.routes)
            elif "GET" in (getattr(r, "methods", None) or ()) and not getattr(r, "include_in_schema", True):
                out.add(r.path)

    walk(app.routes)
    return out


def test_page_list_covers_every_page(tmp_path):
    pages = {p.replace("{group:path}", "{group}") for p in _app_get_pages(tmp_path)}
    vendor = {p for p in OPEN if p.startswith("/vendor/")}  # scripts, no data: open by design
    assert pages - {"/sign-in"} <= set(PAGES) | vendor, pages - set(PAGES)


def test_every_api_operation_needs_the_token(srv, data):
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        for method, path in _operations(data):
            url = _fill(path, data)
            for headers in ({}, {"authorization": "Bearer wrong"}, {"cookie": f"{COOKIE}=nope"}):
                r = c.request(method, url, headers=headers)
                assert r.status_code == 401, (method, url, headers, r.status_code)
                err = r.json()["error"]
                assert set(err) == ERROR_KEYS and err["code"] == "read_token_required"
                assert r.headers["www-authenticate"].startswith("Bearer")
                assert "sekrit" not in r.text


def test_every_api_get_works_with_the_token(srv, data):
    with httpx.Client(base_url=srv.base, timeout=300) as c:
        for method, path in _operations(data):
            if method != "GET":
                continue
            url = _fill(path, data)
            for token in (READ, WRITE):  # the write token reads too
                params = {"scheme": "grpo"} if path.endswith("/advantages") else None  # no critic values
                if path.endswith("/compare"):
                    params = {"runs": f"{data['run_id']},{data['other_run_id']}"}
                r = c.get(url, params=params, headers={"authorization": f"Bearer {token}"})
                assert r.status_code == 200, (url, r.status_code, r.text[:300])
        # Listed and found with the token (and the unlisted one still not listed).
        r = c.get("/api/batches", params={"q": "sekrit"}, headers={"authorization": f"Bearer {READ}"})
        names = {b["name"] for b in r.json()}
        assert names == {"sekrit-batch", "sekrit-run · step 0"}  # not the unlisted one


def test_writes_take_the_write_token_not_the_read_token(srv):
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        r = c.post("/api/uploads", content=_eps(), headers={"authorization": f"Bearer {READ}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        r = c.post("/api/uploads", content=_eps(), headers={"authorization": f"Bearer {WRITE}"})
        assert r.status_code == 201


def test_every_page_redirects_to_sign_in_without_the_token(srv, data):
    with httpx.Client(base_url=srv.base, timeout=300) as c:
        for page in PAGES:
            url = _fill(page, data)
            r = c.get(url, params={"v": "1"} if page == "/" else None)
            if page == "/openapi.json":
                assert r.status_code == 401
                continue
            assert r.status_code == 303, (url, r.status_code)
            loc = urlsplit(r.headers["location"])
            assert loc.path == "/sign-in" and not loc.netloc
            want = url + ("?v=1" if page == "/" else "")
            assert parse_qs(loc.query).get("next", ["/"]) == [want], (url, r.headers["location"])
            assert "sekrit" not in r.text and r.headers.get("content-type", "").find("image") < 0
            # The page's JSON twin is an API answer: 401.
            assert c.get(url, params={"format": "json"}).status_code == 401
        # With the token (Bearer, or the sign-in cookie): every page answers.
        for auth in ({"authorization": f"Bearer {READ}"}, {"cookie": f"{COOKIE}={cookie_value(READ)}"}):
            for page in PAGES:
                r = c.get(_fill(page, data), headers=auth, follow_redirects=True)
                assert r.status_code == 200, (page, auth, r.status_code)
            # Unlisted stays unlisted for signed-in readers too: its id is a 404, its slug works.
            assert c.get(f"/b/{data['hidden']}", headers=auth).status_code == 200


def test_open_paths_stay_open(srv):
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        for path in OPEN:
            assert c.get(path).status_code == 200, path
        assert c.get("/healthz").json() == {"status": "ok"}


def test_sign_in_sets_a_strict_httponly_cookie_and_returns_to_the_page(srv, data):
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        target = f"/b/{data['batch_id']}?q=a"
        form = c.get("/sign-in", params={"next": target})
        assert form.status_code == 200 and "og:" not in form.text and "sekrit" not in form.text
        r = c.post("/sign-in", data={"token": READ, "next": target})
        assert r.status_code == 303 and r.headers["location"] == target
        cookie = r.headers["set-cookie"]
        attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
        assert {"httponly", "samesite", "path"} <= attrs
        assert re.search(r"samesite=strict", cookie, re.I)
        value = cookie.split(";")[0].split("=", 1)[1]
        assert READ not in cookie and value == cookie_value(READ)
        page = c.get(target)  # the client keeps the cookie
        assert page.status_code == 200 and "sekrit-batch" in page.text


@pytest.mark.parametrize("token", ["", "wrong", READ + "x", READ[:-1], WRITE])
def test_a_wrong_token_does_not_sign_in(srv, token):
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        r = c.post("/sign-in", data={"token": token, "next": "/"})
        assert r.status_code in (401, 422) and "set-cookie" not in r.headers
        assert c.get("/").status_code == 303


@pytest.mark.parametrize(
    "target", ["//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)", "b/1"]
)
def test_sign_in_returns_only_to_same_site_paths(srv, target):
    with httpx.Client(base_url=srv.base, timeout=60) as c:
        r = c.post("/sign-in", data={"token": READ, "next": target})
        assert r.status_code == 303 and r.headers["location"] == "/"


def test_link_previews_leak_nothing_without_the_token(srv, data):
    with httpx.Client(base_url=srv.base, timeout=60, follow_redirects=True) as c:
        for path in (
            f"/e/{data['slug']}",
            f"/b/{data['batch_id']}",
            f"/e/{data['slug']}/preview.png",
            f"/r/{data['run_id']}/preview.png",
        ):
            r = c.get(path, headers={"user-agent": "Slackbot-LinkExpanding 1.0"})
            assert r.url.path == "/sign-in"
            assert "image/png" not in r.headers["content-type"]
            assert "og:image" not in r.text and "sekrit" not in r.text
