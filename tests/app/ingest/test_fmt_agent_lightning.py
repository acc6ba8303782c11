"""agent-lightning store archives uploaded to the real app without naming a format.

fixtures/formats/agent_lightning/store.jsonl is hand-built (make_store.py beside it: agent-lightning
``Rollout`` records with the LLM calls of its proxy, vLLM answers with ``return_token_ids``, one
call streamed); tokenizer.json beside it is a word-level tokenizer whose pieces show the ids."""

from __future__ import annotations

import json

import pytest

from tests.app.ingest.fmt_helpers import assert_no_credit_off_policy, pick, stored, text, upload
from tests.app.svc_helpers import FORMATS, row_counts

DIR = FORMATS / "agent_lightning"


def _files(with_tokenizer: bool, data: bytes | None = None):
    files = {"file": ("store.jsonl", data or (DIR / "store.jsonl").read_bytes())}
    if with_tokenizer:
        files["tokenizer"] = ("tokenizer.json", (DIR / "tokenizer.json").read_bytes())
    return files


def _stored(client, with_tokenizer: bool, data: bytes | None = None):
    r = client.post("/api/uploads", files=_files(with_tokenizer, data))
    assert r.status_code == 201, r.text
    batch = client.get(f"/api/batches/{r.json()['batch_id']}").json()
    return batch, [client.get(f"/api/episodes/{e['slug']}").json() for e in r.json()["episodes"]]


def test_token_ids_with_a_tokenizer(client):
    rows = [json.loads(line) for line in (DIR / "store.jsonl").read_text().splitlines()]
    batch, eps = _stored(client, True)
    assert batch["source"] == "upload:agent_lightning"
    assert [(e["reward"], e["group"]) for e in eps] == [(1.0, "spider-17"), (0.0, "spider-17")]
    for row, ep in zip(rows, eps, strict=True):
        first, second = row["events"]
        resp2 = second["response"]
        chunks = resp2 if isinstance(resp2, list) else [resp2]
        # The ids: first prompt, first answer, what the second prompt adds, the second answer
        # (streamed chunks joined).
        p1, p2 = first["response"]["prompt_token_ids"], chunks[0]["prompt_token_ids"]
        r1 = first["response"]["choices"][0]["token_ids"]
        r2 = [i for ch in chunks for i in ch["choices"][0]["token_ids"]]
        assert ep["token_ids"] == p1 + r1 + p2[len(p1) + len(r1) :] + r2
        assert pick(ep, "policy", "token_ids") == r1 + r2
        assert len(set(pick(ep, "policy", "turn_ids"))) == 2
        # The tool result the agent appended is tool; its chat-template frame is prompt.
        assert text(ep, "tool") == "<tool_response>\n[[6]]\n</tool_response>"
        assert "<|im_start|>user\n" in text(ep, "prompt")
        lps = [x["logprob"] for x in first["response"]["choices"][0]["logprobs"]["content"]]
        assert pick(ep, "policy", "logprobs")[: len(r1)] == lps
    assert text(eps[1], "policy").endswith("There are five singers.<|im_end|>")
    assert_no_credit_off_policy(client, eps[0])


def test_without_a_tokenizer_ids_show_and_appended_ids_are_tool(client):
    row = json.loads((DIR / "store.jsonl").read_text().splitlines()[0])
    first, second = (ev["response"] for ev in row["events"])
    p1, p2 = first["prompt_token_ids"], second["prompt_token_ids"]
    r1 = first["choices"][0]["token_ids"]
    _, eps = _stored(client, False)
    ep = eps[0]
    assert ep["tokens"][0] == f"⟨{p1[0]}⟩"
    # No text to read: what the environment appended between the calls is tool as a whole.
    assert pick(ep, "tool", "token_ids") == p2[len(p1) + len(r1) :]
    assert pick(ep, "prompt", "token_ids") == p1
    assert_no_credit_off_policy(client, ep)


def test_calls_without_ids_fall_back_to_the_messages(client):
    row = json.loads((DIR / "store.jsonl").read_text().splitlines()[0])
    for ev in row["events"]:
        ev["response"].pop("prompt_token_ids")
        ev["response"]["choices"][0]["token_ids"] = []  # empty id lists: the text is shown
    _, [ep] = stored(client, "store.jsonl", json.dumps(row) + "\n")
    assert ep["token_ids"] is None
    assert text(ep, "tool") == "<tool_response>\n[[6]]\n</tool_response>"
    assert "There are 6 singers." in text(ep, "policy")
    assert "How many singers are there?" in text(ep, "prompt")
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2


def test_bad_ids_and_no_calls_are_422_and_store_nothing(client):
    row = json.loads((DIR / "store.jsonl").read_text().splitlines()[0])
    bad = json.loads(json.dumps(row))
    bad["events"][1]["response"]["choices"][0]["token_ids"] = [1, "x"]
    r = upload(client, "s.jsonl", json.dumps(row) + "\n" + json.dumps(bad) + "\n")
    err = r.json()["error"]
    assert (
        r.status_code == 422
        and err["line"] == 2
        and err["field"] == "events[1].response.choices[0].token_ids"
    )
    empty = dict(row, events=[])
    r = upload(client, "s.jsonl", json.dumps(empty) + "\n")
    assert r.status_code == 422 and r.json()["error"]["code"] == "empty_episode"
    assert row_counts(client) == (0, 0)


def _two_calls():
    """The first rollout, its two calls' prompt and response ids (p1, r1; p2 = p1 + r1 + tool)."""
    row = json.loads((DIR / "store.jsonl").read_text().splitlines()[0])
    first, second = (ev["response"] for ev in row["events"])
    return row, first["prompt_token_ids"], first["choices"][0]["token_ids"], second


def test_a_second_prompt_that_re_renders_the_first_answer_is_kept_as_sampled(client):
    # Hand-built from agent-lightning's schema (vLLM's `prompt_token_ids` per call): the second
    # call's prompt re-renders ids 10-13 of the first answer (4 sampled ids) as 3 others, as a chat
    # template re-serialising a tool call does; the rest of the prompt is unchanged.
    row, p1, r1, second = _two_calls()
    _, [plain] = stored(client, "store.jsonl", json.dumps(row) + "\n")
    p2 = second["prompt_token_ids"]
    at = len(p1) + 10
    second["prompt_token_ids"] = p2[:at] + [90, 91, 92] + p2[at + 4 :]
    _, [ep] = stored(client, "store.jsonl", json.dumps(row) + "\n")
    # Stored as sampled: the ids, kinds and log-probs of the file without the re-render.
    assert ep["token_ids"] == plain["token_ids"] and ep["kinds"] == plain["kinds"]
    assert ep["logprobs"] == plain["logprobs"]
    # The re-render, by hand: the sampled tail from the first difference is r1[10:] (24 ids); the
    # prompt holds [90, 91, 92] + r1[14:] for it: r1[14:] (20 ids) matches, r1[10:14] do not.
    assert ep["meta"]["drift"] == [
        {
            "turn": 1,
            "position": at,
            "sampled": 24,
            "rerendered_ids": [90, 91, 92] + r1[14:],
            "differing": 4,
            "first": [r1[10], 90],
            "at": [at, at + 1, at + 2, at + 3],
        }
    ]
    diag = client.get(f"/api/batches/{ep['batch_id']}").json()["diagnostics"]
    n_policy = ep["kinds"].count("policy")
    assert diag["drift_episode_share"] == 1.0 and diag["drift_token_share"] == pytest.approx(4 / n_policy)


def test_a_prompt_that_replaces_the_context_starts_over_without_drift(client):
    # The agent rebuilt its context for the second call (a summary after the first 5 ids): the
    # prompt departs inside the first prompt and keeps nothing after: prompt again, no drift.
    row, p1, r1, second = _two_calls()
    fresh = p1[:5] + list(range(100, 140))
    second["prompt_token_ids"] = fresh
    _, [ep] = stored(client, "store.jsonl", json.dumps(row) + "\n")
    r2 = second["choices"][0]["token_ids"]
    assert ep["token_ids"] == p1 + r1 + fresh + r2
    assert pick(ep, "prompt", "token_ids") == p1 + fresh
    assert "drift" not in ep["meta"]
