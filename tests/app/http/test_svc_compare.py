"""GET /api/runs/compare and /r/compare: runs side by side, each metric's series per run; a run
the caller may not read is a 404 naming the parameter. The real app on a real SQLite file."""

from __future__ import annotations

import pytest

from tests.app.svc_helpers import episode, jsonl


def new_run(client, name, pass_rates, **body):
    run = client.post("/api/runs", json={"name": name, **body}).json()
    for step, rate in enumerate(pass_rates):
        eps = [episode(float(i < rate * 4), "g") for i in range(4)]
        r = client.post(
            f"/api/runs/{run['ref']}/steps/{step * 10}", content=jsonl(eps), params={"format": "native"}
        )
        assert r.status_code == 201, r.text
    return run


def test_each_metric_series_per_run_in_order(client):
    a = new_run(client, "baseline", [0.25, 0.5])
    b = new_run(client, "fixed", [0.5, 0.75, 1.0], visibility="unlisted")
    r = client.get("/api/runs/compare", params={"runs": f"{b['ref']},{a['id']}"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["name"] for x in body["runs"]] == ["fixed", "baseline"]
    assert [x["url"] for x in body["runs"]] == [f"/r/{b['ref']}", f"/r/{a['id']}"]
    assert body["metrics"]["pass_rate"] == [[[0, 0.5], [10, 0.75], [20, 1.0]], [[0, 0.25], [10, 0.5]]]
    assert body["runs"][0]["n_steps"] == 3
    # The page and its JSON twin (the page is not taken for a run called "compare").
    page = client.get("/r/compare", params={"runs": f"{a['id']},{b['ref']}"}, headers={"accept": "text/html"})
    assert page.status_code == 200 and "Runs side by side" in page.text
    twin = client.get(
        "/r/compare", params={"runs": f"{a['id']},{b['ref']}"}, headers={"accept": "application/json"}
    )
    assert twin.json()["data"]["metrics"]["pass_rate"][0] == [[0, 0.25], [10, 0.5]]


@pytest.mark.parametrize("runs", [None, "", "1", "1,1", ",".join(str(i) for i in range(1, 10)), "1,x/y"])
def test_bad_runs_parameter_is_4xx_naming_it(client, runs):
    new_run(client, "one", [0.5])
    new_run(client, "two", [0.5])
    r = client.get("/api/runs/compare", params={} if runs is None else {"runs": runs})
    assert r.status_code in (404, 422), r.text
    assert r.json()["error"]["field"] == "runs"


def test_a_run_the_caller_may_not_read_is_a_404_naming_runs(client):
    a = new_run(client, "public", [0.5])
    hidden = new_run(client, "hidden", [0.5], visibility="unlisted")
    r = client.get("/api/runs/compare", params={"runs": f"{a['id']},{hidden['id']}"})  # unlisted by id
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["field"] == "runs" and str(hidden["id"]) in err["message"]
    r = client.get("/api/runs/compare", params={"runs": f"{a['id']},424242"})
    assert r.status_code == 404 and r.json()["error"]["field"] == "runs"
