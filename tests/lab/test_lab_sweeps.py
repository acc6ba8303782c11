"""The multi-seed lab pages on the real app (temp SQLite file): /api/lab/recovery with seeds, the
delayed-effect horizon sweep and the variable-horizon sweep. Their numbers equal the estimators
package's functions called directly; CSV twins; caps (422 naming the cap) and the work budget (413)."""

from __future__ import annotations

import csv
import io

import pytest
import torch
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from estimators.oracles import (
    benchmark,
    delayed_horizon_sweep,
    recovery_env,
    variable_horizon_sweep,
)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    db = tmp_path_factory.mktemp("lab") / "lab.db"
    with TestClient(create_app(Settings(database_url=f"sqlite:///{db}"))) as c:
        yield c


def get(client, url: str) -> dict:
    r = client.get(url)
    assert r.status_code == 200, r.text
    return r.json()


def one_thread(fn, *args, **kw):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args, **kw)
    finally:
        torch.set_num_threads(before)


# ---- recovery with seeds ---------------------------------------------------------------------------


def test_recovery_with_seeds_equals_benchmark(client):
    js = get(client, "/api/lab/recovery?verl=off&batch=300&seed=4&seeds=3")
    want = one_thread(benchmark, recovery_env(1), ["oracle", "grpo", "rloo"], [4, 5, 6], 300)
    by_name = {r["name"]: r for r in want["estimators"]}
    rows = {r["name"]: r for r in js["rows"]}
    for ours, theirs in (("oracle_advantage", "oracle"), ("grpo", "grpo"), ("rloo", "rloo")):
        row, ref = rows[ours], by_name[theirs]
        for k, v in ref["metrics"].items():
            assert row["metrics"][k] == pytest.approx(v["mean"], abs=1e-12, nan_ok=True), (ours, k)
            assert row["se"][k] == pytest.approx(v["se"], abs=1e-12), (ours, k)
        assert row["across_seeds"]["gradient_variance"] == pytest.approx(ref["gradient_variance"], abs=1e-12)
        assert row["across_seeds"]["mean_gradient_cosine"] == pytest.approx(
            ref["mean_gradient_cosine"], abs=1e-12
        )
    # The exact advantage: credit(BAD) = q/4 - 1/2 = -0.25 on every seed, so its SE is 0.
    assert (
        rows["oracle_advantage"]["credit_bad"] == -0.25 and rows["oracle_advantage"]["se"]["credit_bad"] == 0
    )
    assert js["batch"]["episodes"] == 900


def test_recovery_one_seed_is_the_single_batch_figure(client):
    one = get(client, "/api/lab/recovery?verl=off&batch=300&seed=4")
    same = get(client, "/api/lab/recovery?verl=off&batch=300&seed=4&seeds=1")
    assert one["rows"] == same["rows"] and one["params"]["seeds"] == 1
    assert all("se" not in r and "across_seeds" not in r for r in one["rows"])


def test_recovery_csv_with_seeds_has_standard_errors(client):
    r = client.get("/api/lab/recovery?verl=off&batch=200&seeds=2&format=csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 10
    assert {
        "credit_bad_se",
        "rmse_se",
        "across_seeds_gradient_variance",
        "across_seeds_mean_gradient_cosine",
    } <= set(rows[0])
    assert float(rows[0]["credit_bad_se"]) == 0.0  # the oracle row


# ---- delayed-effect horizon sweep -------------------------------------------------------------------

DELAYED = "horizons=2,3,6&estimators=oracle,grpo,turn_loo,gigpo&seeds=3&batch=150&seed=2"


def test_delayed_horizon_api_equals_the_sweep(client):
    js = get(client, f"/api/lab/delayed_horizon?{DELAYED}")
    want = one_thread(
        delayed_horizon_sweep, [2, 3, 6], ["oracle", "grpo", "turn_loo", "gigpo"], [2, 3, 4], 150
    )
    assert len(js["rows"]) == len(want) == 12
    for got, ref in zip(js["rows"], want, strict=True):
        assert (got["horizon"], got["estimator"]) == (ref["horizon"], ref["estimator"])
        for key in ("leakage_ratio", "gradient_cosine"):
            assert got[key]["n"] == ref[key]["n"] == 3
            assert got[key]["mean"] == pytest.approx(ref[key]["mean"], abs=1e-12)
            assert got[key]["se"] == pytest.approx(ref[key]["se"], abs=1e-12)
        assert got["gradient_variance"] == pytest.approx(ref["gradient_variance"], abs=1e-12)
    assert js["gradient_params"] == "per_timestep"
    # The exact advantage never leaks onto the distractors (their A is exactly 0).
    assert all(r["leakage_ratio"]["mean"] == 0 for r in js["rows"] if r["estimator"] == "oracle")


def test_delayed_horizon_shared_params(client):
    js = get(client, f"/api/lab/delayed_horizon?{DELAYED}&params=shared")
    want = one_thread(
        delayed_horizon_sweep,
        [2, 3, 6],
        ["oracle", "grpo", "turn_loo", "gigpo"],
        [2, 3, 4],
        150,
        params="shared",
    )
    assert js["gradient_params"] == "shared"
    got = [r["gradient_cosine"]["mean"] for r in js["rows"]]
    assert got == pytest.approx([r["gradient_cosine"]["mean"] for r in want], abs=1e-12)


def test_delayed_horizon_csv(client):
    r = client.get(f"/api/lab/delayed_horizon?{DELAYED}&format=csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    js = get(client, f"/api/lab/delayed_horizon?{DELAYED}")
    assert len(rows) == 12
    assert (
        rows[5]["estimator"] == js["rows"][5]["estimator"]
        and int(rows[5]["horizon"]) == js["rows"][5]["horizon"]
    )
    assert float(rows[5]["leakage_ratio_mean"]) == pytest.approx(
        js["rows"][5]["leakage_ratio"]["mean"], rel=1e-12
    )
    assert float(rows[5]["gradient_cosine_se"]) == pytest.approx(
        js["rows"][5]["gradient_cosine"]["se"], rel=1e-12
    )
    assert rows[0]["params"] == "per_timestep"


# ---- variable-horizon sweep -------------------------------------------------------------------------

VARIABLE = "stop_probabilities=0.25,0.5&estimators=oracle,rloo,turn_loo&seeds=3&batch=150&continue_reward=0.5"


def test_variable_horizon_api_equals_the_sweep(client):
    js = get(client, f"/api/lab/variable_horizon?{VARIABLE}")
    want = one_thread(
        variable_horizon_sweep,
        [0.25, 0.5],
        ["oracle", "rloo", "turn_loo"],
        [0, 1, 2],
        150,
        continue_reward=0.5,
    )
    assert len(js["rows"]) == len(want) > 0
    for got, ref in zip(js["rows"], want, strict=True):
        assert (got["p"], got["estimator"], got["t"], got["n"]) == (
            ref["p"],
            ref["estimator"],
            ref["t"],
            ref["n"],
        )
        assert got["bias"] == pytest.approx(ref["bias"], abs=1e-12)
        assert got["bias_seeds"]["mean"] == pytest.approx(ref["bias_seeds"]["mean"], abs=1e-12)
        assert got["bias_seeds"]["se"] == pytest.approx(ref["bias_seeds"]["se"], abs=1e-12, nan_ok=True)
    assert js["horizon"] == 5
    assert all(r["bias"] == pytest.approx(0, abs=1e-12) for r in js["rows"] if r["estimator"] == "oracle")


def test_variable_horizon_csv(client):
    rows = list(
        csv.DictReader(io.StringIO(client.get(f"/api/lab/variable_horizon?{VARIABLE}&format=csv").text))
    )
    js = get(client, f"/api/lab/variable_horizon?{VARIABLE}")
    assert len(rows) == len(js["rows"])
    assert {"p", "estimator", "t", "n", "bias", "bias_mean", "bias_se", "bias_n"} <= set(rows[0])
    assert float(rows[-1]["bias_mean"]) == pytest.approx(js["rows"][-1]["bias_seeds"]["mean"], rel=1e-12)


# ---- caps and the work budget ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, field, cap",
    [
        ("/api/lab/delayed_horizon?seeds=51", "seeds", "[1, 50]"),
        ("/api/lab/delayed_horizon?horizons=2,65", "horizons", "[2, 64]"),
        ("/api/lab/delayed_horizon?batch=20001", "batch", "[10, 20000]"),
        ("/api/lab/variable_horizon?seeds=0", "seeds", "[1, 50]"),
        ("/api/lab/variable_horizon?stop_probabilities=0.5,1.5", "stop_probabilities", "[0, 1]"),
        ("/api/lab/recovery?seeds=31", "seeds", "[1, 30]"),
    ],
)
def test_caps_are_a_422_naming_the_cap(client, url, field, cap):
    r = client.get(url)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field and cap in err["message"]


def test_unknown_estimator_is_a_422_listing_the_choices(client):
    r = client.get("/api/lab/delayed_horizon?estimators=oracle,magic")
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == "estimators" and "'magic'" in err["message"] and "gigpo" in err["message"]


@pytest.mark.parametrize(
    "url",
    [
        "/api/lab/delayed_horizon?seeds=50&batch=2000&horizons=2,4,8,16,32,64",
        "/api/lab/variable_horizon?seeds=50&batch=20000",
        "/api/lab/recovery?seeds=30&batch=100000&verl=off",
    ],
)
def test_too_much_work_is_a_413_saying_what_to_reduce(client, url):
    r = client.get(url)
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "too_much_work" and "fewer seeds" in err["message"]


@pytest.mark.parametrize("figure", ["delayed_horizon", "variable_horizon", "recovery"])
def test_pages_say_which_gradient_parameters(client, figure):
    r = client.get(f"/lab/{figure}")
    assert r.status_code == 200
    if figure == "variable_horizon":
        assert "shows no gradient metrics" in r.text  # so no parametrisation to choose
    else:
        assert "per-timestep" in r.text or "per_timestep" in r.text
    assert 'name="seeds"' in r.text
