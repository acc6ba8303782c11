"""Property tests: any valid native episode round-trips exactly; the served JSON Schema accepts
the example file and rejects what the API rejects."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app.svc_helpers import FORMATS, make_client

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def episodes(draw):
    n = draw(st.integers(1, 40))
    kinds = draw(st.lists(st.sampled_from(["prompt", "policy", "tool"]), min_size=n, max_size=n))
    kinds[draw(st.integers(0, n - 1))] = "policy"  # at least one policy token
    ep = {"tokens": draw(st.lists(st.text(max_size=6), min_size=n, max_size=n)), "kinds": kinds}
    for name in ("rewards", "values", "logprobs"):
        if draw(st.booleans()):
            ep[name] = draw(st.lists(finite, min_size=n, max_size=n))
    if draw(st.booleans()):
        ep["reward"] = draw(finite)
    if draw(st.booleans()):
        ep["group"] = draw(st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=8))
    return ep


@pytest.fixture(scope="module")
def client(module_db_url):
    with make_client(module_db_url) as c:
        yield c


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(eps=st.lists(episodes(), min_size=1, max_size=3))
def test_any_valid_episode_round_trips_bit_exact(client, eps):
    r = client.post("/api/uploads", files={"file": ("p.jsonl", "".join(json.dumps(e) + "\n" for e in eps))})
    assert r.status_code == 201, r.text
    for sent, created in zip(eps, r.json()["episodes"], strict=True):
        got = client.get(f"/api/episodes/{created['slug']}").json()
        for k, v in sent.items():
            assert got[k] == v, k


def test_json_schema_matches_the_format(client):
    schema = client.get("/api/schema/episode").json()
    for line in (FORMATS / "native.jsonl").read_text().splitlines():
        jsonschema.validate(json.loads(line), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tokens": ["a"], "kinds": ["assistant"]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tokens": ["a"], "kinds": ["policy"], "colour": 1}, schema)
