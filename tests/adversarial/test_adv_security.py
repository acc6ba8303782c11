"""Security: headers on every response, the optional write token, per-upload delete tokens,
unguessable share slugs, and XSS / template-injection payloads that stay inert text in the raw
HTML of every page (the browser half is test_adv_xss_browser.py).

The real app on a temp SQLite file through TestClient.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app

# ---- payloads ------------------------------------------------------------------------------------

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
ATTR = "' onmouseover='alert(1)"
JS_URL = "javascript:alert(1)"
TEMPLATE = "x{{7*7}}x"  # rendered by a template engine it would read x49x
PAYLOADS = [SCRIPT, IMG, ATTR, JS_URL, TEMPLATE, "</textarea></title><svg onload=alert(1)>"]
EVIL = " ".join(PAYLOADS)


def evil_episode(k: int) -> dict:
    toks = ["<|user|>", " fix", *PAYLOADS, "<|assistant|>", *PAYLOADS, " done"]
    n_prompt = 2 + len(PAYLOADS)
    return {
        "tokens": toks,
        "kinds": ["prompt"] * n_prompt + ["policy"] * (len(toks) - n_prompt),
        "reward": float(k % 2),
        "group": EVIL,  # groups appear in URLs, headings and tables
        "meta": {
            "task": EVIL,
            "note": EVIL,
            "link": JS_URL,
            EVIL: EVIL,
            "calls": [{"turn": 0, "action": EVIL, "effect": "other"}],
        },
    }


def upload(client: TestClient, episodes: list[dict], headers: dict | None = None, **params):
    body = "".join(json.dumps(e) + "\n" for e in episodes)
    return client.post(
        "/api/uploads",
        files={"file": (f"{EVIL}.jsonl", body)},
        params={"name": EVIL, **params},
        headers=headers or {},
    )


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    db = tmp_path_factory.mktemp("security") / "db.sqlite"
    with TestClient(create_app(Settings(database_url=f"sqlite:///{db}"))) as c:
        yield c


@pytest.fixture(scope="module")
def evil(client):
    r = upload(client, [evil_episode(k) for k in range(4)])
    assert r.status_code == 201, r.text
    return r.json()


# ---- security headers ----------------------------------------------------------------------------


def page_urls(evil: dict) -> list[str]:
    slug = evil["episodes"][0]["slug"]
    b = evil["batch_id"]
    g = quote(EVIL, safe="")
    q = quote(EVIL, safe="")
    return [
        "/",
        f"/?q={q}&source={q}",
        f"/e/{slug}",
        f"/e/{slug}?scheme={q}&baseline={q}&critic={q}&gamma={q}&open={q}&tok={q}",
        f"/e/{q}",
        f"/e/{quote(IMG + ATTR + TEMPLATE, safe='')}",  # no "/": reaches the episode page's 404
        f"/b/{quote(IMG, safe='')}",
        f"/talk/{quote(IMG, safe='')}",
        f"/b/{b}",
        f"/b/{b}?q={q}",
        f"/b/{b}/g/{g}",
        f"/b/{b}/g/{g}x",
        "/talk/1",
        "/talk/2",
        "/lab",
        "/lab/lambda",
        f"/lab/lambda?gamma={q}&lams={q}",
        f"/lab/{q}",
        "/sample",
        f"/{q}",
    ]


def api_urls(evil: dict) -> list[str]:
    slug = evil["episodes"][0]["slug"]
    b = evil["batch_id"]
    return [
        "/healthz",
        "/openapi.json",
        "/api/batches",
        f"/api/batches/{b}",
        f"/api/batches/{b}/groups/{quote(EVIL, safe='')}",
        f"/api/batches/{b}/audit",
        f"/api/episodes/{slug}",
        f"/api/episodes/{slug}/advantages",
        "/api/episodes/nope",
        "/api/episodes/nope/advantages?gamma=abc",
        "/api/schemes",
        "/api/formats",
        "/static/episode.js",
    ]


def check_headers(r, path: str, csp: bool = True) -> None:
    h = {k.lower(): v for k, v in r.headers.items()}
    assert h.get("x-content-type-options") == "nosniff", path
    assert h.get("referrer-policy") in ("same-origin", "no-referrer", "strict-origin-when-cross-origin"), path
    assert h.get("x-frame-options") == "DENY", path
    if csp:
        policy = h.get("content-security-policy", "")
        directives = {d.split()[0]: d.split()[1:] for d in policy.split(";") if d.strip()}
        assert directives.get("frame-ancestors") == ["'none'"], (path, policy)
        scripts = directives.get("script-src", directives.get("default-src"))
        assert scripts == ["'self'"], (path, policy)  # no inline scripts, no eval, no CDNs
        assert directives.get("object-src") == ["'none'"], (path, policy)
        assert directives.get("base-uri") == ["'self'"], (path, policy)


def test_security_headers_on_every_page_and_api_response(client, evil):
    for path in page_urls(evil) + api_urls(evil):
        r = client.get(path)
        assert r.status_code < 500, (path, r.status_code)
        check_headers(r, path)
    # Errors and writes carry them too.
    r = client.post("/api/uploads", content=b"not json", headers={"content-type": "text/plain"})
    assert r.status_code == 422
    check_headers(r, "POST /api/uploads (422)")
    r = upload(client, [evil_episode(0)])
    assert r.status_code == 201
    check_headers(r, "POST /api/uploads (201)")
    # The third-party API explorer keeps the other headers (it needs its CDN script, so no CSP).
    check_headers(client.get("/docs"), "/docs", csp=False)


def test_json_is_never_sniffed_as_html(client, evil):
    r = client.get(f"/api/episodes/{evil['episodes'][0]['slug']}")
    assert r.headers["content-type"].startswith("application/json")
    assert SCRIPT in r.json()["tokens"]  # stored and served verbatim, as data


# ---- XSS and template injection in the raw HTML --------------------------------------------------

RAW_DANGERS = [
    SCRIPT,
    "<img src=x onerror",
    "<svg onload",
    "onmouseover='alert",
    "x49x",
]
JS_HREF = re.compile(r"""(href|src|action|formaction)\s*=\s*["']?\s*javascript:""", re.I)


def test_payloads_are_escaped_in_every_page(client, evil):
    scanned = 0
    for path in page_urls(evil):
        r = client.get(path, headers={"accept": "text/html"})
        assert r.status_code < 500, path
        if not r.headers["content-type"].startswith("text/html"):
            # e.g. a 404 for a path with a "/" in it: JSON, never sniffed as HTML (nosniff).
            assert r.headers["content-type"].startswith("application/json"), path
            assert r.headers["x-content-type-options"] == "nosniff"
            continue
        html = r.text
        scanned += 1
        for danger in RAW_DANGERS:
            assert danger not in html, (path, danger)
        assert not JS_HREF.search(html), path
        # Initial state in <script type="application/json"> must not end its own block early.
        for block in re.findall(r"<script[^>]*>(.*?)</script>", html, flags=re.S):
            assert "<script" not in block.lower() and "<!--" not in block, path
    assert scanned >= 12, scanned  # the rest are JSON 404s (paths with a "/" in them)


def test_json_twins_carry_payloads_as_data(client, evil):
    """The JSON twin of the batch page holds the batch name verbatim: escaping happens in HTML only."""
    r = client.get(f"/b/{evil['batch_id']}?format=json")
    assert r.status_code == 200
    assert r.json()["data"]["name"] == EVIL


# ---- write token ---------------------------------------------------------------------------------

TOKEN = "s3cret-write-token-for-tests"
SMALL = {"tokens": ["q", " a"], "kinds": ["prompt", "policy"], "reward": 1.0, "group": "g"}
SAMPLE = {"n_tasks": 1, "n_per_task": 2, "max_calls": 4, "truth": "exact"}


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    db = tmp_path_factory.mktemp("locked") / "db.sqlite"
    with TestClient(create_app(Settings(database_url=f"sqlite:///{db}", write_token=TOKEN))) as c:
        yield c


AUTH = {"Authorization": f"Bearer {TOKEN}"}
BAD_AUTH = [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 403),
    ({"Authorization": f"Basic {TOKEN}"}, 401),
    ({"Authorization": f"Bearer {TOKEN}x"}, 403),
    ({"Authorization": "Bearer "}, 401),
]


@pytest.mark.parametrize(("headers", "status"), BAD_AUTH)
def test_write_token_required_when_set(locked, headers, status):
    n_before = len(locked.get("/api/batches").json())
    assert upload(locked, [SMALL], headers=headers).status_code == status
    r = locked.post("/api/uploads", json=SMALL, headers=headers)
    assert r.status_code == status
    assert r.json()["error"]["code"] in ("unauthorized", "forbidden")
    assert locked.post("/api/samples", json=SAMPLE, headers=headers).status_code == status
    assert len(locked.get("/api/batches").json()) == n_before  # nothing stored


def test_write_token_checked_before_the_body_is_read(locked):
    """An unauthenticated client cannot make the server parse anything: 401, not 413/422."""
    r = locked.post("/api/uploads", content=b"\0" * (1 << 20), headers={"content-type": "text/plain"})
    assert r.status_code == 401


def test_write_token_lets_writes_through_and_reads_stay_open(locked):
    r = upload(locked, [SMALL, SMALL], headers=AUTH)
    assert r.status_code == 201, r.text
    body = r.json()
    r = locked.post("/api/samples", json=SAMPLE, headers=AUTH)
    assert r.status_code == 201, r.text
    slug = body["episodes"][0]["slug"]
    # Reads need no token.
    assert locked.get(f"/api/episodes/{slug}").status_code == 200
    assert locked.get(f"/e/{slug}").status_code == 200
    # Deleting needs both: the write token and the upload's delete token.
    dt = {"X-Delete-Token": body["delete_token"]}
    assert locked.delete(f"/api/episodes/{slug}", headers=dt).status_code == 401
    assert (
        locked.delete(f"/api/episodes/{slug}", headers={**AUTH, "X-Delete-Token": "nope"}).status_code == 403
    )
    assert locked.delete(f"/api/episodes/{slug}", headers={**AUTH, **dt}).status_code == 204
    assert locked.get(f"/api/episodes/{slug}").status_code == 404
    assert locked.delete(f"/api/batches/{body['batch_id']}", headers=dt).status_code == 401
    assert locked.delete(f"/api/batches/{body['batch_id']}", headers={**AUTH, **dt}).status_code == 204


def test_no_write_token_needed_when_unset(client):
    r = client.post("/api/uploads", json=SMALL)
    assert r.status_code == 201
    r = client.post("/api/samples", json=SAMPLE)
    assert r.status_code == 201, r.text
    tok = r.json()["delete_token"]
    assert client.delete(f"/api/batches/{r.json()['batch_id']}", params={"token": tok}).status_code == 204


# ---- delete tokens -------------------------------------------------------------------------------


def test_delete_needs_the_owners_token(client):
    mine = upload(client, [SMALL, SMALL, SMALL]).json()
    theirs = upload(client, [SMALL]).json()
    a, b, c = (e["slug"] for e in mine["episodes"])
    for headers in ({}, {"X-Delete-Token": "wrong"}, {"X-Delete-Token": theirs["delete_token"]}):
        r = client.delete(f"/api/episodes/{a}", headers=headers)
        assert r.status_code == 403, headers
        assert r.json()["error"]["code"] == "bad_delete_token"
        assert client.get(f"/api/episodes/{a}").status_code == 200
    assert (
        client.delete(
            f"/api/batches/{mine['batch_id']}", params={"token": theirs["delete_token"]}
        ).status_code
        == 403
    )
    # The right token: 204, the episode is gone, its batch-mates stay, the count follows.
    assert (
        client.delete(f"/api/episodes/{a}", headers={"X-Delete-Token": mine["delete_token"]}).status_code
        == 204
    )
    assert client.get(f"/api/episodes/{a}").status_code == 404
    assert client.get(f"/e/{a}").status_code == 404
    assert client.get(f"/api/episodes/{b}").status_code == 200
    batch = client.get(f"/api/batches/{mine['batch_id']}").json()
    assert batch["n_episodes"] == 2 and {e["slug"] for e in batch["episodes"]} == {b, c}
    assert (
        client.delete(f"/api/episodes/{a}", headers={"X-Delete-Token": mine["delete_token"]}).status_code
        == 404
    )
    # The whole batch with its token (query parameter form).
    assert (
        client.delete(f"/api/batches/{mine['batch_id']}", params={"token": mine["delete_token"]}).status_code
        == 204
    )
    assert client.get(f"/api/episodes/{c}").status_code == 404
    assert client.get(f"/api/episodes/{theirs['episodes'][0]['slug']}").status_code == 200


def test_delete_token_is_shown_once_and_stored_hashed(client):
    from sqlalchemy import text

    r = upload(client, [SMALL])
    body = r.json()
    token = body["delete_token"]
    assert len(token) >= 32 and re.fullmatch(r"[A-Za-z0-9_-]+", token)
    for url in (
        f"/api/batches/{body['batch_id']}",
        f"/api/episodes/{body['episodes'][0]['slug']}",
        f"/b/{body['batch_id']}?format=json",
        "/api/batches",
    ):
        assert token not in client.get(url).text
    with client.app.state.engine.connect() as conn:
        dump = "\n".join(
            repr(tuple(row)) for t in ("batch", "episode") for row in conn.execute(text(f"SELECT * FROM {t}"))
        )
    assert token not in dump


# ---- share slugs ---------------------------------------------------------------------------------


def test_share_slugs_are_unguessable(client):
    eps = [dict(SMALL) for _ in range(200)]
    body = upload(client, eps).json()
    slugs = [e["slug"] for e in body["episodes"]]
    assert len(set(slugs)) == len(slugs)
    for e in body["episodes"]:
        # >= 128 random bits: at least 22 characters of the 64-letter URL-safe alphabet.
        assert re.fullmatch(r"[A-Za-z0-9_-]{22,}", e["slug"]), e
        # The share URL is the slug and nothing else: the row id is not in it.
        assert e["url"] == f"/e/{e['slug']}"
    # No shared structure between consecutive slugs (a counter or timestamp would show as a prefix).
    common = [len(_prefix(a, b)) for a, b in zip(slugs, slugs[1:], strict=False)]
    assert max(common) <= 4, common
    # Every position uses much of the alphabet (uniform random letters).
    for pos in range(22):
        assert len({s[pos] for s in slugs}) >= 40, pos
    # Sequential ids do not open episodes.
    for e in body["episodes"][:5]:
        assert client.get(f"/e/{e['id']}").status_code == 404
        assert client.get(f"/api/episodes/{e['id']}").status_code == 404


def _prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
