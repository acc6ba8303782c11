"""verl ``rollout_data_dir`` JSONL (app/ingest/verl_rollout.py): text re-tokenised, the score the
outcome, the GRPO samples of one prompt one group; in multi-turn dumps the tool responses
recovered from the text are tool tokens and get no credit under any scheme.

fixtures/formats/verl_rollout.jsonl is written by fixtures/formats/make_examples.py (single-turn,
the same prompt sampled four times). fixtures/formats/verl_rollout_multiturn/dump.jsonl is written by make_dump.py beside it the way
verl 0.9.1 writes ``trainer.rollout_data_dir`` (RayPPOTrainer._log_rollout_data decodes with
``skip_special_tokens=True``; RayPPOTrainer._write_generations writes the lines): Qwen2.5's
template with ``<|im_start|>``/``<|im_end|>`` stripped, so ``</tool_call>\\nuser\\n<tool_response>…
</tool_response>\\nassistant\\n`` is what is left of each tool turn. The hand-written cases follow
the Hermes/Qwen template (tool_response blocks, bare role lines, intact ``<|im_start|>`` markers)."""

from __future__ import annotations

import json
import re

import pytest

from app.core.tokenize import tokenize
from tests.app.ingest.fmt_helpers import (
    all_schemes,
    assert_no_credit_off_policy,
    example,
    lines,
    pick,
    stored,
    text,
)
from tests.app.svc_helpers import FORMATS

DUMP = FORMATS / "verl_rollout_multiturn" / "dump.jsonl"
BLOCK = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)


def test_verl_rollout(client):
    batch, eps = stored(client, "verl_rollout.jsonl", example("verl_rollout.jsonl"))
    assert batch["source"] == "upload:verl_rollout"
    for sent, got in zip(lines("verl_rollout.jsonl"), eps, strict=True):
        assert "".join(pick(got, "prompt")) == sent["input"]
        assert pick(got, "policy") == tokenize(sent["output"])
        assert got["reward"] == sent["score"] and got["meta"]["step"] == 3
    assert len({e["group"] for e in eps}) == 1  # the same prompt sampled 4 times is one group
    diag = batch["diagnostics"]
    assert diag["groups"][0]["n"] == 4 and diag["groups"][0]["pass_rate"] == 0.5


CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


def test_dump_tool_responses_are_tool_tokens(client):
    rows = [json.loads(line) for line in DUMP.read_text().splitlines()]
    batch, eps = stored(client, "7.jsonl", DUMP.read_bytes())
    assert batch["source"] == "upload:verl_rollout" and len(eps) == 8
    with_tools = 0
    for row, ep in zip(rows, eps, strict=True):
        out = row["output"]
        blocks = BLOCK.findall(out)
        with_tools += bool(blocks)
        # Every tool response (tags included) is tool text, and nothing else is.
        assert text(ep, "tool") == "".join(blocks)
        pol = text(ep, "policy")
        assert "<tool_response>" not in pol and "\nuser\n" not in pol
        # The tool calls stay the policy's.
        assert all(c in pol for c in CALL.findall(out))
        # One turn per assistant segment: one more than the number of tool responses.
        assert len(set(pick(ep, "policy", "turn_ids"))) == len(blocks) + 1
        # Template lines are prompt; the text round-trips.
        assert "".join(ep["tokens"]) == row["input"] + out
        assert ep["reward"] == row["score"]
    assert with_tools == 6


@pytest.mark.parametrize("slot", range(8))
def test_dump_no_credit_on_tool_tokens_under_every_scheme(client, slot):
    _, eps = stored(client, "7.jsonl", DUMP.read_bytes())
    ep = eps[slot]
    assert len(all_schemes(client)) > 10  # every registered scheme is tried
    assert_no_credit_off_policy(client, ep)


def _line(output, score=1.0, **extra):
    return json.dumps({"input": "user\nQ\nassistant\n", "output": output, "score": score, **extra}) + "\n"


def test_intact_im_markers_and_several_responses(client):
    out = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n'
        "<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nDone<|im_end|>"
    )
    _, [ep, ep2] = stored(client, "r.jsonl", _line(out) + _line("no tools here", 0.0))
    assert text(ep, "tool") == "<tool_response>\nR1\n</tool_response><tool_response>\nR2\n</tool_response>"
    assert (
        text(ep, "policy")
        == '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call><|im_end|>Done<|im_end|>'
    )
    assert "<|im_start|>user\n" in text(ep, "prompt") and "<|im_start|>assistant\n" in text(ep, "prompt")
    assert len(set(pick(ep, "policy", "turn_ids"))) == 2
    assert text(ep2, "policy") == "no tools here" and text(ep2, "tool") == ""
    assert_no_credit_off_policy(client, ep)


def test_role_word_inside_policy_text_is_not_a_header(client):
    # "user" ends a sentence, not a line of its own: it stays policy.
    out = "Ask the user\n<tool_response>x</tool_response>\nassistant\nok"
    _, eps = stored(client, "r.jsonl", _line(out) + _line("b"))
    assert text(eps[0], "policy") == "Ask the userok"
    assert text(eps[0], "tool") == "<tool_response>x</tool_response>"
    assert text(eps[0], "prompt").endswith("\n\nassistant\n")
