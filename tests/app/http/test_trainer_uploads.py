"""The user says which trainer, once: ``POST /api/uploads?trainer=`` (and the form field), a run's
``trainer`` with its config; the episode page then opens on the upload, the trainer's dialect the
config names, and that dialect's reference. The real app on a real database."""

from __future__ import annotations

import json

from tests.app.svc_helpers import upload

# Two attempts at one task, a tool span between two calls, the trainer's own advantages and values.
KINDS = ["prompt", "policy", "policy", "tool", "tool", "policy"]


def _episodes() -> list[dict]:
    out = []
    for i, r in enumerate((1.0, 0.0)):
        out.append(
            {
                "tokens": ["Fix", "read", "()", "ok", ".", "submit"],
                "kinds": KINDS,
                "reward": r,
                "values": [0.0, 0.4, 0.5, 0.0, 0.0, 0.6],
                "advantages": [0.0, 0.5 - i, 0.5 - i, 0.0, 0.0, 0.5 - i],
                "group": "task-1",
            }
        )
    return out


def _default_rows(client, slug: str) -> list[str]:
    r = client.get(f"/e/{slug}?format=json")
    assert r.status_code == 200, r.text
    return r.json()["view"]["schemes"]


def test_an_upload_names_its_trainer_and_opens_on_its_dialect(client):
    r = upload(client, _episodes(), trainer="OpenRLHF")
    assert r.status_code == 201, r.text
    body = r.json()
    slug = body["episodes"][0]["slug"]
    # OpenRLHF's default estimator is GAE: its dialect, then the reference that skips tool spans.
    assert _default_rows(client, slug) == ["uploaded", "openrlhf:gae", "token_gae", "audit_diff"]
    # A link that names its rows still shows exactly those.
    r = client.get(f"/e/{slug}?format=json&scheme=outcome")
    assert r.json()["view"]["schemes"] == ["outcome"]


def test_without_a_trainer_the_page_opens_as_before(client):
    slug = upload(client, _episodes()).json()["episodes"][0]["slug"]
    assert _default_rows(client, slug) == ["uploaded", "audit_reference", "audit_diff"]


def test_an_unknown_trainer_is_a_422_that_lists_the_known_ones_and_stores_nothing(client):
    r = client.post("/api/uploads?trainer=megatron", json={"episodes": _episodes()})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "unknown_trainer" and err["field"] == "trainer"
    for name in (
        "verl (verl 0.9.1)",
        "trl (TRL 1.16.0)",
        "openrlhf",
        "skyrl",
        "areal",
        "nemo_rl",
        "prime_rl",
        "slime",
    ):
        assert name in err["message"]
    assert client.get("/api/batches").json() == []


def test_the_form_field_names_the_trainer(client):
    data = "\n".join(json.dumps(e) for e in _episodes()).encode()
    r = client.post(
        "/api/uploads",
        files={"file": ("steps.jsonl", data, "application/jsonl")},
        data={"trainer": "trl"},
    )
    assert r.status_code == 201, r.text
    slug = r.json()["episodes"][0]["slug"]
    assert _default_rows(client, slug) == ["uploaded", "trl:grpo", "grpo", "audit_diff"]


def test_a_run_config_names_the_estimator_its_steps_ran(client):
    run = client.post(
        "/api/runs",
        json={
            "name": "r",
            "trainer": "verl",
            "config": {"algorithm": {"adv_estimator": "grpo", "gamma": 1.0}},
        },
    )
    assert run.status_code == 201, run.text
    ref = run.json()["ref"]
    assert client.get(f"/api/runs/{ref}").json()["config"]["trainer"] == "verl"
    step = client.post(f"/api/runs/{ref}/steps/0", json={"episodes": _episodes()})
    assert step.status_code == 201, step.text
    slug = step.json()["episodes"][0]["slug"]
    assert _default_rows(client, slug) == ["uploaded", "verl:grpo", "grpo", "audit_diff"]
    bad = client.post("/api/runs", json={"name": "r2", "trainer": "nope"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "unknown_trainer"


def test_the_audit_of_a_named_upload_names_the_trainers_estimator(client):
    """Advantages as OpenRLHF 0.11.2's GAE computes them (the dialect is checked against OpenRLHF's
    own function in tests/estimators/test_dialects_openrlhf.py), uploaded with trainer=openrlhf:
    the batch's audit names openrlhf:gae with gamma and lambda, and its step through tool spans."""
    import torch

    from estimators import EstimatorInput, compute

    eps = []
    rows = [(1.0, [0.0, 0.3, 0.5, 0.9, 0.9, 0.6]), (0.0, [0.0, 0.2, 0.1, 0.9, 0.9, 0.4])] * 2
    mask = torch.tensor([[k == "policy" for k in KINDS]] * len(rows))
    rewards = torch.zeros(len(rows), len(KINDS), dtype=torch.float64)
    rewards[:, -1] = torch.tensor([r for r, _ in rows], dtype=torch.float64)
    values = torch.tensor([v for _, v in rows], dtype=torch.float64)
    inp = EstimatorInput(
        rewards=rewards, mask=mask, values=values, groups=torch.tensor([0, 0, 1, 1]), gamma=1.0, lam=0.95
    )
    adv = compute("openrlhf:gae", inp).advantages
    for i, (r, v) in enumerate(rows):
        eps.append(
            {
                "tokens": ["Fix", "read", "()", "ok", ".", "submit"],
                "kinds": KINDS,
                "reward": r,
                "values": v,
                "advantages": adv[i].tolist(),
                "group": f"task-{i // 2}",
            }
        )
    body = upload(client, eps, trainer="openrlhf").json()
    audit = client.get(f"/api/batches/{body['batch_id']}/audit").json()
    bm = audit["best_match"]
    assert bm["scheme"] == "openrlhf:gae", bm
    assert bm["params"] == {"trainer": "openrlhf", "version": "0.11.2", "gamma": 1.0, "lam": 0.95}
    codes = [f["code"] for f in audit["findings"]]
    assert "gae_through_tool_spans" in codes


def test_a_named_batch_opens_its_loss_view_on_the_trainers_loss(client):
    # TRL trains with loss_type "dapo" by default; a run whose config says "grpo" trained with that.
    body = upload(client, _episodes(), trainer="trl").json()
    page = client.get(f"/b/{body['batch_id']}")
    assert page.status_code == 200
    assert '"default": "trl:dapo"' in page.text.replace("&#34;", '"') or '"default":"trl:dapo"' in page.text
    run = client.post(
        "/api/runs", json={"name": "t", "trainer": "trl", "config": {"loss_type": "grpo"}}
    ).json()
    step = client.post(f"/api/runs/{run['ref']}/steps/0", json={"episodes": _episodes()}).json()
    page = client.get(f"/b/{step['batch_id']}")
    assert '"default": "trl:grpo"' in page.text or '"default":"trl:grpo"' in page.text
    plain = client.get(f"/b/{upload(client, _episodes()).json()['batch_id']}")
    assert '"default": "vanilla"' in plain.text or '"default":"vanilla"' in plain.text


def _hydra_config(estimator: str) -> str:
    """verl 0.9.1's composed configuration (the tree a Hydra run saves as ``.hydra/config.yaml``,
    read from the installed wheel) with the estimator a user set on the command line."""
    from pathlib import Path

    import verl

    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return path.read_text().replace("adv_estimator: gae", f"adv_estimator: {estimator}")


def test_a_run_reads_verls_hydra_config_file(client):
    run = client.post("/api/runs", json={"name": "hydra", "config_text": _hydra_config("rloo")})
    assert run.status_code == 201, run.text
    ref = run.json()["ref"]
    config = client.get(f"/api/runs/{ref}").json()["config"]
    # The file's shape says verl; its interpolations are resolved where they point into it.
    assert config["trainer"] == "verl"
    assert config["algorithm"]["adv_estimator"] == "rloo"
    assert config["actor_rollout_ref"]["ref"]["strategy"] == "fsdp"  # was ${actor_rollout_ref.actor.strategy}
    step = client.post(f"/api/runs/{ref}/steps/0", json={"episodes": _episodes()})
    assert step.status_code == 201, step.text
    slug = step.json()["episodes"][0]["slug"]
    assert _default_rows(client, slug)[:2] == ["uploaded", "verl:rloo"]
    # The JSON config's keys win over the file's, setting by setting.
    run = client.post(
        "/api/runs",
        json={
            "name": "hydra2",
            "config_text": _hydra_config("rloo"),
            "config": {"algorithm": {"adv_estimator": "grpo"}},
        },
    ).json()
    algorithm = client.get(f"/api/runs/{run['ref']}").json()["config"]["algorithm"]
    assert algorithm["adv_estimator"] == "grpo" and algorithm["gamma"] == 1.0


def test_a_run_config_file_that_cannot_be_read_is_a_422_naming_its_line(client):
    r = client.post("/api/runs", json={"name": "bad", "config_text": "algorithm:\n  gamma: [1.0\n"})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert (
        err["code"] == "bad_config" and err["field"] == "config_text" and err["line"] == 2
    )  # the unclosed list
    assert client.get("/api/runs").json() == []


def test_an_upload_carries_its_trainers_config_file(client):
    data = "\n".join(json.dumps(e) for e in _episodes()).encode()
    r = client.post(
        "/api/uploads",
        files={
            "file": ("steps.jsonl", data, "application/jsonl"),
            "config": ("config.yaml", _hydra_config("grpo").encode(), "application/yaml"),
        },
    )
    assert r.status_code == 201, r.text
    slug = r.json()["episodes"][0]["slug"]
    # No trainer named: the file is verl's, and it says GRPO.
    assert _default_rows(client, slug) == ["uploaded", "verl:grpo", "grpo", "audit_diff"]
    bad = client.post(
        "/api/uploads",
        files={
            "file": ("steps.jsonl", data, "application/jsonl"),
            "config": ("c.yaml", b"a: [", "text/plain"),
        },
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "config"


def test_patching_a_runs_config_names_its_estimator_for_the_next_steps(client):
    run = client.post("/api/runs", json={"name": "late", "config": {"lr": 1e-6}}).json()
    ref = run["ref"]
    # An adapter sends its trainer's configuration once it has it (TRL's GRPOConfig here).
    r = client.patch(f"/api/runs/{ref}", json={"config": {"num_generations": 4, "scale_rewards": "none"}})
    assert r.status_code == 200, r.text
    assert r.json()["config"] == {"lr": 1e-6, "num_generations": 4, "scale_rewards": "none", "trainer": "trl"}
    step = client.post(f"/api/runs/{ref}/steps/0", json={"episodes": _episodes()}).json()
    view = client.get(f"/e/{step['episodes'][0]['slug']}?format=json").json()["view"]
    assert view["schemes"][:2] == ["uploaded", "trl:grpo"] and view["options"] == {"scale_rewards": "none"}
    # A configuration file's text merges too; a bad one or an unknown trainer changes nothing.
    r = client.patch(f"/api/runs/{ref}", json={"config_text": "gamma: 0.99\n"})
    assert r.json()["config"]["gamma"] == 0.99
    for bad in ({"trainer": "nope"}, {"config_text": "a: ["}, {"colour": "red"}):
        assert client.patch(f"/api/runs/{ref}", json=bad).status_code == 422
    assert client.get(f"/api/runs/{ref}").json()["config"]["gamma"] == 0.99
    assert client.patch("/api/runs/99999", json={"config": {}}).status_code == 404
