"""The lab's HTTP surface on the real app with a temp SQLite file: cache, CSV, errors, oracle, pages."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.core.settings import Settings
from app.main import create_app


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    db = tmp_path_factory.mktemp("lab") / "lab.db"
    with TestClient(create_app(Settings(database_url=f"sqlite:///{db}"))) as c:
        yield c


def cache_rows(client, figure: str) -> int:
    with client.app.state.engine.connect() as conn:
        return conn.execute(
            text("SELECT COUNT(*) FROM lab_result WHERE figure = :f"), {"f": figure}
        ).scalar_one()


def assert_error(r, status: int, field: str | None, code: str | None = None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"status", "code", "message", "line", "episode", "field"}
    assert err["status"] == status and err["field"] == field
    assert err["line"] is None and err["episode"] is None
    assert isinstance(err["message"], str) and len(err["message"]) > 10
    if code:
        assert err["code"] == code


# ---- cache ---------------------------------------------------------------------------------------


def test_second_request_is_a_cache_hit(client):
    url = "/api/lab/difficulty?G=6&p_target=0.2"
    before = cache_rows(client, "difficulty")
    r1 = client.get(url)
    assert r1.status_code == 200 and r1.headers["x-lab-cache"] == "miss" and r1.json()["cached"] is False
    assert cache_rows(client, "difficulty") == before + 1
    # Same parameters in another order, with a default spelled out: the same canonical key.
    r2 = client.get("/api/lab/difficulty?p_target=0.20&eps=1e-6&G=6")
    assert r2.headers["x-lab-cache"] == "hit" and r2.json()["cached"] is True
    assert cache_rows(client, "difficulty") == before + 1
    strip = lambda d: {k: v for k, v in d.items() if k != "cached"}  # noqa: E731
    assert strip(r1.json()) == strip(r2.json())
    # A different parameter is a different row.
    assert client.get("/api/lab/difficulty?G=7").headers["x-lab-cache"] == "miss"


def test_cache_survives_in_the_database(client):
    client.get("/api/lab/horizon?max_turns=20")
    with client.app.state.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT params_json, result_json FROM lab_result WHERE figure = 'horizon' AND params_json LIKE :pat"
            ),
            {"pat": '%"max_turns":20,%'},
        ).one()
    params = json.loads(row.params_json)
    assert params["max_turns"] == 20 and params["gamma"] == 1.0 and "_v" in params
    assert json.loads(row.result_json)["turns"][-1] == 20


def test_lambda_default_sweep_and_cache(client):
    r = client.get("/api/lab/lambda")
    assert r.status_code == 200
    body = r.json()
    assert [s["critic"] for s in body["series"]] == ["exact", "stale", "none"]
    assert [p["lam"] for p in body["series"][0]["points"]] == [0.0, 0.5, 0.8, 0.9, 0.95, 0.97, 0.99, 1.0]
    assert client.get("/api/lab/lambda?lams=0,0.5,0.8,0.9,0.95,0.97,0.99,1").headers["x-lab-cache"] == "hit"


# ---- CSV twins -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "figure,query,columns,n_rows",
    [
        (
            "difficulty",
            "points=9",
            {"p", "expected_abs_plain", "expected_abs_normalised", "ratio", "zero_variance"},
            9,
        ),
        ("horizon", "lams=0.95&max_turns=10&max_tokens=100", {"unit", "lam", "distance", "weight"}, None),
        (
            "recovery",
            "batch=200&verl=off",
            {"name", "credit_bad", "credit_recover", "both_positive", "rmse"},
            10,
        ),
        ("oracle", "env=recovery", {"t", "state", "action", "V", "Q", "A", "V_exact"}, 8),
    ],
)
def test_csv_twin(client, figure, query, columns, n_rows):
    r = client.get(f"/api/lab/{figure}?{query}&format=csv")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert columns <= set(rows[0])
    if n_rows is not None:
        assert len(rows) == n_rows
    # The CSV carries the same numbers as the JSON.
    js = client.get(f"/api/lab/{figure}?{query}").json()
    if figure == "difficulty":
        assert float(rows[4]["ratio"]) == pytest.approx(js["curve"][4]["ratio"])
        assert float(rows[4]["p"]) == 0.5
    if figure == "recovery":
        assert rows[0]["name"] == "oracle_advantage" and float(rows[0]["credit_bad"]) == -0.25


def test_lambda_csv(client):
    rows = list(csv.DictReader(io.StringIO(client.get("/api/lab/lambda?format=csv").text)))
    assert len(rows) == 24 and {r["critic"] for r in rows} == {"exact", "stale", "none"}
    assert {"lam", "rel_bias", "variance", "noise_floor"} <= set(rows[0])


# ---- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url,field,code",
    [
        ("/api/lab/lambda?lams=0,1.5", "lams", "invalid_param"),
        ("/api/lab/lambda?lams=0,nan", "lams", "invalid_param"),
        ("/api/lab/lambda?episodes=ten", "episodes", "invalid_param"),
        ("/api/lab/lambda?episodes=5", "episodes", "invalid_param"),
        ("/api/lab/lambda?lam=0.9", "lam", "unknown_param"),
        ("/api/lab/lambda?seed=1&seed=2", "seed", "repeated_param"),
        ("/api/lab/difficulty?G=1", "G", "invalid_param"),
        ("/api/lab/difficulty?std=biased", "std", "invalid_param"),
        ("/api/lab/horizon?gamma=inf", "gamma", "invalid_param"),
        ("/api/lab/recovery?q=1.2", "q", "invalid_param"),
        ("/api/lab/recovery?batch=-3", "batch", "invalid_param"),
        ("/api/lab/oracle?env=moon", "env", "invalid_param"),
        ("/api/lab/oracle?env=horizon&p_stop=2", "p_stop", "invalid_param"),
        ("/api/lab/difficulty?format=xml", "format", "invalid_param"),
        ("/api/lab/lambda?horizon=1&cost=0&logit_scale=0", "logit_scale", "invalid_param"),
    ],
)
def test_invalid_parameters_answer_in_the_error_shape(client, url, field, code):
    assert_error(client.get(url), 422, field, code)


def test_unknown_lab_page_is_404(client):
    assert_error(client.get("/lab/nope"), 404, None, "not_found")


# ---- the oracle endpoint ---------------------------------------------------------------------------


def _row(body, t, s, a):
    return next(r for r in body["rows"] if (r["t"], r["state"], r["action"]) == (t, s, a))


def test_oracle_repair_uniform_exact(client):
    b = client.get("/api/lab/oracle?env=repair").json()
    assert b["exact_fractions"] is True
    assert b["J_exact"] == "7/4860" and b["J"] == pytest.approx(7 / 4860)
    assert b["expected_length_exact"] == "211/81" and b["expected_length"] == pytest.approx(211 / 81)
    assert b["p_success_exact"] == "32/243"
    assert len(b["rows"]) == 5 * 3 * 3
    # Submitting from `fixed` at the last step pays 0.95: Q = 19/20.
    assert _row(b, 4, "fixed", "submit")["Q_exact"] == "19/20"
    assert _row(b, 0, "located", "read")["reachable"] is False
    assert _row(b, 0, "fresh", "read")["visitation"] == 1.0


def test_oracle_recovery_closed_forms(client):
    b = client.get("/api/lab/oracle?env=recovery&q=0.5").json()
    # V0 = 1/2 + q/4 = 5/8; A(BAD) = q/4 - 1/2 = -3/8; A(RECOVER) = q/2 = 1/4.
    assert _row(b, 0, "s0", "BAD")["A_exact"] == "-3/8"
    assert _row(b, 0, "s0", "GOOD")["V_exact"] == "5/8"
    assert _row(b, 1, "mistake", "RECOVER")["A_exact"] == "1/4"
    assert b["J_exact"] == "5/8"


def test_oracle_delayed_and_horizon(client):
    b = client.get("/api/lab/oracle?env=delayed&horizon=4&k=3").json()
    assert _row(b, 0, "s0", "GOOD")["A_exact"] == "3/10" and _row(b, 0, "s0", "GOOD")["A"] == pytest.approx(
        0.3
    )
    assert {r["A_exact"] for r in b["rows"] if r["action"].startswith("D") and r["reachable"]} == {"0"}
    assert b["expected_length_exact"] == "4"
    h = client.get("/api/lab/oracle?env=horizon&p_stop=0.5").json()
    assert _row(h, 0, "s", "STOP")["V"] == 0.8125 and _row(h, 0, "s", "STOP")["V_exact"] == "13/16"


def test_oracle_softmax_policy_gives_floats_only(client):
    b = client.get("/api/lab/oracle?env=repair&logit_seed=3&logit_scale=1").json()
    assert b["exact_fractions"] is False and b["J_exact"] is None
    row = _row(b, 0, "fresh", "read")
    assert row["V_exact"] is None and isinstance(row["V"], float)
    probs = [r["pi"] for r in b["rows"] if r["t"] == 0 and r["state"] == "fresh"]
    assert sum(probs) == pytest.approx(1.0) and max(probs) - min(probs) > 0.05


# ---- pages and the vendored Plotly ------------------------------------------------------------------


@pytest.mark.parametrize("figure", ["lambda", "difficulty", "horizon", "recovery"])
def test_pages_render_without_inline_scripts(client, figure):
    r = client.get(f"/lab/{figure}?seed=3" if figure in ("lambda", "recovery") else f"/lab/{figure}")
    assert r.status_code == 200
    html = r.text
    assert "/vendor/plotly-basic.min.js" in html and "/static/lab.js" in html  # every figure is basic
    # Every <script> is external or inert JSON: CSP script-src 'self' holds.
    for tag in re.findall(r"<script[^>]*>", html):
        assert "src=" in tag or 'type="application/json"' in tag, tag
    state = json.loads(
        re.search(r'<script type="application/json" id="lab-state">(.*?)</script>', html, re.S).group(1)
    )
    assert state["figure"] == figure and state["api"].startswith(f"/api/lab/{figure}")
    assert state["csv"].endswith("format=csv")
    if figure == "lambda":
        assert state["api"] == "/api/lab/lambda?seed=3" and state["params"]["seed"] == 3
        assert 'name="lams" type="text" value="0,0.5,0.8,0.9,0.95,0.97,0.99,1"' in html


def test_page_with_bad_params_shows_the_error(client):
    r = client.get("/lab/recovery?q=5")
    assert r.status_code == 422
    assert "q must lie in [0, 1]" in r.text and 'aria-invalid="true"' in r.text


def test_lab_index_links_every_figure(client):
    html = client.get("/lab").text
    for fig in ("lambda", "difficulty", "horizon", "recovery"):
        assert f'href="/lab/{fig}"' in html and f'href="/api/lab/{fig}?format=csv"' in html


def test_vendored_plotly(client):
    r = client.get("/vendor/plotly.min.js")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/javascript")
    assert "max-age=31536000" in r.headers["cache-control"]
    assert len(r.content) > 1_000_000 and b"plotly" in r.content[:2000].lower()
    etag = r.headers["etag"]
    assert client.get("/vendor/plotly.min.js", headers={"If-None-Match": etag}).status_code == 304


def test_vendored_plotly_basic_is_the_same_plotly_js_release(client):
    """The run page's basic bundle (static/vendor/) is plotly.js's own dist of the release the
    installed plotly package bundles: upgrading one without the other fails here."""
    from plotly.offline import get_plotlyjs_version

    r = client.get("/vendor/plotly-basic.min.js")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/javascript")
    assert "immutable" in r.headers["cache-control"]
    head = r.content[:300].decode()
    assert f"plotly.js (basic - minified) v{get_plotlyjs_version()}" in head
    assert len(r.content) < len(client.get("/vendor/plotly.min.js").content) / 3
    etag = r.headers["etag"]
    assert client.get("/vendor/plotly-basic.min.js", headers={"If-None-Match": etag}).status_code == 304


@pytest.mark.postgres
def test_cache_on_postgresql():
    import os
    import random

    url = os.environ.get("CREDITLENS_TEST_PG_URL")
    if not url:
        pytest.skip("CREDITLENS_TEST_PG_URL is not set")
    # The PostgreSQL database outlives the test: a fresh parameter value makes the first call a miss.
    G = random.randint(2, 256)
    tasks = random.randint(1, 100_000)
    with TestClient(create_app(Settings(database_url=url))) as c:
        first = c.get(f"/api/lab/difficulty?G={G}&tasks={tasks}")
        assert first.status_code == 200 and first.headers["x-lab-cache"] == "miss"
        second = c.get(f"/api/lab/difficulty?tasks={tasks}&G={G}")
        assert second.headers["x-lab-cache"] == "hit"
        assert second.json()["conditional_scale"] == first.json()["conditional_scale"]


# ---- bounds: work budget, cache size, concurrent misses, caps in the 422 -----------------------------


def test_work_beyond_the_budget_is_a_413_saying_what_to_reduce(client):
    # 100,000 episodes x 10 steps measured ~550 MB: over the default budget, refused before computing.
    before = cache_rows(client, "lambda")
    r = client.get("/api/lab/lambda?episodes=100000&horizon=10")
    assert_error(r, 413, None, "work_budget")
    msg = r.json()["error"]["message"]
    assert "CREDITLENS_LAB_MAX_WORK" in msg and "`episodes`" in msg and "`horizon`" in msg
    assert cache_rows(client, "lambda") == before
    assert client.get("/api/lab/recovery?batch=200000").status_code == 413


@pytest.mark.parametrize(
    "query, field, caps",
    [("G=abc", "G", "[2, 256]"), ("eps=nan", "eps", "[0, 1]"), ("G=1", "G", "[2, 256]")],
)
def test_422_messages_state_the_caps(client, query, field, caps):
    r = client.get(f"/api/lab/difficulty?{query}")
    assert_error(r, 422, field)
    assert caps in r.json()["error"]["message"]


def test_cache_is_bounded_by_rows_and_bytes_least_recently_used_first(tmp_path):
    from app.lab.compute import evict

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'lru.db'}", lab_cache_rows=3)
    with TestClient(create_app(settings)) as c:
        for g in (2, 3, 4):
            assert c.get(f"/api/lab/difficulty?G={g}&points=9").headers["x-lab-cache"] == "miss"
        # Make G=2 the most recently used (its created_at is refreshed on a hit older than a minute).
        with c.app.state.engine.begin() as conn:
            conn.execute(text("UPDATE lab_result SET created_at = '2000-01-01 00:00:00'"))
        assert c.get("/api/lab/difficulty?G=2&points=9").headers["x-lab-cache"] == "hit"
        assert c.get("/api/lab/difficulty?G=5&points=9").headers["x-lab-cache"] == "miss"
        assert cache_rows(c, "difficulty") == 3
        # G=3 was the least recently used (G=4 ties on time and is newer by id): it went.
        assert c.get("/api/lab/difficulty?G=3&points=9").headers["x-lab-cache"] == "miss"
        assert c.get("/api/lab/difficulty?G=2&points=9").headers["x-lab-cache"] == "hit"
        # The byte bound: room for the two most recently used rows -> the oldest goes.
        with c.app.state.engine.connect() as conn:
            sizes = (
                conn.execute(
                    text("SELECT LENGTH(result_json) FROM lab_result ORDER BY created_at DESC, id DESC")
                )
                .scalars()
                .all()
            )
        from sqlmodel import Session

        with Session(c.app.state.engine) as session:
            assert evict(session, 100, sizes[0] + sizes[1]) == 1
        assert cache_rows(c, "difficulty") == 2
        assert c.get("/api/lab/difficulty?G=3&points=9").headers["x-lab-cache"] == "hit"


def test_concurrent_misses_of_the_same_key_both_answer(tmp_path):
    import threading

    import httpx

    from tests.live_server import Server

    with Server(tmp_path / "race.db", tmp_path / "server.log") as srv:
        url = f"{srv.base}/api/lab/lambda?episodes=3000&seed=7"
        barrier = threading.Barrier(4)
        results: list = []

        def get():
            barrier.wait()
            results.append(httpx.get(url, timeout=120))

        threads = [threading.Thread(target=get) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.status_code for r in results] == [200] * 4
        bodies = [{k: v for k, v in r.json().items() if k != "cached"} for r in results]
        assert all(b == bodies[0] for b in bodies)
        assert "Traceback" not in srv.log()
