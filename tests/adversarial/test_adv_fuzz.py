"""Fuzz the service: every JSON API operation from the app's own OpenAPI document (schemathesis),
and the HTML pages (hypothesis, junk in paths and query strings).

Checks on every generated request, valid or not: no 5xx; the response matches the schema the
OpenAPI document declares for it; every 4xx is the one error shape; security headers are present.
The app runs on a temp SQLite file holding the demo batches; path parameters are drawn from both
generated junk and the real slugs/batch ids/groups, so the success paths are fuzzed too.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error, response_schema_conformance
from sqlalchemy import text

from tests.adversarial.adv_helpers import fuzz_app

APP = fuzz_app()
with APP.state.engine.connect() as _c:
    SLUGS = [r[0] for r in _c.execute(text("SELECT slug FROM episode ORDER BY id LIMIT 40"))]
    BATCH_IDS = [r[0] for r in _c.execute(text("SELECT id FROM batch ORDER BY id"))]
    GROUPS = [
        (r[0], r[1])
        for r in _c.execute(text('SELECT DISTINCT batch_id, "group" FROM episode WHERE "group" IS NOT NULL'))
    ]
assert SLUGS and BATCH_IDS and GROUPS, "the demo fixtures did not load"

# The lab figures declare no parameters in the OpenAPI document (they parse the raw query), so
# schemathesis could only call their multi-second defaults; test_lab_pages_fuzz sends them junk.
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path_regex="^/api/lab/")
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@schema.hook
def flatmap_path_parameters(context, path_parameters):  # noqa: ARG001 (schemathesis hook signature)
    """Half the time, real ids instead of generated ones (so 200 answers get checked as well)."""
    params = dict(path_parameters or {})
    real: dict = {}
    if "slug" in params:
        real["slug"] = st.sampled_from(SLUGS)
    if "batch_id" in params and "group" in params:
        return st.one_of(
            st.just(params),
            st.sampled_from(GROUPS).map(lambda bg: {**params, "batch_id": bg[0], "group": bg[1]}),
        )
    if "batch_id" in params:
        real["batch_id"] = st.sampled_from(BATCH_IDS)
    if not real:
        return st.just(params)
    return st.one_of(st.just(params), st.fixed_dictionaries(real).map(lambda r: {**params, **r}))


# Keep valid sampling requests small: the sizes the schema allows (20 tasks x 64 attempts with a
# 1000-step critic fit) take minutes each, the defaults seconds. Out-of-range values are left
# alone: they must be 422s.
_SAMPLE_CAPS = {"n_tasks": 2, "n_per_task": 3, "max_calls": 6, "critic_steps": 5, "n_rollouts": 2}


@schema.hook
def map_body(context, body):
    if context.operation is None or context.operation.path != "/api/samples" or not isinstance(body, dict):
        return body
    out = dict(body)
    for key, cap in _SAMPLE_CAPS.items():
        v = out.setdefault(key, cap)  # absent keys would take the (large) defaults
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 1 <= v <= 10_000:
            out[key] = min(int(v), cap) if float(v).is_integer() else v
    return out


SECURITY_HEADERS = ("x-content-type-options", "referrer-policy", "x-frame-options")


def one_error_shape(ctx, response, case):  # noqa: ARG001 (schemathesis check signature)
    """Every 4xx is {"error": {status, code, message, line, episode, field}}; security headers everywhere."""
    for h in SECURITY_HEADERS:
        assert h in {k.lower() for k in response.headers}, f"missing header {h}"
    if 400 <= response.status_code < 500:
        err = response.json()["error"]
        assert set(err) == {"status", "code", "message", "line", "episode", "field"}, err
        assert err["status"] == response.status_code
        assert isinstance(err["code"], str) and err["code"]
        assert isinstance(err["message"], str) and err["message"]
    return None


@schema.parametrize()
@FUZZ
def test_api_fuzz(case):
    # A generous read timeout: a small synchronous sample (critic training included) can take
    # several seconds on a busy 2-core machine; the budget that keeps it small is the 413 test.
    case.call_and_validate(
        checks=[not_a_server_error, response_schema_conformance, one_error_shape], timeout=60
    )


LOCKED_APP = fuzz_app(write_token="fuzz-write-token")
locked_schema = (
    schemathesis.openapi.from_asgi("/openapi.json", LOCKED_APP)
    .include(method=["POST", "DELETE"])
    .exclude(path_regex="^/api/lab/")
)


def needs_write_token(ctx, response, case):  # noqa: ARG001 (schemathesis check signature)
    """With CREDITLENS_WRITE_TOKEN set and no Authorization header, every write answers 401
    (the token is checked before the body is parsed or validated)."""
    if case.method.upper() != case.operation.method.upper():  # probes with other methods: 405
        assert response.status_code == 405
        return
    if case.operation.path in ("/api/samples", "/api/runs") and response.status_code in (400, 422):
        # FastAPI decodes a declared JSON body before any dependency runs, so bytes that are not
        # JSON are refused first; nothing is validated or stored either way.
        message = response.json()["error"]["message"]
        assert "JSON decode error" in message or "error parsing the body" in message, message
        return
    assert response.status_code == 401, (response.status_code, response.text[:300])
    assert response.json()["error"]["code"] == "unauthorized"


@locked_schema.parametrize()
@settings(FUZZ, max_examples=10)
def test_api_fuzz_writes_need_the_token(case):
    case.call_and_validate(checks=[not_a_server_error, needs_write_token])


# ---- a private server (CREDITLENS_READ_TOKEN) ------------------------------------------------------

READ_TOKEN = "fuzz-read-token"
READ_AUTH = {"Authorization": f"Bearer {READ_TOKEN}"}
READ_APP = fuzz_app(read_token=READ_TOKEN)
with READ_APP.state.engine.connect() as _c:
    READ_SLUGS = [r[0] for r in _c.execute(text("SELECT slug FROM episode ORDER BY id LIMIT 40"))]
# The OpenAPI document itself needs the token. Sampling is left out (its jobs outlive the test;
# test_api_fuzz covers it), as are the lab's multi-second defaults.
read_schema = (
    schemathesis.openapi.from_asgi("/openapi.json", READ_APP, headers=READ_AUTH)
    .exclude(path_regex="^/api/lab/")
    .exclude(path_regex="^/api/samples")
)


@read_schema.hook("flatmap_path_parameters")
def _read_path_parameters(context, path_parameters):  # noqa: ARG001 (schemathesis hook signature)
    """Half the time real slugs and batch ids of the private server's demo batches."""
    params = dict(path_parameters or {})
    real: dict = {}
    if "slug" in params:
        real["slug"] = st.sampled_from(READ_SLUGS)
    if "batch_id" in params:
        real["batch_id"] = st.sampled_from(BATCH_IDS)
    if not real:
        return st.just(params)
    return st.one_of(st.just(params), st.fixed_dictionaries(real).map(lambda r: {**params, **r}))


def read_token_enforced(ctx, response, case):  # noqa: ARG001 (schemathesis check signature)
    """With the token the server answers as a public one would (never 401); the same request
    without it is a 401 in the one error shape, whatever its parameters or body."""
    assert response.status_code != 401, (case.method, case.path, response.text[:300])
    if case.operation.path == "/healthz":  # open to everyone, token or not
        return
    bare = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    r = _client_for(READ_APP).request(
        case.method, case.formatted_path, params=case.query, headers=bare, content=b"{}"
    )
    assert r.status_code == 401, (case.method, case.formatted_path, r.status_code)
    assert r.json()["error"]["code"] == "read_token_required"


@read_schema.parametrize()
@settings(FUZZ, max_examples=5)
def test_api_fuzz_with_read_token(case):
    case.call_and_validate(
        headers=READ_AUTH,
        checks=[not_a_server_error, response_schema_conformance, one_error_shape, read_token_enforced],
    )


def _client_for(app) -> TestClient:
    return TestClient(app, raise_server_exceptions=False)


def _wait_for_jobs(job_ids: set[str] | None, deadline_s: float = 120) -> dict[str, dict]:
    """Poll the job table (app/storage/jobs.py) until the given jobs (all jobs when None) are done or
    error, or until the deadline; returns the jobs it waited on by token."""
    import json

    deadline = time.monotonic() + deadline_s
    while True:
        with APP.state.engine.connect() as conn:
            rows = conn.execute(text("SELECT token, state, result_json, error_json FROM job")).all()
        jobs = {
            tok: {
                "state": state,
                "batch_id": json.loads(result)["batch_id"] if result else None,
                "error": json.loads(error) if error else None,
            }
            for tok, state, result, error in rows
            if job_ids is None or tok in job_ids
        }
        if all(j["state"] in ("done", "error") for j in jobs.values()) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.05)


def test_background_sample_jobs_finish():
    """A job started with ?async=true ends done, with a stored batch; every other job (the fuzzer
    started some when it ran first) ends done or error, never stuck and never a 5xx. Waiting here
    also keeps torch threads from outliving the interpreter. Schemathesis ends the app's lifespan
    with each fuzz test, and that shutdown hands unfinished jobs back to the queue: start the job
    pool again here so they all get run."""
    APP.state.jobs.start()
    client = _client()
    res = client.post("/api/samples?async=true", json={"n_tasks": 2, "n_per_task": 2, "seed": 3})
    assert res.status_code == 202, res.text
    job_id = res.json()["job_id"]
    ours = _wait_for_jobs({job_id})[job_id]
    assert ours["state"] == "done", ours
    polled = client.get(f"/api/samples/jobs/{job_id}").json()
    assert polled["state"] == "done" and polled["batch_id"] == ours["batch_id"], polled
    batch = client.get(f"/api/batches/{ours['batch_id']}").json()
    assert batch["n_episodes"] == 4, batch
    jobs = _wait_for_jobs(None)
    assert job_id in jobs
    assert all(j["state"] in ("done", "error") for j in jobs.values()), jobs
    errors = [j["error"] for j in jobs.values() if j["state"] == "error"]
    assert all(e["status"] < 500 for e in errors), errors
    APP.state.jobs.stop()


# ---- HTML pages ----------------------------------------------------------------------------------

junk = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
numberish = st.one_of(junk, st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers().map(str))
EPISODE_KEYS = ["scheme", "gamma", "lam", "baseline", "critic", "open", "tok", "format", "junk"]


def _client() -> TestClient:
    return TestClient(APP, raise_server_exceptions=False)


@given(
    slug=st.one_of(st.sampled_from(SLUGS), junk),
    query=st.dictionaries(st.sampled_from(EPISODE_KEYS), numberish, max_size=6),
)
@FUZZ
def test_episode_page_fuzz(slug, query):
    r = _client().get(f"/e/{quote(slug, safe='')}", params=query)
    assert r.status_code < 500, (slug, query, r.text[:300])
    assert "content-security-policy" in r.headers


@given(
    batch=st.one_of(st.sampled_from(BATCH_IDS).map(str), st.integers().map(str), junk),
    group=st.one_of(st.sampled_from([g for _, g in GROUPS]), junk),
    q=junk,
    fmt=st.sampled_from(["", "json", "html", "csv"]),
)
@FUZZ
def test_batch_and_group_pages_fuzz(batch, group, q, fmt):
    c = _client()
    b = quote(batch, safe="")
    for url in (f"/b/{b}", f"/b/{b}/g/{quote(group, safe='')}", "/", "/talk/" + b):
        r = c.get(url, params={"q": q, "format": fmt})
        assert r.status_code < 500, (url, q, fmt, r.text[:300])


LAB_NUMERIC = ["gamma", "lams", "G", "eps", "q", "cost", "horizon", "seed", "batch", "episodes"]


def _not_a_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return True
    return False


@given(
    figure=st.one_of(st.sampled_from(["lambda", "difficulty", "horizon", "recovery", "oracle"]), junk),
    bad=st.dictionaries(st.sampled_from(LAB_NUMERIC), junk.filter(_not_a_number), min_size=1, max_size=3),
    extra=st.dictionaries(st.sampled_from(["std", "env", "format", "x"]), junk, max_size=2),
)
@settings(FUZZ, max_examples=15)
def test_lab_pages_fuzz(figure, bad, extra):
    """Lab parameters that are not numbers are refused before any computation: a 4xx page or error."""
    c = _client()
    f = quote(figure, safe="")
    for url in (f"/lab/{f}", f"/api/lab/{f}"):
        r = c.get(url, params={**extra, **bad})
        assert r.status_code < 500, (url, bad, extra, r.text[:300])
        if url.startswith("/api/"):
            assert 400 <= r.status_code < 500, (url, bad, r.text[:300])
            assert set(r.json()["error"]) == {"status", "code", "message", "line", "episode", "field"}
