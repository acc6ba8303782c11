"""RL Logging Board JSONL (app/ingest/rl_logging_board.py): fixtures/formats/rl_logging_board.jsonl
(written by fixtures/formats/make_examples.py in the board's token-level PPO dump schema) is
auto-detected; the response tokens are the policy tokens with their logged values, log-probs and
token rewards; a per-token list of the wrong length is a 422 naming it."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import example, lines, pick, refused, stored


def test_rl_logging_board(client):
    batch, eps = stored(client, "rl_logging_board.jsonl", example("rl_logging_board.jsonl"))
    assert batch["source"] == "upload:rl_logging_board"
    for sent, got in zip(lines("rl_logging_board.jsonl"), eps, strict=True):
        assert pick(got, "policy") == sent["response_tokens"]
        assert "".join(pick(got, "prompt")) == sent["prompt"]
        assert pick(got, "policy", "values") == sent["values"]
        assert pick(got, "policy", "logprobs") == sent["logprobs"]
        assert pick(got, "policy", "rewards") == sent["token_rewards"]
        # token_rewards already carry the reward PPO trained on: the logged one is kept in meta.
        assert got["reward"] is None and got["meta"]["reward"] == sent["reward"]


def test_values_of_the_wrong_length_are_named(client):
    sent = lines("rl_logging_board.jsonl")
    sent[1]["values"].append(0.5)
    err = refused(client, "board.jsonl", "".join(json.dumps(s) + "\n" for s in sent))
    assert (err["code"], err["line"], err["field"]) == ("length_mismatch", 2, "values")
