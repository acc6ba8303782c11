"""prime-rl token exports (``token_exports/step_N/rank_R.jsonl``) uploaded to the real app without
naming a format.

No public export file exists (they are run outputs): the examples in
fixtures/formats/prime_rl_tokens/ are written by make_example.py beside them from prime-rl's
exporter (src/prime_rl/trainer/rl/token_export.py of PrimeIntellect-ai/prime-rl, schema 1, and the
schema-2 fields of its later versions): one line per trained sample, null for a non-finite number,
the derived fields computed as the exporter computes them."""

from __future__ import annotations

import json
import math

import pytest

from tests.app.ingest.fmt_helpers import (
    STORED_FIELDS,
    example,
    lines,
    pick,
    refused,
    stored,
    upload,
    uploaded_advantages,
)

R0, R1 = "prime_rl_tokens/rank_0.jsonl", "prime_rl_tokens/rank_1.jsonl"


def test_a_rank_file_every_per_token_field(client):
    rows = lines(R0)
    batch, eps = stored(client, "rank_0.jsonl", example(R0))
    assert batch["source"] == "upload:prime_rl_tokens" and len(eps) == 2
    a, b = eps
    row = rows[0]
    assert a["token_ids"] == row["token_ids"]
    # loss_mask: prompt until the first trained id, the untrained ids between turns are tool.
    assert a["kinds"] == ["prompt"] * 4 + ["policy"] * 3 + ["tool"] * 2 + ["policy"] * 2
    assert a["logprobs"] == row["trainer_logprobs"] and a["rollout_logprobs"] == row["inference_logprobs"]
    assert a["entropy"] == row["entropy"]
    assert uploaded_advantages(client, a["slug"]) == row["advantages"]
    assert a["reward"] == 1.0 and b["reward"] == 0.0  # `rewards` at the last trained token
    assert a["group"] == b["group"]  # one prompt, two rollouts
    sig = a["meta"]["token_signals"]
    # The exporter's own arithmetic at position 5 (trainer -0.9, inference -0.3):
    # importance_ratio = exp(-0.6) = 0.5488, mismatch_kl = 0.5488 + 0.6 - 1 = 0.1488,
    # prob_delta = exp(-0.9) - exp(-0.3) = 0.4066 - 0.7408 = -0.3343 (< -0.2 but A > 0: not masked).
    assert sig["importance_ratio"][5] == pytest.approx(math.exp(-0.6))
    assert sig["mismatch_kl"][5] == pytest.approx(math.exp(-0.6) + 0.6 - 1)
    assert sig["prob_delta"][5] == pytest.approx(math.exp(-0.9) - math.exp(-0.3))
    assert sig["is_masked"] == row["is_masked"] and all(type(x) is bool for x in sig["is_masked"])
    assert sig["rl_weights"] == row["rl_weights"]
    assert "ce_weights" not in sig and "sdpo_weights" not in sig  # null columns: nothing to show
    assert a["meta"]["env_name"] == "calc" and a["meta"]["sample_id"] == "ex7-0"
    assert "mask_misaligned" not in a["meta"]


def test_a_step_of_two_ranks_and_its_audit(client):
    _, eps = stored(client, "step_3.jsonl", example(R0) + example(R1))
    assert [e["meta"]["rank"] for e in eps] == [0, 0, 1]
    r = client.get(f"/api/batches/{eps[0]['batch_id']}/audit")
    assert r.status_code == 200, r.text
    codes = {f["code"] for f in r.json()["findings"]}
    assert "mask_misaligned" not in codes and "retokenization_drift" not in codes


def test_schema_1_nulls_and_losses(client):
    [row] = lines(R1)
    _, [ep] = stored(client, "rank_1.jsonl", example(R1))
    assert ep["reward"] is None  # every `rewards` entry null
    assert ep["entropy"] == [0.0, 0.9, 0.8, 0.5, 0.4, 0.0] and ep["meta"]["non_finite"] == {"entropy": 1}
    assert ep["meta"]["losses"] == row["losses"]


@pytest.mark.parametrize(
    "mask, at",
    [
        # 4 entries for 6 ids: positions 4 and 5 have none (read as not trained).
        ([False, False, False, True], [4, 5]),
        # 8 entries for 6 ids: the mask is 2 longer, its last 2 ids are the ones in doubt.
        ([False, False, False, False, False, True, True, True], [4, 5]),
    ],
)
def test_a_mask_that_does_not_fit_is_kept_and_audited(client, mask, at):
    [row] = lines(R1)
    row["loss_mask"] = mask
    _, [ep] = stored(client, "rank_1.jsonl", json.dumps(row))
    bad = ep["meta"]["mask_misaligned"]
    assert bad["at"] == at and bad["mask_length"] == len(mask) and bad["ids_length"] == 6
    f = {x["code"]: x for x in client.get(f"/api/batches/{ep['batch_id']}/audit").json()["findings"]}
    assert f["mask_misaligned"]["tokens"] == [[0, p] for p in at]


def test_a_field_of_the_wrong_length_is_refused(client):
    [row] = lines(R1)
    row["importance_ratio"] = row["importance_ratio"][:-1]
    err = refused(client, "rank_1.jsonl", json.dumps(row))
    assert err["code"] == "length_mismatch" and err["field"] == "importance_ratio" and err["line"] == 1


def test_a_rank_file_cut_mid_line(client):
    data = example(R0)
    cut = data[: data.index(b"\n") + 40]  # the second line is still being written
    r = upload(client, "rank_0.jsonl", cut)
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_json" and r.json()["error"]["line"] == 2


def test_tokenizer_free_ids_are_shown_as_ids(client):
    _, [ep] = stored(client, "rank_1.jsonl", example(R1))
    assert pick(ep, "policy") == ["⟨50⟩", "⟨51⟩", "⟨2⟩"]


def test_samples_of_8192_tokens_lines_over_a_mebibyte(client):
    # A real export line of 8,192 tokens with every field is over 1 MiB: still JSONL.
    [row] = lines(R1)
    n = 8192
    big = dict(
        row, token_ids=[7] * n, position_ids=list(range(n)), loss_mask=[False] * 100 + [True] * (n - 100)
    )
    for name in ("advantages", "inference_logprobs", "trainer_logprobs", "entropy", "mismatch_kl"):
        big[name] = [-0.123456789] * n
    for name in ("log_importance_ratio", "importance_ratio", "prob_delta", "rewards"):
        big[name] = [0.987654321] * n
    for name in ("is_masked", "is_masked_high", "is_masked_low"):
        big[name] = [False] * n
    big.pop("losses")
    line = json.dumps(big)
    assert len(line) > 1 << 20
    _, eps = stored(client, "rank_0.jsonl", line + "\n" + line + "\n")
    assert len(eps) == 2 and len(eps[0]["kinds"]) == n and eps[0]["kinds"].count("policy") == n - 100


@pytest.mark.parametrize(
    "field, value, code",
    [
        ("token_ids", [1, 8, 9, 50.5, 51, 2], "wrong_type"),  # a float id
        ("token_ids", [1, 8, 9, None, 51, 2], "wrong_type"),  # a missing id
        ("token_ids", [1, 8, 9, 2**70, 51, 2], "wrong_type"),  # beyond 64 bits
        ("loss_mask", [False, False, False, 0.5, True, True], "wrong_type"),  # not a boolean
        ("loss_mask", [False, False, False, None, True, True], "wrong_type"),
        ("entropy", [0.0, 0.9, "x", 0.5, 0.4, 0.1], "wrong_type"),  # named entry 2
    ],
)
def test_entries_that_are_not_what_the_field_holds_are_refused(client, field, value, code):
    [row] = lines(R1)
    row[field] = value
    err = refused(client, "rank_1.jsonl", json.dumps(row))
    assert (err["code"], err["field"], err["line"]) == (code, field, 1)
    if field == "entropy":
        assert "entry 2" in err["message"]


def test_mask_entries_as_integers_are_read_as_booleans(client):
    # 0/1 (and any other integer, 300 beyond an int8 included) read as not trained / trained.
    [row] = lines(R1)
    row["loss_mask"] = [0, 0, 0, 1, 300, 1]
    _, [ep] = stored(client, "rank_1.jsonl", json.dumps(row))
    assert ep["kinds"] == ["prompt"] * 3 + ["policy"] * 3


def _two(row: dict) -> str:
    """Two copies of a line as a JSONL file: a single JSON document is read whole, lines as columns
    (app/ingest/_columns.py)."""
    line = json.dumps(row)
    return line + "\n" + line + "\n"


def test_lines_read_as_columns_store_what_the_generic_reader_stores(client):
    # The same lines, read by columns and (with a "[" inside a string, which the column reader leaves
    # to the generic JSON reader) read whole: every array, signal and meta entry equal.
    rows = lines(R0) + lines(R1)
    plain = "".join(json.dumps(r) + "\n" for r in rows)
    generic = "".join(json.dumps(dict(r, note="a[1]")) + "\n" for r in rows)
    _, by_columns = stored(client, "rank_0.jsonl", plain)
    _, by_lines = stored(client, "rank_0.jsonl", generic)
    assert len(by_columns) == len(by_lines) == 3
    for a, b in zip(by_columns, by_lines, strict=True):
        assert b["meta"].pop("note") == "a[1]"
        for key in STORED_FIELDS:
            assert a[key] == b[key], key
        assert uploaded_advantages(client, a["slug"]) == uploaded_advantages(client, b["slug"])


def test_a_line_with_nan_in_a_file_read_as_columns(client):
    # Python's json writes NaN; the column reader leaves that line to the generic reader, which
    # reads it as not finite (0 in the arrays, counted), and the other line by columns.
    [row] = lines(R1)
    nan = dict(row, mismatch_kl=[float("nan")] + row["mismatch_kl"][1:])
    _, [a, b] = stored(client, "rank_1.jsonl", json.dumps(row) + "\n" + json.dumps(nan) + "\n")
    assert a["meta"]["token_signals"]["mismatch_kl"] == row["mismatch_kl"]
    assert b["meta"]["token_signals"]["mismatch_kl"] == [None] + row["mismatch_kl"][1:]


@pytest.mark.parametrize(
    "field, value, code",
    [
        ("token_ids", [1, 8, 9, 50.5, 51, 2], "wrong_type"),
        ("token_ids", [1, 8, 9, 2**70, 51, 2], "wrong_type"),
        ("loss_mask", [0, 0, 0, 0.5, 1, 1], "wrong_type"),
        ("importance_ratio", [1.0, 1.0], "length_mismatch"),
    ],
)
def test_columns_refuse_what_the_field_does_not_hold(client, field, value, code):
    [row] = lines(R1)
    err = refused(
        client, "rank_1.jsonl", json.dumps(row) + "\n" + json.dumps(dict(row, **{field: value})) + "\n"
    )
    assert (err["code"], err["field"], err["line"]) == (code, field, 2)


def test_columns_read_mask_integers_and_ids_as_the_lists_do(client):
    [row] = lines(R1)
    _, [ep, _] = stored(client, "rank_1.jsonl", _two(dict(row, loss_mask=[0, 0, 0, 1, 300, 1])))
    assert ep["kinds"] == ["prompt"] * 3 + ["policy"] * 3
    assert ep["token_ids"] == row["token_ids"]


@pytest.mark.parametrize("how", ["columns", "whole"])
def test_boolean_signals_stay_booleans_unless_a_null_or_number_mixes_in(client, how):
    [row] = lines(R1)
    row = dict(
        row,
        is_masked=[False, True, False, False, True, False],
        is_masked_high=[False, None, False, False, True, False],  # null: numbers, null kept
        is_masked_low=[0, True, False, False, True, False],  # starts with a number: numbers
    )
    data = _two(row) if how == "columns" else json.dumps(row)
    _, [ep, *_] = stored(client, "rank_1.jsonl", data)
    sig = ep["meta"]["token_signals"]
    assert sig["is_masked"] == row["is_masked"] and all(type(x) is bool for x in sig["is_masked"])
    assert sig["is_masked_high"] == [0.0, None, 0.0, 0.0, 1.0, 0.0]
    assert sig["is_masked_low"] == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert all(type(x) is float for x in sig["is_masked_low"])
