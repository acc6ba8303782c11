"""miles' dashboard columns (``dashboard_columns/rollout_N.parquet``) uploaded to the real app
without naming a format.

No public file exists (run outputs): fixtures/formats/miles_parquet/rollout_3.parquet is written by
make_example.py beside it in the schema of miles' ``save_dashboard_columns`` (radixark/miles). The
edge cases are hand-made in the same schema: the dashboard token view's extra columns, a loss mask
of the wrong length, a damaged file, a column of the wrong length."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.app.ingest.fmt_helpers import example, pick, refused, stored, uploaded_advantages

EX = "miles_parquet/rollout_3.parquet"


def _rows() -> list[dict]:
    return pq.read_table(io.BytesIO(example(EX))).to_pylist()


def _parquet(rows: list[dict]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def test_the_columns_miles_writes(client):
    batch, eps = stored(client, "rollout_3.parquet", example(EX))
    assert batch["source"] == "upload:miles_parquet" and len(eps) == 3
    a, b, c = eps
    assert b["token_ids"] == [1, 5, 6, 30, 31, 40, 41, 32, 2]
    # total 9 - response 6 = 3 prompt ids; the response's loss_mask 0 after trained ids is tool.
    assert b["kinds"] == ["prompt"] * 3 + ["policy"] * 2 + ["tool"] * 2 + ["policy"] * 2
    assert pick(b, "policy", "logprobs") == [-1.0, -0.5, -0.25, -0.0625]  # the engine's (float32-exact)
    assert a["group"] == b["group"] != c["group"]  # the prompt's hash
    assert c["kinds"] == ["prompt", "prompt", "policy", "policy"]  # null loss_mask: all trained
    assert c["logprobs"] is None and c["meta"]["sample_index"] == 2


def test_token_view_columns_when_present(client):
    rows = _rows()
    r = rows[0]
    r.update(log_probs=[-0.4, -0.3, None], advantages=[1.0, 1.0, 1.0], returns=[1.0, 1.0, 1.0], reward=1.0)
    _, [ep] = stored(client, "r.parquet", _parquet([r]))
    # With a training-side log_probs column the engine's become rollout_logprobs.
    assert pick(ep, "policy", "logprobs") == [-0.4, -0.3, 0.0] and ep["meta"]["non_finite"] == {
        "log_probs": 1
    }
    assert pick(ep, "policy", "rollout_logprobs") == [-0.5, -0.25, -0.125]
    assert uploaded_advantages(client, ep["slug"])[3:] == [1.0, 1.0, 1.0]
    assert ep["meta"]["token_signals"]["returns"] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert ep["reward"] == 1.0


def test_a_loss_mask_of_the_wrong_length_is_kept(client):
    rows = _rows()
    rows[0]["loss_mask"] = [1, 1]  # 2 entries for a response of 3 ids
    _, eps = stored(client, "r.parquet", _parquet(rows[:1]))
    assert eps[0]["meta"]["mask_misaligned"]["at"] == [5]  # the last response id, after 3 prompt ids
    assert eps[0]["kinds"][5] == "tool"


def test_a_column_of_the_wrong_length_names_it(client):
    rows = _rows()
    rows[1]["rollout_log_probs"] = [-1.0]
    err = refused(client, "r.parquet", _parquet(rows))
    assert err["code"] == "bad_miles_columns" and err["field"] == "rollout_log_probs" and err["episode"] == 2


@pytest.mark.parametrize("cut", [200, -20])
def test_a_damaged_file_says_which_part(client, cut):
    data = example(EX)
    bad = data[:cut] + data[-8:] if cut > 0 else data[:cut]
    err = refused(client, "r.parquet", bad)
    assert err["code"] == "damaged_file"
