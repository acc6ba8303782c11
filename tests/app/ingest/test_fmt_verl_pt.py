"""verl batches saved with torch.save (app/ingest/verl_pt.py, keys from creditlens.keys.VERL),
loaded with weights_only=True and uploaded to the real app without naming a format: a DataProto's
tensors (fixtures/formats/verl_batch.pt, written by fixtures/formats/make_examples.py), and actor
micro-batch dumps, which before got "field `prompts` is missing"; pickled objects are refused.

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


def test_verl_torch_save(client):
    batch, eps = stored(client, "verl_batch.pt", (FORMATS / "verl_batch.pt").read_bytes())
    assert batch["source"] == "upload:verl_pt"
    d = torch.load(FORMATS / "verl_batch.pt", weights_only=True)
    P = d["prompts"].shape[1]
    for b, got in enumerate(eps):
        keep_p = d["attention_mask"][b, :P].bool()
        keep_r = d["attention_mask"][b, P:].bool()
        ids = d["prompts"][b][keep_p].tolist() + d["responses"][b][keep_r].tolist()
        assert got["tokens"] == [f"⟨{i}⟩" for i in ids]
        m = d["response_mask"][b][keep_r].tolist()
        assert got["kinds"] == ["prompt"] * int(keep_p.sum()) + ["policy" if x else "tool" for x in m]
        npr = int(keep_p.sum())
        assert got["rewards"][npr:] == d["token_level_rewards"][b][keep_r].double().tolist()
        assert got["values"][npr:] == d["values"][b][keep_r].double().tolist()
        assert got["logprobs"][npr:] == d["old_log_probs"][b][keep_r].double().tolist()
        assert got["group"] == d["uid"][b]


def test_token_level_scores_stand_in_for_rewards(client):
    d = torch.load(FORMATS / "verl_batch.pt", weights_only=True)
    d["token_level_scores"] = d.pop("token_level_rewards")
    buf = io.BytesIO()
    torch.save(d, buf)
    _, eps = stored(client, "scores.pt", buf.getvalue())
    P = d["prompts"].shape[1]
    for b, got in enumerate(eps):
        keep_r = d["attention_mask"][b, P:].bool()
        npr = int(d["attention_mask"][b, :P].sum())
        assert got["rewards"][npr:] == d["token_level_scores"][b][keep_r].double().tolist()


def test_verl_pickled_objects_are_refused(client, tmp_path):
    import numpy as np

    path = tmp_path / "evil.pt"
    # A numpy object array needs arbitrary unpickling: weights_only=True must refuse it.
    torch.save({"prompts": torch.zeros(1, 2), "uid": np.array(["a"], dtype=object)}, path)
    before = row_counts(client)
    r = upload(client, "evil.pt", path.read_bytes())
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_verl_batch"
    assert row_counts(client) == before


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
