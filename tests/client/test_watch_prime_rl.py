"""``creditlens watch`` on prime-rl's token-export layout (``token_exports/step_N/rank_R.jsonl``
plus the ``STABLE`` marker the trainer puts in a step folder once every rank flushed), as a real
subprocess against a real server process. The rank files are the prime_rl_tokens examples
(fixtures/formats/prime_rl_tokens/, written from prime-rl's exporter). A step is sent once, when
its marker is there and every rank file is whole; a rank file cut mid-line waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.test_watch import DEADLINE_S, Watch, run_of
from tests.live_server import ROOT, Server

EXAMPLES = ROOT / "fixtures" / "formats" / "prime_rl_tokens"
RANK_0 = (EXAMPLES / "rank_0.jsonl").read_bytes()  # 2 samples
RANK_1 = (EXAMPLES / "rank_1.jsonl").read_bytes()  # 1 sample


@pytest.fixture()
def server(tmp_path):
    with Server(tmp_path / "creditlens.db", tmp_path / "server.log") as srv:
        yield srv


def write_step(out: Path, step: int, rank_1: bytes = RANK_1, stable: bool = True) -> Path:
    d = out / "token_exports" / f"step_{step}"
    d.mkdir(parents=True)
    (d / "rank_0.jsonl").write_bytes(RANK_0)
    (d / "rank_1.jsonl").write_bytes(rank_1)
    if stable:
        (d / "STABLE").touch()
    return d


def test_steps_wait_for_stable_and_whole_rank_files(server, tmp_path):
    out = tmp_path / "outputs"
    write_step(out, 0)
    cut = RANK_1[:50]  # rank 1 is still writing its first line
    d1 = write_step(out, 1, rank_1=cut, stable=False)
    w = Watch(out, server.base, "prime-watch")
    try:
        w.wait_for(r"^sent step 0 \(step_0, ")
        w.wait_for(r"^waiting for step 1 \(step_1, .*no STABLE marker yet \(2 rank file")
        (d1 / "STABLE").touch()
        w.wait_for(r"^waiting for step 1 \(step_1, .*rank_1\.jsonl: line 1 is not complete JSON")
        (d1 / "rank_1.jsonl").write_bytes(RANK_1)
        w.wait_for(r"^sent step 1 \(step_1, ")
    finally:
        w.stop()
    assert w.sent() == [0, 1]
    run = run_of(server.base, "prime-watch")
    # Each step: rank 0's 2 samples then rank 1's 1, one batch.
    assert [(s["step"], s["n_episodes"]) for s in run["steps"]] == [(0, 3), (1, 3)]


def test_once_without_the_marker_sends_nothing(server, tmp_path):
    out = tmp_path / "outputs"
    write_step(out, 0, stable=False)
    w = Watch(out / "token_exports", server.base, "prime-once", "--once")
    assert w.proc.wait(timeout=DEADLINE_S) == 1
    w.stop()
    assert w.sent() == [] and "no STABLE marker yet" in "\n".join(w.lines)


def test_skyrl_dumped_data_and_a_cut_pickle(server, tmp_path):
    """SkyRL ``trainer.dump_data_batch`` writes ``dumped_data/global_step_{N}_training_input.pkl``
    (the skyrl_dump example, fixtures/formats/skyrl_dump/); a pickle cut short waits."""
    pkl = (ROOT / "fixtures" / "formats" / "skyrl_dump" / "global_step_2_training_input.pkl").read_bytes()
    dumped = tmp_path / "export" / "dumped_data"
    dumped.mkdir(parents=True)
    (dumped / "global_step_1_training_input.pkl").write_bytes(pkl)
    (dumped / "global_step_2_training_input.pkl").write_bytes(pkl[: len(pkl) // 2])
    w = Watch(tmp_path / "export", server.base, "skyrl-watch")
    try:
        w.wait_for(r"^sent step 1 \(global_step_1_training_input\.pkl, ")
        w.wait_for(r"^waiting for step 2 .*not a whole pickle yet")
        (dumped / "global_step_2_training_input.pkl").write_bytes(pkl)
        w.wait_for(r"^sent step 2 ")
    finally:
        w.stop()
    run = run_of(server.base, "skyrl-watch")
    assert [(s["step"], s["n_episodes"]) for s in run["steps"]] == [(1, 3), (2, 3)]


def test_the_run_is_the_dump_kinds_trainer_and_carries_its_config(server, tmp_path):
    """A step sent by ``watch`` names the trainer that writes the dump (prime-rl here), so its
    episodes open on prime-rl's estimator; ``--config`` sends the trainer's file with the new run."""
    import httpx

    out = tmp_path / "outputs"
    write_step(out, 0)
    config = tmp_path / "rl.toml"
    config.write_text("[orchestrator]\nseed = 7\n")
    w = Watch(out, server.base, "prime-config", "--once", "--config", str(config))
    assert w.proc.wait(timeout=DEADLINE_S) == 0, "\n".join(w.lines)
    w.stop()
    run = run_of(server.base, "prime-config")
    assert run["config"] == {"orchestrator": {"seed": 7}}
    batch = httpx.get(f"{server.base}/api/batches/{run['steps'][0]['batch_id']}").json()
    slug = batch["episodes"][0]["slug"]
    rows = httpx.get(f"{server.base}/e/{slug}?format=json").json()["view"]["schemes"]
    assert rows[:2] == ["uploaded", "prime_rl:grpo"]
