"""verl actor micro-batch dumps (torch.save, loaded with weights_only=True) uploaded to the real
app without naming a format: before, these got "field `prompts` is missing".

fixtures/formats/verl_actor/ is written by make_micro_batches.py with verl's own DataProto
(select + split, as the PPO actor's update_policy does) and its compute_gae_advantage_return;
``inputs_ids_dump.pt`` is the hand-made dump with the misspelt key. Expected values are read
straight from the tensors with torch, independently of the parser."""

from __future__ import annotations

import io

import pytest
import torch

from tests.app.ingest.fmt_helpers import pick, stored, upload
from tests.app.svc_helpers import FORMATS, row_counts

DIR = FORMATS / "verl_actor"


def _load(name):
    return torch.load(DIR / name, weights_only=True)


def test_actor_micro_batch(client):
    t = _load("micro_batch_0.pt")
    assert "prompts" not in t and t["input_ids"].shape == (2, 10)
    batch, eps = stored(client, "micro_batch_0.pt", (DIR / "micro_batch_0.pt").read_bytes())
    assert batch["source"] == "upload:verl_pt" and len(eps) == 2
    R = t["responses"].shape[1]
    for b, ep in enumerate(eps):
        keep = t["attention_mask"][b].bool()
        assert ep["token_ids"] == t["input_ids"][b][keep].tolist()
        rkeep = keep[-R:]
        n_prompt = int(keep[:-R].sum())
        assert ep["kinds"][:n_prompt] == ["prompt"] * n_prompt
        rmask = t["response_mask"][b][rkeep].tolist()
        assert ep["kinds"][n_prompt:] == ["policy" if m else "tool" for m in rmask]
        assert pick(ep, "policy", "logprobs") == pytest.approx(
            t["old_log_probs"][b][rkeep][t["response_mask"][b][rkeep].bool()].double().tolist()
        )
        assert ep["advantages"][n_prompt:] == pytest.approx(t["advantages"][b][rkeep].double().tolist())
    # Row 1's tool observation (response_mask 0 inside the response) is tool tokens.
    assert pick(eps[1], "tool", "token_ids") == [900, 901]
    # The trainer's advantages are offered as `uploaded` and go to the audit.
    adv = client.get(f"/api/episodes/{eps[1]['slug']}/advantages", params={"scheme": "uploaded"}).json()
    assert adv["has_advantages"]
    r = client.get(f"/api/batches/{batch['id']}/audit")
    assert r.status_code == 200, r.text
    assert r.json()["searched"] > 0


def test_misspelt_inputs_ids_values_returns(client):
    t = _load("inputs_ids_dump.pt")
    assert "inputs_ids" in t and "response_mask" not in t
    _, eps = stored(client, "dump.pt", (DIR / "inputs_ids_dump.pt").read_bytes())
    assert len(eps) == 4
    R = t["responses"].shape[1]
    for b, ep in enumerate(eps):
        keep = t["attention_mask"][b].bool()
        rkeep = keep[-R:]
        n_prompt = int(keep[:-R].sum())
        assert ep["token_ids"] == t["inputs_ids"][b][keep].tolist()
        # Without response_mask, the response's attention_mask says which tokens count.
        assert ep["kinds"][n_prompt:] == ["policy"] * int(rkeep.sum())
        assert ep["values"][n_prompt:] == pytest.approx(t["values"][b][rkeep].double().tolist())
        assert ep["meta"]["returns"][n_prompt:] == pytest.approx(t["returns"][b][rkeep].double().tolist())
        assert pick(ep, "policy", "logprobs") == pytest.approx(t["old_log_prob"][b][rkeep].double().tolist())


def _save(d):
    buf = io.BytesIO()
    torch.save(d, buf)
    return buf.getvalue()


def test_response_not_at_the_end_of_input_ids_names_the_row(client):
    t = dict(_load("inputs_ids_dump.pt"))
    ids = t["inputs_ids"].clone()
    ids[2, -1] = 7
    t["inputs_ids"] = ids
    r = upload(client, "dump.pt", _save(t))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == "inputs_ids" and err["episode"] == 3, err
    assert row_counts(client) == (0, 0)


def test_micro_batch_without_any_mask_names_the_field(client):
    t = dict(_load("inputs_ids_dump.pt"))
    del t["attention_mask"]
    r = upload(client, "dump.pt", _save(t))
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "response_mask"
    assert "prompts" not in r.json()["error"]["message"]
