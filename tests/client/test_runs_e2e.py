"""End to end with real trainers and a real server process: TRL's GRPOTrainer tracked for two
steps, and a verl 0.9.1 DataProto through log_dataproto, each stored as run steps whose metrics
and token pieces the API then shows."""

from __future__ import annotations

import httpx
import pytest

from creditlens import Client
from tests.client.trainers import TRL_PROMPTS, byte_level_tokenizer, trl_trainer, verl_dataproto
from tests.live_server import Server

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs-e2e")
    with Server(tmp / "creditlens.db", tmp / "server.log") as srv:
        yield srv.base


def episodes_of(base: str, batch_id: int) -> list[dict]:
    batch = httpx.get(f"{base}/api/batches/{batch_id}").json()
    return [httpx.get(f"{base}/api/episodes/{e['slug']}").json() for e in batch["episodes"]]


@pytest.mark.slow
def test_trl_grpo_run_lands_on_the_server(server, tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from creditlens.adapters.trl import track

    trainer = trl_trainer(str(tmp_path), max_steps=2)
    with Client(server, strict=True) as c:
        run = c.run("trl-e2e", config={"num_generations": 2})
        track(trainer, run)
        trainer.train()
        assert run.flush(timeout=120)
        assert (run.sent, run.failed, run.dropped) == (2, 0, 0)
    got = httpx.get(f"{server}/api/runs/{run.id}").json()
    # track() sent the trainer's own GRPOConfig into the run's configuration, and said TRL.
    cfg = got["config"]
    assert got["name"] == "trl-e2e" and cfg["trainer"] == "trl"
    assert cfg["num_generations"] == trainer.args.num_generations == 2
    assert (cfg["loss_type"], cfg["scale_rewards"]) == (trainer.args.loss_type, trainer.args.scale_rewards)
    assert [s["step"] for s in got["steps"]] == [0, 1]
    for s in got["steps"]:
        m = s["metrics"]
        assert s["n_episodes"] == 2
        # The reward is 0 then 1 in every group of 2: half pass, no zero-variance group.
        assert (m["pass_rate"], m["mean_score"], m["zero_variance_share"]) == (0.5, 0.5, 0.0)
        assert m["mean_abs_advantage"] > 0  # GRPO's ±a on every completion token
        assert m["nonpolicy_advantage_share"] == 0.0  # TRL puts no advantage on prompt tokens
        assert 0 < m["mean_policy_tokens"] <= 8
        for ep in episodes_of(server, s["batch_id"]):
            n_prompt = ep["kinds"].count("prompt")
            # The tokenizer's own pieces, readable: the prompt reads back as the dataset's text.
            assert "".join(ep["tokens"][:n_prompt]) in set(TRL_PROMPTS)
            assert not any(t.startswith("⟨") for t in ep["tokens"][:n_prompt])
    # The page of the run opens and names it.
    page = httpx.get(f"{server}/r/{run.id}", headers={"accept": "text/html"})
    assert page.status_code == 200 and "trl-e2e" in page.text
    # resume=True finds the same run by its name.
    with Client(server) as c:
        assert c.run("trl-e2e", resume=True).id == run.id


@pytest.mark.verl
def test_verl_dataproto_lands_on_the_server(server):
    pytest.importorskip("verl.protocol")
    from creditlens.adapters.verl import log_dataproto

    tok = byte_level_tokenizer()
    vb = verl_dataproto(tok)
    with Client(server, strict=True) as c:
        run = c.run("verl-e2e")
        log_dataproto(run, 12, vb.data, tok)
        assert run.flush(timeout=60) and run.sent == 1
    steps = httpx.get(f"{server}/api/runs/{run.id}").json()["steps"]
    assert [(s["step"], s["n_episodes"]) for s in steps] == [(12, 4)]
    m = steps[0]["metrics"]
    assert (m["pass_rate"], m["zero_variance_share"]) == (0.5, 0.0)
    assert m["nonpolicy_advantage_share"] == 0.0  # verl masks its advantages with response_mask
    assert m["mean_tool_tokens"] == 0.5  # the 2-token tool span in one of 4 episodes
    # The entropy verl computed, averaged over the policy tokens the server knows.
    ents = vb.data.batch["entropys"]
    policy = vb.data.batch["response_mask"].bool()
    assert m["mean_entropy"] == pytest.approx(ents[policy].double().mean().item(), rel=1e-6)
    eps = episodes_of(server, steps[0]["batch_id"])
    for b, ep in enumerate(eps):
        n_p = len(vb.prompt_rows[b // 2])
        assert "".join(ep["tokens"][:n_p]) == tok.decode(vb.prompt_rows[b // 2])
    series = httpx.get(f"{server}/api/runs/{run.id}/metrics").json()
    assert series["pass_rate"] == [[12, 0.5]]


def test_a_named_trainer_and_its_config_reach_the_episode_page(server):
    """client.run(trainer=...) keeps the trainer in the run's config; the config names its
    estimator, so a step's episode opens on the upload, that dialect and its reference."""
    eps = [
        {
            "tokens": ["Q", "a", "b", "t", "c"],
            "kinds": ["prompt", "policy", "policy", "tool", "policy"],
            "reward": r,
            "advantages": [0.0, a, a, 0.0, a],
            "group": "g",
        }
        for r, a in ((1.0, 0.7), (0.0, -0.7))
    ]
    with Client(server, strict=True) as c:
        run = c.run("named", config={"algorithm": {"adv_estimator": "grpo"}}, trainer="verl")
        run.log(3, eps)
        assert run.flush(timeout=60) and run.sent == 1
    cfg = httpx.get(f"{server}/api/runs/{run.id}").json()["config"]
    assert cfg == {"algorithm": {"adv_estimator": "grpo"}, "trainer": "verl"}
    batch_id = httpx.get(f"{server}/api/runs/{run.id}").json()["steps"][0]["batch_id"]
    slug = httpx.get(f"{server}/api/batches/{batch_id}").json()["episodes"][0]["slug"]
    view = httpx.get(f"{server}/e/{slug}?format=json").json()["view"]
    assert view["schemes"] == ["uploaded", "verl:grpo", "grpo", "audit_diff"]


def test_a_run_sends_the_hydra_config_of_its_output_folder(server, tmp_path):
    """``client.run(name, config=<Hydra output folder>)`` sends the run's ``.hydra/config.yaml``
    (verl 0.9.1's composed configuration from the installed wheel, RLOO chosen) for the server to
    read: the run is verl's, its estimator RLOO."""
    from pathlib import Path

    import verl

    composed = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    hydra = tmp_path / "outputs" / "10-00-00" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text(
        composed.read_text().replace("adv_estimator: gae", "adv_estimator: rloo")
    )
    with Client(server, strict=True) as c:
        run = c.run("hydra-run", config=hydra.parent)
        run.log(step=0, episodes=[{"tokens": ["Q", "a"], "kinds": ["prompt", "policy"], "reward": 1.0}])
        assert run.flush(timeout=60)
    got = httpx.get(f"{server}/api/runs/{run.id}").json()
    assert got["config"]["trainer"] == "verl" and got["config"]["algorithm"]["adv_estimator"] == "rloo"
    with pytest.raises(ValueError, match="no configuration file"):
        Client(server).run("nothing", config=tmp_path / "missing")
