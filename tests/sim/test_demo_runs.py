"""The demo data has two short runs from the simulator (app/sim/demo_runs.py): a fresh database
started with the demo shows their timelines, a prompt followed across steps, the episode search and
the comparison of the two."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from app.sim import demo_runs


def test_a_fresh_demo_database_has_two_runs_to_compare(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'demo.db'}", demo=True)
    with TestClient(create_app(settings)) as client:
        runs = client.get("/api/runs").json()
        runs = runs["runs"] if isinstance(runs, dict) else runs
        assert sorted(r["name"] for r in runs) == sorted(d.name for d in demo_runs.RUNS)
        ids = []
        for r in runs:
            got = client.get(f"/api/runs/{r['id']}").json()
            steps = got["steps"]
            assert [s["step"] for s in steps] == list(range(demo_runs.STEPS))  # 40 steps
            assert all(s["n_episodes_seen"] == 36 and s["n_episodes_kept"] == 24 for s in steps)
            ids.append(r["id"])
        page = client.get(
            "/r/compare", params={"runs": f"{ids[0]},{ids[1]}"}, headers={"accept": "text/html"}
        )
        assert page.status_code == 200
        cmp = client.get("/api/runs/compare", params={"runs": f"{ids[0]},{ids[1]}"}).json()
        assert [r["n_steps"] for r in cmp["runs"]] == [demo_runs.STEPS, demo_runs.STEPS]
        # Every task's prompt is the same every step: its history spans the run.
        prompts = client.get(f"/api/runs/{ids[0]}/prompts").json()
        assert len(prompts) == demo_runs.N_TASKS
        assert all(len(p["steps"]) == demo_runs.STEPS for p in prompts)
        # The credit bug's steps put credit on tool tokens: the search finds them, only there.
        buggy = next(r["id"] for r in runs if "bug" in r["name"])
        hits = client.get(
            f"/api/runs/{buggy}/episodes", params={"nonpolicy_abs_adv_share__gt": "0", "limit": "500"}
        )
        assert hits.status_code == 200
        assert hits.json() and {e["step"] for e in hits.json()} <= set(demo_runs.BUG_STEPS)
        # The policy improves: the pass rate of the last ten steps beats the first ten's.
        series = [p["pass_rate"] for p in prompts[0]["steps"]]
        rates = [
            sum(p["steps"][s]["pass_rate"] for p in prompts) / len(prompts) for s in range(demo_runs.STEPS)
        ]
        assert sum(rates[-10:]) > sum(rates[:10]) + 1.0, series
