"""The structural reader (app/ingest/_structure.py), its containers and the `transcript` format,
without the database: public example files of each shape (fixtures/formats/transcript/README.md
says where each comes from) and hand-written records from each shape's documentation.

Kinds and turns are checked on the rendered tokens: policy text, tool text and the set of turn
ids of the policy tokens (one turn per model reply)."""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.ingest import _notes, detect
from app.ingest._document import Document
from app.ingest._roles import ROLE_KINDS, role_kind
from app.ingest._structure import call_of, find_group, find_reward, plan_of
from app.ingest.transcript import episodes

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "formats" / "transcript"


def _read(data: bytes | str) -> tuple[list[EpisodeIn], list[str]]:
    raw = data.encode() if isinstance(data, str) else data
    with _notes.collecting() as warnings:
        eps = [ep for _, ep in episodes(Document.of(raw))]
    assert all(isinstance(e, EpisodeIn) for e in eps)
    return eps, warnings


def _text(ep: EpisodeIn, kind: str) -> str:
    return "".join(t for t, k in zip(ep.tokens, ep.kinds, strict=True) if k == kind)


def _turns(ep: EpisodeIn) -> int:
    assert ep.turn_ids is not None
    return len({t for t, k in zip(ep.turn_ids, ep.kinds, strict=True) if k == "policy"})


def _tool_spans(ep: EpisodeIn) -> int:
    k = ep.kinds
    return sum(1 for i in range(len(k)) if k[i] == "tool" and (i == 0 or k[i - 1] != "tool"))


def _jsonl(rows: list[Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# ---- the role table --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "kind"),
    [
        ("assistant", "policy"),
        ("Model", "policy"),
        ("gpt", "policy"),
        ("AI", "policy"),
        ("agent", "policy"),
        ("function_call", "policy"),
        ("tool", "tool"),
        ("ipython", "tool"),
        ("observation", "tool"),
        ("env", "tool"),
        ("tool-result", "tool"),
        ("exit", "tool"),
        ("user", "prompt"),
        ("human", "prompt"),
        ("developer", "prompt"),
        ("instructions", "prompt"),
    ],
)
def test_role_table(role, kind):
    assert role_kind(role) == kind


def test_unknown_role_is_none_and_table_is_consistent():
    assert role_kind("narrator") is None
    assert set(ROLE_KINDS.values()) == {"policy", "tool", "prompt"}


# ---- public files ------------------------------------------------------------------------------


def test_bare_message_list_mini_swe_agent():
    # A bare JSON array of messages (mini-swe-agent v1); observations are user messages that
    # start with <returncode>: tool after the first policy turn.
    [ep], warnings = _read((FIX / "local.traj.json").read_bytes())
    assert _turns(ep) == 2
    assert _tool_spans(ep) == 1
    assert "<returncode>0</returncode>" in _text(ep, "tool")
    assert "echo 'hello world'" in _text(ep, "policy")
    assert "Blah blah blah" in _text(ep, "prompt")
    assert ep.reward is None
    assert any("have no reward" in w and "total_reward" in w for w in warnings)


def test_gemini_stream_chunks_are_one_reply():
    # gemini-cli's recorded generateContentStream: each line is one model call as stream chunks
    # (thought, text, functionCall): one episode per line, one turn per call.
    eps, _ = _read((FIX / "hooks-system.block-tool.responses").read_bytes())
    assert len(eps) == 2
    first = eps[0]
    assert _turns(first) == 1
    policy = _text(first, "policy")
    assert "<tool_call>" in policy and "write_file" in policy and '"file_path": "test.txt"' in policy
    assert "Initializing File Creation" in policy  # the thought part is the model's
    assert _turns(eps[1]) == 1 and "blocked by the security policy" in _text(eps[1], "policy")


def test_inspect_json_log_samples_scores_and_group():
    eps, _ = _read((FIX / "inspect_log_read_sample.json").read_bytes())
    [ep] = eps
    assert ep.reward == 1.0  # scores.match.value "C": Inspect's CORRECT
    assert ep.meta["outcome"] == "pass/fail" and ep.meta["reward_key"] == "scores.match.value"
    assert ep.group == "1"  # the sample id (epoch is the trial)
    assert _text(ep, "policy").startswith("Yes\n")
    assert "Positive posts" in _text(ep, "prompt")


def _eval_zip(log: dict[str, Any], attach: bool) -> bytes:
    """An Inspect ``.eval`` (header.json + samples/<id>_epoch_<n>.json), as Inspect writes it,
    from a JSON log; ``attach``: long message text moved to ``attachments`` (attachment://)."""
    header = {k: v for k, v in log.items() if k != "samples"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("_journal/start.json", json.dumps({"version": 2, "eval": log["eval"]}))
        for s in log["samples"]:
            s = json.loads(json.dumps(s))
            if attach:
                s["attachments"] = {}
                for m in s["messages"]:
                    key = f"{abs(hash(m['content'])):032x}"[:32]
                    s["attachments"][key] = m["content"]
                    m["content"] = f"attachment://{key}"
            zf.writestr(f"samples/{s['id']}_epoch_{s['epoch']}.json", json.dumps(s))
        zf.writestr("summaries.json", "[]")
        zf.writestr("header.json", json.dumps(header))
    return buf.getvalue()


@pytest.mark.parametrize("attach", [False, True])
def test_inspect_eval_zip_is_read_not_given_to_torch(attach):
    log = json.loads((FIX / "inspect_log_read_sample.json").read_text())
    data = _eval_zip(log, attach)
    assert detect(data) == "transcript"  # a zip without data.pkl is not torch's
    [ep], _ = _read(data)
    [want], _ = _read((FIX / "inspect_log_read_sample.json").read_bytes())
    assert ep.tokens == want.tokens and ep.kinds == want.kinds and ep.reward == 1.0
    assert ep.meta["model"] == "ollama/gemma3" and ep.meta["file"] == "samples/1_epoch_1.json"


def test_sharegpt_function_call_turns():
    eps, _ = _read((FIX / "glaive_toolcall_en_demo.json").read_bytes())
    assert len(eps) == 2
    ep = eps[1]
    # 3 function_call turns + 3 gpt answers; 3 observations are tool spans.
    assert _turns(ep) == 6 and _tool_spans(ep) == 3
    policy = _text(ep, "policy")
    assert policy.count("<tool_call>") == 3 and "calculate_area" in policy
    assert '{"area": 49}' in _text(ep, "tool")


def test_gzip_container():
    raw = (FIX / "glaive_toolcall_en_demo.json").read_bytes()
    plain, _ = _read(raw)
    zipped, _ = _read(gzip.compress(raw))
    assert [e.tokens for e in zipped] == [e.tokens for e in plain]


# ---- hand-written shapes from each one's documentation ------------------------------------------


def test_anthropic_content_blocks():
    # Messages API: assistant content blocks text + tool_use; the result comes back as a user
    # message whose content is a tool_result block.
    rec = {
        "conversation": [
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "20C sunny"}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "It is 20C."}]},
        ],
        "score": 1,
    }
    [ep], _ = _read(json.dumps(rec))
    assert _turns(ep) == 2 and _tool_spans(ep) == 1
    assert _text(ep, "tool") == "20C sunny"
    assert '<tool_call> get_weather {"city": "Paris"}</tool_call>' in _text(ep, "policy")
    assert ep.reward == 1.0 and ep.meta["outcome"] == "real"


def test_responses_items_input_and_output():
    # Responses API: the prompt items under `input`, the model's items under `output`; the
    # reasoning and the function_call of one model call are one turn.
    rec = {
        "request": {"input": [{"type": "message", "role": "user", "content": "2+2?"}]},
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "add"}]},
            {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": '{"x": "2+2"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "4"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]},
        ],
        "reward": 0.5,
    }
    [ep], _ = _read(json.dumps(rec))
    assert _turns(ep) == 2 and _text(ep, "tool") == "4"
    assert "2+2?" in _text(ep, "prompt")
    assert "<think>add</think>" in _text(ep, "policy")


def test_tool_calls_without_function_name_and_as_strings():
    rec = {
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "-1", "name": "get_user", "arguments": {"user_id": "u1"}},  # tau2
                    '{"function": {"name": "ls", "arguments": "{}"}}',  # verifiers: a JSON string
                    {"function": "bash", "arguments": {"cmd": "ls"}},  # Inspect
                    {"function": {"arguments": "{}"}},  # no name: still a call
                ],
            },
            {"role": "tool", "content": "ok"},
            {"role": "exit", "content": "submitted"},
        ]
    }
    [ep], _ = _read(json.dumps({"trace": rec}))
    policy = _text(ep, "policy")
    assert policy.count("<tool_call>") == 4
    assert '<tool_call> get_user {"user_id": "u1"}</tool_call>' in policy
    assert "<tool_call>  {}</tool_call>" in policy
    assert _text(ep, "tool") == "oksubmitted"  # exit: the environment's closing message


def test_hermes_text_tool_calls():
    rec = {
        "chat": [
            {"role": "system", "content": "tools: search"},
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": {}}</tool_call>'},
            {"role": "user", "content": "<tool_response>x is 1</tool_response>"},
            {"role": "assistant", "content": "x is 1"},
        ]
    }
    [ep], _ = _read(json.dumps(rec))
    assert _turns(ep) == 2 and _text(ep, "tool") == "<tool_response>x is 1</tool_response>"


def test_action_observation_episodes_under_a_key():
    # AgentGym's MCP env writes {episodes: [{total_reward, success, data_idx, transitions:
    # [{step, action, observation, reward, done}]}], statistics}.
    doc = {
        "episodes": [
            {
                "episode_id": i,
                "data_idx": i // 2,
                "total_reward": 0.2 * (i + 1),
                "success": True,
                "transitions": [
                    {
                        "step": 1,
                        "action": "right",
                        "observation": "moved right",
                        "reward": 0.1,
                        "done": False,
                    },
                    {"step": 2, "action": "up", "observation": "moved up", "reward": 0.1, "done": True},
                ],
            }
            for i in range(3)
        ],
        "statistics": {"mean_reward": 0.4},
    }
    eps, _ = _read(json.dumps(doc))
    assert len(eps) == 3
    assert [e.reward for e in eps] == pytest.approx([0.2, 0.4, 0.6])  # total_reward before success
    assert [e.group for e in eps] == ["0", "0", "1"]
    assert _turns(eps[0]) == 2 and _tool_spans(eps[0]) == 2
    assert _text(eps[0], "tool") == "moved rightmoved up"


def test_steps_with_call_actions_and_a_task_prompt():
    # rLLM's trajectory: {task, reward, steps: [{observation, model_response, action}]}; an
    # action is a tool call dict with its result, or a message.
    rec = {
        "task": "who won?",
        "reward": 1.0,
        "steps": [
            {
                "observation": "",
                "model_response": "",
                "action": {
                    "type": "tool_call",
                    "tool_name": "search",
                    "tool_args": {"q": "w"},
                    "tool_result": "A won",
                },
            },
            {
                "observation": "",
                "model_response": "",
                "action": {"role": "assistant", "content": [{"text": "A won."}]},
            },
        ],
    }
    [ep], _ = _read(json.dumps(rec))
    assert _text(ep, "prompt").count("who won?") == 1
    assert _turns(ep) == 2 and _text(ep, "tool") == "A won"
    assert '<tool_call> search {"q": "w"}</tool_call>' in _text(ep, "policy") and "A won." in _text(
        ep, "policy"
    )


def test_list_of_message_lists_and_jsonl_of_messages():
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    eps, _ = _read(json.dumps([conv, conv, conv]))
    assert len(eps) == 3
    [one], _ = _read(_jsonl(conv + conv))
    assert _turns(one) == 2


def test_unknown_role_kept_as_prompt_with_a_warning():
    rec = {"messages": [{"role": "narrator", "content": "once"}, {"role": "assistant", "content": "upon"}]}
    [ep], warnings = _read(json.dumps(rec))
    assert _text(ep, "prompt").count("once") == 1
    assert any("role `narrator` is not in the role table (1 message)" in w for w in warnings)


def test_records_without_a_model_turn_are_skipped_when_others_have_one():
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    bad = {"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "c"}]}
    eps, warnings = _read(_jsonl([good, {"detail": [{"msg": "x"}]}, bad, good]))
    assert len(eps) == 2
    assert any("1 records skipped" in w and "no turn of the model" in w for w in warnings)
    assert any("1 lines are error reports" in w for w in warnings)
    with pytest.raises(ApiError) as e:
        _read(_jsonl([bad]))
    assert e.value.code == "no_episodes" and "tool" in e.value.message


# ---- reward, group ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rec", "value", "key", "binary"),
    [
        ({"reward": 0.25}, 0.25, "reward", False),
        ({"score": 1}, 1.0, "score", False),
        ({"total_reward": 0.30000000000000004}, 0.30000000000000004, "total_reward", False),
        ({"success": True}, 1.0, "success", True),
        ({"result": "FAIL"}, 0.0, "result", True),
        ({"scores": {"accuracy": 0.75}}, 0.75, "scores.accuracy", False),
        ({"scores": {"match": {"value": "I"}}}, 0.0, "scores.match.value", True),
        ({"scores": {"m": {"value": "P"}}}, 0.5, "scores.m.value", True),
        ({"eval": {"score": 0.9}}, 0.9, "eval.score", False),
        ({"info": {"reward": -1}}, -1.0, "info.reward", False),
        ({"reward_info": {"reward": 1.0, "db_check": {"db_reward": 0.0}}}, 1.0, "reward_info.reward", False),
        ({"test_result": {"result": False}}, 0.0, "test_result.result", True),
        ({"result": {"accuracy": "0.83"}}, 0.83, "result.accuracy", False),
    ],
)
def test_reward_discovery(rec, value, key, binary):
    r = find_reward(rec)
    assert r is not None and (r.value, r.key, r.binary) == (value, key, binary)


def test_no_reward_found():
    assert find_reward({"exit_status": "Submitted", "info": {"cost": 1.2}}) is None


@pytest.mark.parametrize(
    ("rec", "group"),
    [
        ({"task_id": 7, "instance_id": "x"}, "7"),
        ({"instance_id": "astropy-1"}, "astropy-1"),
        ({"example_id": 3}, "3"),
        ({"data_idx": 0}, "0"),
        ({"id": 12, "epoch": 2}, "12"),
        ({"id": "task_7_trial_2"}, "task_7"),
        ({"request_id": "q12#3"}, "q12"),
        ({"id": "ProntoQA_1"}, None),  # distinct tasks numbered, not trials
    ],
)
def test_group_discovery(rec, group):
    assert find_group(rec) == group


def test_call_shapes():
    assert call_of({"function": {"name": "f", "arguments": "{}"}}) == ("f", "{}")
    assert call_of({"ls": "{}"}) == ("ls", "{}")  # BFCL
    assert call_of({"name": "g", "args": {"a": 1}}) == ("g", '{"a": 1}')  # Gemini functionCall
    assert call_of("not json") == ("", "not json")


def test_plan_prefers_policy_then_shallow_then_long():
    rec = {
        "tasks": [{"initial_state": {"message_history": [{"role": "user", "content": "x"}]}}],
        "simulations": [
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}
        ],
    }
    plan = plan_of(rec)
    assert plan is not None and plan.root == ("simulations", "[]") and plan.parts == [("messages",)]


# ---- files that are not episodes ----------------------------------------------------------------


def test_metrics_log_says_what_it_is():
    lines = _jsonl([{"step": s, "data": {"actor/entropy": 0.5, "critic/score/mean": 0.1}} for s in range(3)])
    with pytest.raises(ApiError) as e:
        _read(lines)
    assert e.value.code == "not_episodes"
    assert e.value.message.startswith(
        "This looks like a training metrics log (metric names as verl logs them): 3 lines of `step`"
    )
    assert "`actor/entropy`" in e.value.message


def test_eval_summary_and_event_tuples_say_what_they_are():
    with pytest.raises(ApiError) as e:
        _read(json.dumps({"accuracy": 1.0, "correct_count": 2, "total_count": 2}))
    assert "evaluation summary" in e.value.message and "`accuracy` = 1.0" in e.value.message
    with pytest.raises(ApiError) as e:
        _read(_jsonl([["event", {"type": "session.created"}], ["event", {}]]))
    assert "[name, payload] event tuple" in e.value.message


def test_growing_transitions_are_read_once():
    # NeMo Gym's verifiers bridge (`contains_transitions`): `response.output` is a list of
    # transitions, each the whole conversation so far plus the model's new message, after the
    # prompt in `responses_create_params.input`.
    sys_ = {"type": "message", "role": "system", "content": "play"}
    user = {"type": "message", "role": "user", "content": "guess"}
    a1 = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "[crane]"}]}
    fb = {"type": "message", "role": "user", "content": "invalid, again"}
    a2 = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "[slate]"}]}
    rec = {
        "responses_create_params": {"input": [sys_, user]},
        "response": {"output": [[sys_, user, a1], [sys_, user, a1, fb, a2]]},
        "reward": 0.04,
    }
    assert detect(json.dumps(rec).encode()) == "transcript"
    [ep], _ = _read(json.dumps(rec))
    assert _turns(ep) == 2
    assert _text(ep, "policy").count("[crane]") == 1 and _text(ep, "prompt").count("guess") == 1
    assert "invalid, again" in _text(ep, "prompt")


def test_bfcl_result_calls_after_their_prompt():
    # BFCL's single-turn result: `result` holds the decoded calls ({"name": "<JSON arguments>"},
    # parallel calls of one reply), `inference_log` the request the model answered.
    rec = {
        "id": "live_parallel_multiple_0-0-0",
        "result": [
            {"ChaFod": '{"foodItem": "Caesar salad", "removeIngredients": "anchovies"}'},
            {"ChaDri.change_drink": '{"drink_id": "123"}'},
        ],
        "inference_log": [
            {"role": "inference_input", "content": {"message": "change my order", "tools": []}}
        ],
    }
    [ep], warnings = _read(json.dumps(rec))
    assert _turns(ep) == 1
    policy = _text(ep, "policy")
    assert policy.count("<tool_call>") == 2 and "ChaFod" in policy
    assert "change my order" in _text(ep, "prompt")
    assert any("role `inference_input`" in w for w in warnings)


def test_session_event_lines_are_one_transcript():
    # A session's SDK traffic logged as [name, payload] lines: events typed "<speaker>.<what>";
    # an event sent and then echoed by the stream is read once; session/span events are not
    # messages.
    lines = [
        ["sessions.create", {"agent": {"name": "a"}}],
        [
            "sessions.events.send",
            ["s1", {"events": [{"type": "user.message", "content": [{"type": "text", "text": "stars?"}]}]}],
        ],
        [
            "sessions.events.stream",
            {"type": "user.message", "id": "e1", "content": [{"type": "text", "text": "stars?"}]},
        ],
        ["sessions.events.stream", {"type": "span.model_request_start", "id": "e2"}],
        [
            "sessions.events.stream",
            {"type": "agent.message", "content": [{"type": "text", "text": "Fetching."}]},
        ],
        ["sessions.events.stream", {"type": "agent.tool_use", "name": "web_fetch", "input": {"url": "u"}}],
        [
            "sessions.events.stream",
            {
                "type": "agent.tool_result",
                "content": [{"type": "document", "source": {"type": "text", "data": "894 stars"}}],
            },
        ],
        ["sessions.events.stream", {"type": "agent.message", "content": [{"type": "text", "text": "894."}]}],
        ["sessions.events.stream", {"type": "session.status_idle", "stop_reason": {"type": "end_turn"}}],
    ]
    [ep], _ = _read(_jsonl(lines))
    assert _turns(ep) == 2 and _tool_spans(ep) == 1
    assert _text(ep, "prompt").count("stars?") == 1
    assert _text(ep, "tool") == "894 stars"
    assert '<tool_call> web_fetch {"url": "u"}</tool_call>' in _text(ep, "policy")
    assert ep.meta["events"] == 9


def test_a_transcript_whose_model_turns_are_all_empty_is_not_an_episode():
    rec = {"log": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}
    with pytest.raises(ApiError) as e:
        _read(json.dumps(rec))
    assert e.value.code == "no_episodes" and "every turn of the model" in e.value.message
