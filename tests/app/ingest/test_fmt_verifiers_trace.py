"""verifiers v1 traces (``Trace.to_record()`` JSONL) uploaded to the real app without naming a
format.

No public trace dump exists (they are run outputs): fixtures/formats/verifiers_trace/traces.jsonl
is written by make_example.py beside it from the schema in verifiers' own code
(PrimeIntellect-ai/verifiers ``verifiers/v1``: ``Trace``, ``MessageNode``). Edge cases below are
hand-made from the same schema: unassigned (null) advantages, a branched graph, a mask that makes a
tool message trainable, compact fields of the wrong length, a relay branch without token ids with
tool calls as JSON strings."""

from __future__ import annotations

import json

from tests.app.ingest.fmt_helpers import example, lines, pick, refused, stored, uploaded_advantages

EX = "verifiers_trace/traces.jsonl"


def test_traces_as_sampled(client):
    t1 = lines(EX)[0]
    batch, eps = stored(client, "traces.jsonl", example(EX))
    assert batch["source"] == "upload:verifiers_trace" and len(eps) == 4  # trace 3 has two leaves
    a = eps[0]
    # The nodes' token_ids concatenated along the path: the ids the model saw.
    assert a["token_ids"] == [i for n in t1["nodes"] for i in n["token_ids"]]
    # Sampled completions policy; the generation-prompt scaffold [90, 91] prompt; the tool node tool.
    assert a["kinds"] == ["prompt"] * 8 + ["policy"] * 3 + ["tool"] * 3 + ["prompt"] * 2 + ["policy"] * 2
    assert pick(a, "policy", "turn_ids") == [0, 0, 0, 1, 1]
    assert pick(a, "policy", "logprobs") == [-0.1, -0.2, -0.3, -0.5, -0.05]
    assert a["ref_logprobs"] is None  # the last turn has no reference_logprobs: no partial row
    assert uploaded_advantages(client, a["slug"])[8:11] == [0.5, 0.5, 0.5]
    assert a["reward"] == 1.0 and a["group"] == "7"  # correct 1 x 1.0; format null (not scored)


def test_unassigned_advantages_are_not_zero(client):
    _, eps = stored(client, "traces.jsonl", example(EX))
    b = eps[1]
    assert b["advantages"] is None  # null: never scored, so no `uploaded` row at all
    assert b["meta"]["advantages_unassigned"] == [0, 1]
    assert b["truncated"] is True and b["reward"] == 0.0  # stop_condition max_turns


def test_a_branched_graph_is_one_episode_per_leaf(client):
    _, eps = stored(client, "traces.jsonl", example(EX))
    c, d = eps[2], eps[3]
    assert c["token_ids"] == [12, 15, 90, 91, 50, 2] and d["token_ids"] == [12, 15, 90, 91, 51, 52, 2]
    assert [c["meta"]["branch"], d["meta"]["branch"]] == [0, 1]
    assert c["reward"] == d["reward"] == 1.0  # judge 0.5 x weight 2.0


def test_a_mask_that_trains_a_tool_message_is_kept_and_audited(client):
    t1 = lines(EX)[0]
    t1["nodes"][3]["mask"] = [False, True, False]  # the tool's "5" made trainable
    _, [ep] = stored(client, "t.jsonl", json.dumps(t1))
    bad = ep["meta"]["mask_misaligned"]
    assert bad["at"] == [12] and "tool message" in bad["reason"]
    assert ep["kinds"][12] == "tool"  # shown as what it is
    audit = client.get(f"/api/batches/{ep['batch_id']}/audit").json()
    f = {x["code"]: x for x in audit["findings"]}
    assert f["mask_misaligned"]["tokens"] == [[0, 12]]


def test_compact_fields_of_the_wrong_length_are_refused(client):
    t1 = lines(EX)[0]
    t1["nodes"][2]["logprobs"] = [-0.1]
    err = refused(client, "t.jsonl", json.dumps(t1))
    assert err["code"] == "length_mismatch" and err["field"] == "nodes[2].logprobs" and err["line"] == 1


def test_a_relay_branch_without_ids_shows_the_text(client):
    t1 = lines(EX)[0]
    for n in t1["nodes"]:
        n["token_ids"], n["mask"], n["logprobs"], n["advantages"], n["reference_logprobs"] = (
            [],
            [],
            [],
            None,
            None,
        )
    t1["nodes"][2]["message"]["tool_calls"] = ['{"name": "add", "arguments": {"a": 2, "b": 3}}']
    _, [ep] = stored(client, "t.jsonl", json.dumps(t1))
    assert ep["token_ids"] is None
    pol = "".join(pick(ep, "policy"))
    assert '<tool_call> {"name": "add"' in pol and "It is 5." in pol
    assert "".join(pick(ep, "tool")).count("5") == 1


def test_a_fork_on_a_re_render_is_joined_as_sampled_with_its_drift(client):
    # Hand-built from verifiers v1's graph (verifiers/v1/graph.py, ARCHITECTURE.md "renderer-level
    # break"): the second turn's prompt re-renders the sampled tool call [20, 21, 22] as
    # [20, 23, 24, 22] (then the input form's closing scaffold [2]); verifiers keeps the sampled
    # answer (node 2) as a leaf and forks a sibling with the same message (node 3, not sampled)
    # holding the re-rendered ids, under which the trace goes on.
    t1 = lines(EX)[0]
    sys_, user, answer, tool, final = t1["nodes"]
    rerender = dict(answer, sampled=False, token_ids=[90, 91, 20, 23, 24, 22, 2], mask=[False] * 7)
    rerender.update(logprobs=[], advantages=None, reference_logprobs=None)
    t1["nodes"] = [sys_, user, answer, rerender, dict(tool, parent=3), dict(final, parent=4)]
    _, eps = stored(client, "t.jsonl", json.dumps(t1))
    assert len(eps) == 1  # the sampled answer's own branch is part of the joined one
    [ep] = eps
    # As sampled: the answer's ids stay; the re-render adds only its closing scaffold [2] (prompt).
    assert ep["token_ids"] == [1, 10, 11, 12, 13, 14, 90, 91, 20, 21, 22, 2, 92, 40, 93, 90, 91, 30, 2]
    assert ep["kinds"] == (
        ["prompt"] * 8 + ["policy"] * 3 + ["prompt"] + ["tool"] * 3 + ["prompt"] * 2 + ["policy"] * 2
    )
    assert pick(ep, "policy", "logprobs") == [-0.1, -0.2, -0.3, -0.5, -0.05]
    # By hand: the re-render first differs at row position 9 (21 -> 23); the sampled tail [21, 22]
    # keeps 22 in [23, 24, 22]: 1 differing id.
    assert ep["meta"]["drift"] == [
        {
            "turn": 1,
            "position": 9,
            "sampled": 2,
            "rerendered_ids": [23, 24, 22],
            "differing": 1,
            "first": [21, 23],
            "at": [9],
        }
    ]
