"""TRL's completions parquet (app/ingest/trl_completions.py), uploaded to the real app.

The file is the one TRL's own GRPOTrainer writes (fixtures/formats/make_trl_completions.py; the
slow test runs the trainer here). Malformed variants answer a 4xx naming the field (and the
episode) and store nothing; a file that declares more than the budget is a 413."""

from __future__ import annotations

import io
import math

import pyarrow.parquet as pq
import pytest

from app.core.tokenize import tokenize
from app.ingest import trl_completions
from app.ingest.trl_completions import END, write_example
from tests.app.ingest.fmt_helpers import fixture_module, pick, stored
from tests.app.ingest.fmt_helpers import upload as post
from tests.app.ingest.fmt_helpers import uploaded_advantages as uploaded_adv
from tests.app.svc_helpers import FORMATS, row_counts


def check_trl(client, data: bytes):
    rows = pq.read_table(io.BytesIO(data)).to_pylist()
    batch, eps = stored(client, "completions.parquet", data)
    assert batch["source"] == "upload:trl_completions" and len(eps) == len(rows)
    reward_cols = [c for c in rows[0] if c not in ("step", "prompt", "completion", "advantage")]
    for row, ep in zip(rows, eps, strict=True):
        assert "".join(pick(ep, "prompt")) == row["prompt"]
        assert pick(ep, "policy") == tokenize(row["completion"]) + [END]
        assert ep["reward"] == pytest.approx(sum(row[c] for c in reward_cols))
        assert ep["meta"]["step"] == row["step"]
        adv = uploaded_adv(client, ep["slug"])
        # TRL's one advantage per completion sits on every policy token, nothing elsewhere.
        assert [a for a, k in zip(adv, ep["kinds"], strict=True) if k == "policy"] == pytest.approx(
            [row["advantage"]] * len(pick(ep, "policy"))
        )
        assert all(a in (None, 0.0) for a, k in zip(adv, ep["kinds"], strict=True) if k != "policy")
    # TRL samples each prompt num_generations (2) times: one group per prompt.
    groups = {}
    for row, ep in zip(rows, eps, strict=True):
        groups.setdefault(row["prompt"], set()).add(ep["group"])
    assert all(len(g) == 1 for g in groups.values())
    assert len({ep["group"] for ep in eps}) == len(groups)
    return rows, eps


def test_trl_fixture_round_trips(client):
    rows, eps = check_trl(client, (FORMATS / "trl_completions.parquet").read_bytes())
    # The fixture has a group whose rewards differ (1 and 0): GRPO's advantages are +-0.707.
    assert sorted(r["count_a"] for r in rows if r["prompt"] == "rename the loop index") == [0.0, 1.0]
    assert eps[1]["tokens"][-1] == END  # the empty completion still has its stop token


@pytest.mark.slow
def test_trl_parquet_written_by_grpo_trainer(client, tmp_path):
    """A real, tiny GRPOTrainer run (random 2-layer Llama, tokenizer trained here, CPU)."""
    pytest.importorskip("trl")
    files = fixture_module("make_trl_completions").run(tmp_path, steps=2)
    assert [f.name for f in files] == ["completions_00001.parquet", "completions_00002.parquet"]
    for f in files:
        rows, _ = check_trl(client, f.read_bytes())
        assert len(rows) == 4 and list(rows[0]) == ["step", "prompt", "completion", "count_a", "advantage"]


def test_trl_conversational_rows(client):
    rows = [
        {
            "step": 5,
            "prompt": [{"role": "user", "content": "What is 2+2?"}],
            "completion": [{"role": "assistant", "content": "4"}],
            "accuracy": r,
            "fmt": 0.5,
            "advantage": a,
        }
        for r, a in ((1.0, 0.7), (0.0, -0.7))
    ]
    batch, eps = stored(client, "x", write_example(rows))
    for row, ep in zip(rows, eps, strict=True):
        assert pick(ep, "policy") == ["4", "<|end|>"]
        assert "What is 2+2?" in "".join(pick(ep, "prompt"))
        assert ep["reward"] == row["accuracy"] + 0.5
        assert ep["meta"]["reward_functions"] == {"accuracy": row["accuracy"], "fmt": 0.5}
    assert eps[0]["group"] == eps[1]["group"]


def test_trl_unscored_reward_function_is_left_out(client):
    """TRL logs NaN where a reward function returned None (it did not apply to that sample)."""
    rows = [
        {"step": 1, "prompt": "p", "completion": "c", "math": math.nan, "code": 1.0, "advantage": 0.0},
        {"step": 1, "prompt": "p", "completion": "d", "math": math.nan, "code": 0.0, "advantage": 0.0},
    ]
    _, eps = stored(client, "x", write_example(rows))
    assert [e["reward"] for e in eps] == [1.0, 0.0]
    assert eps[0]["meta"]["reward_functions"] == {"math": None, "code": 1.0}


# --------------------------------------------------------------------------------------------- malformed


def _trl_rows():
    return pq.read_table(FORMATS / "trl_completions.parquet").to_pylist()


def _trl(change):
    rows = _trl_rows()
    change(rows)
    return write_example(rows)


def _drop(rows, key):
    for r in rows:
        r.pop(key)


def _set(i, key, value):
    def change(rows):
        rows[i][key] = value

    return change


MALFORMED = {
    "trl_missing_completion": (
        lambda: _trl(lambda r: _drop(r, "completion")),
        422,
        "missing_field",
        "completion",
        1,
    ),
    "trl_nan_advantage": (lambda: _trl(_set(2, "advantage", math.nan)), 422, "not_finite", "advantage", 3),
    "trl_inf_reward": (lambda: _trl(_set(1, "count_a", math.inf)), 422, "not_finite", "count_a", 2),
    "trl_prompt_not_text": (
        lambda: write_example([{"step": 1, "prompt": 3, "completion": "x", "advantage": 0.0}]),
        422,
        "wrong_type",
        "prompt",
        1,
    ),
    "trl_advantage_text": (
        lambda: write_example([{"step": 1, "prompt": "p", "completion": "x", "r": 1.0, "advantage": "high"}]),
        422,
        "wrong_type",
        "advantage",
        1,
    ),
    "trl_truncated_file": (
        lambda: (FORMATS / "trl_completions.parquet").read_bytes()[:-200] + b"PAR1",
        422,
        "damaged_file",
        "file",
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_is_refused_and_nothing_stored(client, case):
    make, status, code, field, episode = MALFORMED[case]
    before = row_counts(client)
    r = post(client, case, make())
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["field"] == field and err["episode"] == episode, err
    if field and code != "damaged_file":  # a damaged file names its part, not a field
        assert f"`{field}`" in err["message"]
    assert row_counts(client) == before


def test_declared_size_over_the_budget_is_413(client, monkeypatch):
    """Checked from the parquet footer, before any column is decoded."""
    before = row_counts(client)
    monkeypatch.setattr(trl_completions, "MAX_UNCOMPRESSED_BYTES", 100)
    r = post(client, "trl_completions.parquet", (FORMATS / "trl_completions.parquet").read_bytes())
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "too_large" and "limit" in r.json()["error"]["message"]
    assert row_counts(client) == before
