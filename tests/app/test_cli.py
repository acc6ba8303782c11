"""The real CLI, as subprocesses: compute offline, serve on 127.0.0.1, upload to it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.app.svc_helpers import FORMATS

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "app.cli"]


def run(*args, **kw):
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, **kw)


def test_compute_offline_writes_advantages(tmp_path):
    out = tmp_path / "adv.jsonl"
    r = run(
        "compute",
        str(FORMATS / "native.jsonl"),
        "--scheme",
        "outcome",
        "--scheme",
        "token_gae",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(s) for s in out.read_text().splitlines()]
    assert len(rows) == 4 and [s["name"] for s in rows[0]["schemes"]] == ["outcome", "token_gae"]
    # Groups in the file: limit = [1, 0] -> RLOO +1 / -1; parse_date = [0, 0] -> 0.
    firsts = [next(a for a in row["schemes"][0]["advantages"] if a is not None) for row in rows]
    assert firsts == [1.0, -1.0, 0.0, 0.0]


def test_compute_prints_to_stdout_and_reports_errors(tmp_path):
    r = run(
        "compute", str(FORMATS / "verl_rollout.jsonl"), "--scheme", "outcome,returns", "--baseline", "grpo"
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": ["a", "b"], "kinds": ["prompt"]}\n')
    r = run("compute", str(bad))
    assert r.returncode == 1 and "`kinds` has 1 entries but `tokens` has 2" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--db", str(tmp_path / "cli.db"), "--log-level", "warning"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("server did not start")
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_serve_and_upload(server):
    url, proc = server
    assert httpx.get(url + "/healthz").json() == {"status": "ok"}
    r = run("upload", str(FORMATS / "openai_chat.jsonl"), "--server", url, "--json")
    assert r.returncode == 0, r.stderr
    assert "stored batch 1 with 3 episode(s)" in r.stdout and "delete token" in r.stdout
    body = json.loads(r.stdout.strip().splitlines()[-1])
    batches = httpx.get(url + "/api/batches").json()
    assert [b["name"] for b in batches] == ["openai_chat.jsonl"] and batches[0][
        "source"
    ] == "upload:openai_chat"
    slug = body["episodes"][0]["slug"]
    assert httpx.get(f"{url}/api/episodes/{slug}").json()["reward"] == 1.0
    # A server-side validation error comes back as the CLI's message and exit code.
    r = run("upload", str(FORMATS / "native.jsonl"), "--server", url, "--format", "nemo_rl")
    assert r.returncode == 1 and "token_ids" in r.stderr
    # --visibility unlisted: not listed, and the printed URL names the batch by its slug.
    r = run("upload", str(FORMATS / "native.jsonl"), "--server", url, "--visibility", "unlisted", "--json")
    assert r.returncode == 0, r.stderr
    hidden = json.loads(r.stdout.strip().splitlines()[-1])
    assert hidden["visibility"] == "unlisted" and f"{url}{hidden['url']}" in r.stdout
    assert hidden["batch_id"] not in {b["id"] for b in httpx.get(url + "/api/batches").json()}
    assert httpx.get(url + hidden["url"]).status_code == 200
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    assert f"serving on {url}/" in out


AUDIT = ROOT / "fixtures" / "audit"


def test_audit_offline_exit_codes_and_text():
    manifest = json.loads((AUDIT / "manifest.json").read_text())
    clean = run("audit", str(AUDIT / "clean_gae.jsonl"))
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.splitlines() == [clean.stdout.splitlines()[0], "no findings"]
    assert clean.stdout.startswith("best match: verl_gae gamma=0.99 lam=0.95 mask=policy")
    bug = run("audit", str(AUDIT / "gae_tool_mask.jsonl"))
    assert bug.returncode == 1, bug.stderr
    lines = bug.stdout.splitlines()
    assert "mask=response" in lines[0]
    want = manifest["gae_tool_mask"]["findings"]
    assert [ln.split()[:2] for ln in lines[1:]] == [[f["severity"], f["code"]] for f in want]
    assert f"{want[1]['token_count']} tokens" in lines[2]
    # Warnings and infos alone do not fail a CI job.
    info = run("audit", str(AUDIT / "grpo_population_std.jsonl"))
    assert info.returncode == 0 and [ln.split()[0] for ln in info.stdout.splitlines()[1:]] == [
        "info",
        "warning",
    ]


def test_audit_offline_json_is_the_api_answer():
    manifest = json.loads((AUDIT / "manifest.json").read_text())
    r = run("audit", str(AUDIT / "reward_row_end.jsonl"), "--format", "native", "--json")
    assert r.returncode == 1, r.stderr
    body = json.loads(r.stdout)
    spec = manifest["reward_row_end"]
    assert body["best_match"]["params"] == spec["best_match"]["params"]
    (f,) = body["findings"]
    assert (f["code"], f["tokens"], f["episodes"]) == (
        "reward_on_non_policy_token",
        spec["findings"][0]["tokens"],
        spec["findings"][0]["episodes"],
    )
    assert f["first"] == {"episode": f["tokens"][0][0], "position": f["tokens"][0][1]}
    assert body["n_errors"] == 1 and body["searched"] > 50


def test_audit_offline_unreadable_input_is_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": ["a", "b"], "kinds": ["prompt"]}\n')
    r = run("audit", str(bad))
    assert r.returncode == 2 and "`kinds` has 1 entries but `tokens` has 2" in r.stderr
    nan = tmp_path / "nan.jsonl"
    nan.write_text(
        '{"tokens": ["a", "b"], "kinds": ["prompt", "policy"], "reward": 1, "advantages": [0, NaN]}\n'
    )
    r = run("audit", str(nan))
    assert (
        r.returncode == 2
        and r.stderr.startswith("creditlens audit: line 1, episode 1:")
        and "advantages" in r.stderr
    )
    r = run("audit", str(FORMATS / "native.jsonl"))
    assert r.returncode == 2 and "`advantages`" in r.stderr
    assert run("audit", str(tmp_path / "missing.jsonl")).returncode == 2
    r = run("audit", str(AUDIT / "clean_gae.jsonl"), "--format", "nope")
    assert r.returncode == 2 and "format 'nope' is not known" in r.stderr


def test_upload_with_map(server, tmp_path):
    url, _ = server
    f = tmp_path / "odd.jsonl"
    rows = [
        {
            "conv": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
            "ok": 1.0,
            "q": "a",
        },
        {
            "conv": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}],
            "ok": 0.0,
            "q": "a",
        },
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # The transcript reader finds the messages under `conv` by their shape; `ok` is no reward name,
    # so the episodes are stored with reward null and the server's warning is printed.
    r = run("upload", str(f), "--server", url)
    assert r.returncode == 0, r.stderr
    assert "warning: 2 of 2 episodes have no reward" in r.stderr and "mapping=" in r.stderr
    r = run(
        "upload",
        str(f),
        "--server",
        url,
        "--map",
        "messages=conv",
        "--map",
        "reward=ok",
        "--map",
        "group=q",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout.strip().splitlines()[-1])
    eps = [httpx.get(f"{url}/api/episodes/{e['slug']}").json() for e in body["episodes"]]
    assert [(e["reward"], e["group"]) for e in eps] == [(1.0, "a"), (0.0, "a")]
    r = run("upload", str(f), "--server", url, "--map", '{"messages": "conv"}')
    assert r.returncode == 0, r.stderr
    # Records with neither messages nor prompt/reply names: refused with the tree and a mapping.
    g = tmp_path / "odder.jsonl"
    g.write_text(
        "".join(json.dumps({"ask": "2+2?", "said": s, "ok": v}) + "\n" for s, v in (("4", 1), ("5", 0)))
    )
    r = run("upload", str(g), "--server", url)
    assert r.returncode == 1 and "ask: text; said: text" in r.stderr and "--map" in r.stderr
    r = run(
        "upload",
        str(g),
        "--server",
        url,
        "--map",
        "prompt=ask",
        "--map",
        "response=said",
        "--map",
        "reward=ok",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert [httpx.get(f"{url}/api/episodes/{e['slug']}").json()["reward"] for e in body["episodes"]] == [
        1.0,
        0.0,
    ]


def test_the_clients_upload_command_posts_to_the_servers_upload_route():
    # creditlens upload is the client's code (it cannot import app/): its route must be the server's.
    from app.core import urls
    from creditlens import upload

    assert upload.API_UPLOADS == urls.API_UPLOADS


def test_compute_offline_leaves_an_episode_without_reward_out_of_the_baselines(tmp_path):
    # One group: rewards 1, 0, 1 and null. GRPO over the three rewarded (by hand): mean 2/3,
    # unbiased std sqrt(1/3), so (1 - 2/3) / sqrt(1/3) = +0.57735 and -(2/3) / sqrt(1/3) = -1.1547;
    # the null one has no advantage (its 0 counted would give +-0.86603).
    lines = [
        {"tokens": ["Q", "a"], "kinds": ["prompt", "policy"], "reward": r, "group": "g"}
        for r in (1.0, 0.0, 1.0, None)
    ]
    src = tmp_path / "null.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = run("compute", str(src), "--scheme", "outcome", "--baseline", "grpo")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(s) for s in r.stdout.strip().splitlines()]
    firsts = [row["schemes"][0]["advantages"][1] for row in rows]
    assert [row["rewarded"] for row in rows] == [True, True, True, False]
    assert [round(a, 5) for a in firsts[:3]] == [0.57735, -1.1547, 0.57735] and firsts[3] is None


def test_upload_names_its_trainer_and_sends_its_hydra_config(server, tmp_path):
    """``--config`` takes verl's Hydra output folder (the run's ``.hydra/config.yaml``: here verl
    0.9.1's composed configuration from the installed wheel, with GRPO chosen) and sends it with
    the file; ``--trainer`` alone names the trainer, whose default estimator then applies."""
    import verl

    url, _ = server
    composed = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    hydra = tmp_path / "outputs" / "2026-12-05" / "10-00-00" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text(
        composed.read_text().replace("adv_estimator: gae", "adv_estimator: grpo")
    )

    def first_rows(body):
        page = httpx.get(f"{url}/e/{body['episodes'][0]['slug']}?format=json").json()
        return page["view"]["schemes"][:2]

    r = run("upload", str(FORMATS / "native.jsonl"), "--server", url, "--config", str(hydra.parent), "--json")
    assert r.returncode == 0, r.stderr
    # No advantages in the file: the trainer's estimator the config names, then its reference.
    assert first_rows(json.loads(r.stdout.strip().splitlines()[-1])) == ["verl:grpo", "grpo"]
    r = run("upload", str(FORMATS / "native.jsonl"), "--server", url, "--trainer", "openrlhf", "--json")
    assert r.returncode == 0, r.stderr
    assert first_rows(json.loads(r.stdout.strip().splitlines()[-1])) == ["openrlhf:gae", "token_gae"]
    r = run("upload", str(FORMATS / "native.jsonl"), "--server", url, "--config", str(tmp_path / "none"))
    assert r.returncode == 2 and "no configuration file" in r.stderr
