"""NeMo-RL ``train_data_step{N}.jsonl`` (app/ingest/nemo_rl.py, keys from creditlens.keys.NEMO_RL):
fixtures/formats/nemo_rl.jsonl (written by fixtures/formats/make_examples.py in NeMo-RL's
train-data schema) is auto-detected; the loss mask gives the kinds, ``input_lengths`` cuts the
padding, the training policy's and the engine's log-probs are kept apart and the logged
advantages are the ``uploaded`` row; a mask of the wrong length is a 422 naming it."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import example, lines, refused, stored, uploaded_advantages


def test_nemo_rl(client):
    batch, eps = stored(client, "nemo_rl.jsonl", example("nemo_rl.jsonl"))
    assert batch["source"] == "upload:nemo_rl"
    for sent, got in zip(lines("nemo_rl.jsonl"), eps, strict=True):
        n = sent["input_lengths"]
        assert got["tokens"] == [f"⟨{i}⟩" for i in sent["token_ids"][:n]]
        mask = sent["token_loss_mask"][:n]
        assert [k == "policy" for k in got["kinds"]] == [bool(m) for m in mask]
        # zeros before the first policy token are prompt, zeros after it are the tool observation
        assert got["kinds"][:12] == ["prompt"] * 12 and got["kinds"][15:19] == ["tool"] * 4
        # the training policy's log-probs, beside the generation engine's (their ratio is shown)
        assert got["logprobs"] == sent["prev_logprobs"][:n]
        assert got["rollout_logprobs"] == sent["generation_logprobs"][:n]
        assert got["token_ids"] == sent["token_ids"][:n]
        assert got["reward"] == sent["rewards"]
        assert got["advantages"] == sent["advantages"][:n]
    row = uploaded_advantages(client, batch["episodes"][0]["slug"])
    kinds = eps[0]["kinds"]
    # the uploaded row has every token, as stored: 0.5 on the 6 policy tokens, 0 elsewhere
    assert [a for a, k in zip(row, kinds, strict=True) if k == "policy"] == [0.5] * 6
    assert row == eps[0]["advantages"]
    assert all(a == 0 for a, k in zip(row, kinds, strict=True) if k != "policy")


def test_only_the_engine_log_probs_are_the_log_probs(client):
    sent = lines("nemo_rl.jsonl")
    for s in sent:
        del s["prev_logprobs"]
    _, eps = stored(client, "gen.jsonl", "".join(json.dumps(s) + "\n" for s in sent))
    for s, got in zip(sent, eps, strict=True):
        assert got["logprobs"] == s["generation_logprobs"][: s["input_lengths"]]
        assert got["rollout_logprobs"] is None


def test_a_mask_of_the_wrong_length_is_named(client):
    sent = lines("nemo_rl.jsonl")
    sent[1]["token_loss_mask"].pop()
    err = refused(client, "nemo.jsonl", "".join(json.dumps(s) + "\n" for s in sent))
    assert (err["code"], err["line"], err["field"]) == ("length_mismatch", 2, "token_loss_mask")
