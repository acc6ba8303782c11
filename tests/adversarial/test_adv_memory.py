"""Memory bounded by what the request needs, against a real server at the default limits.

The adversarial batch: 499 one-token episodes and one 131,000-token episode (a ~2 MB upload).
Before outcome schemes worked on [B] summaries, one GET of a batch-wide scheme (opo, gpg,
REINFORCE++ with a baseline) for it decoded every episode into [B, T_max] float64 arrays: ~2 GB
for this file, ~84 GB at the limits. Now every scheme's answer for the long and a short episode is
ok (or a 413 that says what to reduce), and the server's peak RSS (VmHWM) grows by < 300 MB.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from app.compute.advantages import ROW_NUMBERS
from app.core.settings import Settings
from estimators import available
from tests.adversarial.adv_helpers import Server

LONG = 131_000
BUDGET_MB = 300


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def adversarial_batch() -> bytes:
    """499 one-token episodes in groups of ten, then one 131,000-token episode in group g0."""
    lines = []
    for i in range(499):
        lines.append(
            {
                "tokens": ["a"],
                "kinds": ["policy"],
                "reward": float(i % 3 == 0),
                "group": f"g{i % 50}",
                "logprobs": [-0.5],
            }
        )
    lines.append(
        {
            "tokens": ["x"] * LONG,
            "kinds": ["policy"] * LONG,
            "reward": 1.0,
            "group": "g0",
            "logprobs": [-0.25] * LONG,
        }
    )
    return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adv-memory")
    with Server(tmp / "mem.db", tmp / "server.log") as s:  # default limits
        yield s


def test_every_scheme_on_the_adversarial_batch_stays_within_the_memory_budget(server):
    before = peak_rss_mb(server.pid)
    data = adversarial_batch()
    with httpx.Client(base_url=server.base, timeout=120) as c:
        r = c.post("/api/uploads", files={"file": ("adv.jsonl", data)})
        assert r.status_code == 201, r.text
        slugs = [e["slug"] for e in r.json()["episodes"]]
        long_slug, short_slug = slugs[-1], slugs[0]
        schemes = ["outcome", *available()]
        answers = {}
        inapplicable: set[str] = set()
        over_budget: set[str] = set()  # e.g. a trainer's dialect that reads the whole padded batch
        for scheme in schemes:
            for slug, n in ((long_slug, LONG), (short_slug, 1)):
                r = c.get(f"/api/episodes/{slug}/advantages", params={"scheme": scheme, "critic": "zero"})
                if r.status_code == 413:
                    err = r.json()["error"]
                    assert (
                        err["code"] == "work_budget" and "CREDITLENS_MAX_COMPUTE_CELLS" in err["message"]
                    ), err
                    over_budget.add(scheme)
                    continue
                if r.status_code == 422 and r.json()["error"]["code"] == "scheme_not_applicable":
                    inapplicable.add(scheme)  # e.g. monte_carlo without meta.turn_values
                    continue
                assert r.status_code == 200, (scheme, r.text[:300])
                body = r.json()
                assert body["n_tokens"] == n and len(body["schemes"][0]["advantages"]) == n
                answers[(scheme, n)] = body["schemes"][0]["advantages"][-1]
        # Every registry scheme at once on the long episode: beyond the default budget (each scheme
        # holds ROW_NUMBERS numbers per token), a 413 that says to ask for fewer; the schemes in
        # the largest groups the budget takes all answer.
        runnable = [s for s in schemes if s not in inapplicable | over_budget]
        r = c.get(
            f"/api/episodes/{long_slug}/advantages",
            params={"scheme": ",".join(runnable), "critic": "zero"},
        )
        per_request = (Settings().max_compute_cells // LONG - 4) // ROW_NUMBERS
        if len(runnable) > per_request:
            assert r.status_code == 413, r.text[:300]
            err = r.json()["error"]
            assert err["code"] == "work_budget" and "Ask for fewer schemes" in err["message"], err
        else:
            assert r.status_code == 200, r.text[:300]
        got = 0
        for k in range(0, len(runnable), per_request):
            r = c.get(
                f"/api/episodes/{long_slug}/advantages",
                params={"scheme": ",".join(runnable[k : k + per_request]), "critic": "zero"},
            )
            assert r.status_code == 200, r.text[:300]
            got += len(r.json()["schemes"])
        assert got == len(runnable)
        assert inapplicable == {"monte_carlo"}
    after = peak_rss_mb(server.pid)
    # Group g0 holds the long episode (reward 1) and nine one-token ones: the batch-wide schemes
    # answered from [B] summaries, so every one of them is here.
    for scheme in ("opo", "gpg", "reinforce_plus_plus_baseline", "grpo", "rloo"):
        assert (scheme, LONG) in answers and (scheme, 1) in answers
    assert after - before < BUDGET_MB, f"peak RSS grew {after - before:.0f} MB (from {before:.0f} MB)"
