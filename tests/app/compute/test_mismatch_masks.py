"""The training-vs-rollout summaries count only the policy tokens both engines scored
(app/compute/mismatch.py): a placeholder — 0.0, NaN or a missing value where the loss masks the
position — is never a mismatch. Hand-made episodes whose placeholders, were they compared, would
show 9 to 14 nats of mismatch; every number is worked out in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.compute import loss_view as lv
from app.compute import mismatch
from app.compute.episode_fields import episode_fields
from app.compute.step import compute_step
from app.core.schemas import EpisodeIn
from tests.app.svc_helpers import jsonl, row_counts

NAN = math.nan
KINDS = ["prompt", "prompt", "policy", "policy", "tool", "policy", "policy"]
POLICY = np.array([k == "policy" for k in KINDS])
# The training policy's log-probs: the prompt and the tool output scored too (-9, -11, -14).
LOGP = [-9.0, -11.0, -0.5, -1.0, -14.0, -3.0, -2.0]
# The rollout engine's: placeholders on the prompt (0.0, NaN) and the tool output (0.0), and
# nothing on policy token 5 (NaN), which it never scored. Scored on both sides: tokens 2, 3, 6,
# with logp - rollout = -0.25, 0, +0.5.
ROLLOUT = [0.0, NAN, -0.25, -1.0, 0.0, NAN, -2.5]
ADV = [0.0, 0.0, 1.0, 1.0, 0.0, -1.0, 1.0]


def test_only_the_tokens_both_engines_scored_are_compared():
    logp, roll = np.array(LOGP), np.array(ROLLOUT)
    assert mismatch.scored(POLICY, logp, roll).tolist() == [False, False, True, True, False, False, True]
    assert mismatch.log_ratio(POLICY, logp, roll).tolist() == [-0.25, 0.0, 0.5]
    # Compared everywhere the placeholders would say -9, -14 nats (and NaN).
    assert (logp - roll)[[0, 4]].tolist() == [-9.0, -14.0]
    # For a loss: finite values unchanged, an unscored position at ratio 1.
    lp, rlp = mismatch.comparable(logp, roll)
    assert lp.tolist() == LOGP
    assert rlp.tolist() == [0.0, -11.0, -0.25, -1.0, 0.0, -3.0, -2.5]


def test_the_search_field_max_ratio_skips_placeholders():
    row = {
        "kinds": np.array([{"prompt": 0, "policy": 1, "tool": 2}[k] for k in KINDS], dtype=np.uint8),
        "logprobs": np.array(LOGP),
        "rollout_logprobs": np.array(ROLLOUT),
    }
    # The largest log-ratio over tokens 2, 3, 6 is +0.5 (not NaN, not a placeholder's).
    assert episode_fields(row).max_ratio == math.exp(0.5)


def test_the_loss_metrics_see_ratio_1_where_nothing_was_scored():
    # Bypass PPO (ratio r = exp(logp - rollout), eps 0.2): token 2 r = e^-0.25 = 0.78 with A > 0
    # kept; token 3 r = 1; token 5 not scored: r = 1, kept (as a 0.0 placeholder it would be
    # e^-3 = 0.05 with A < 0: clipped, and masked by IcePop); token 6 r = e^0.5 = 1.65 > 1.2 with
    # A > 0: clipped. |A| on policy tokens 4 -> clipped 1/4. IcePop [0.5, 2]: 0.78 and 1.65 are
    # inside -> nothing masked.
    adv, logp, roll = np.array(ADV), np.array(LOGP), np.array(ROLLOUT)
    one = lv.episode_removed(adv, POLICY, logp, roll)
    assert (one.abs_advantage, one.abs_clipped, one.abs_masked) == (4.0, 1.0, 0.0)
    (blocked,) = lv.episodes_removed([(adv, POLICY, logp, roll)])
    assert blocked == one  # the padded-block path agrees bit for bit


def test_a_step_with_placeholders_kept_in_meta():
    """A format that kept the rollout log-probs in ``meta`` with nulls where nothing was scored
    (the upload's own arrays are checked finite): the step's metrics compare tokens 2, 3, 6 only."""
    ep = EpisodeIn(
        tokens=[f"t{i}" for i in range(7)],
        kinds=KINDS,
        reward=1.0,
        advantages=ADV,
        logprobs=LOGP,
        meta={"rollout_logprobs": [None if math.isnan(x) else x for x in ROLLOUT]},
    )
    step = compute_step([(None, ep)], settings=None, keep=None, step=0, new_slug=lambda: "s0")
    m = step.metrics
    # (-0.25 + 0 + 0.5) / 3; the largest |log-ratio| 0.5 (not 14).
    assert m["mean_log_ratio"] == pytest.approx(0.25 / 3)
    assert m["max_abs_log_ratio"] == 0.5
    assert m["clip_fraction"] == pytest.approx(1 / 4) and m["masked_fraction"] == 0.0


def test_zero_placeholders_on_masked_tokens_through_the_api(client):
    """0.0 where the rollout engine scored nothing (prompt, tool output), as trainers write it:
    the step's metrics, the search field and the batch loss view compare policy tokens only."""
    ep = {
        "tokens": [f"t{i}" for i in range(6)],
        "kinds": ["prompt", "prompt", "policy", "policy", "tool", "policy"],
        "reward": 1.0,
        "advantages": [0.0, 0.0, 1.0, 1.0, 0.0, 1.0],
        "logprobs": [-9.0, -11.0, -0.5, -1.0, -14.0, -2.0],
        "rollout_logprobs": [0.0, 0.0, -0.25, -1.0, 0.0, -2.5],
    }
    run = client.post("/api/runs", json={"name": "placeholders"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", content=jsonl([ep]))
    assert r.status_code == 201, r.text
    steps = client.get(f"/api/runs/{run['id']}").json()["steps"]
    m = steps[0]["metrics"]
    # Policy tokens 2, 3, 5: logp - rollout = -0.25, 0, +0.5 (the placeholders would add -9,
    # -11 and -14).
    assert m["mean_log_ratio"] == pytest.approx(0.25 / 3)
    assert m["max_abs_log_ratio"] == 0.5
    # Bypass PPO: only token 5 (r = e^0.5 > 1.2, A = 1) clips: 1 of |A| 3. IcePop: none masked.
    assert m["clip_fraction"] == pytest.approx(1 / 3) and m["masked_fraction"] == 0.0
    (found,) = client.get(f"/api/runs/{run['id']}/episodes").json()
    assert found["max_ratio"] == pytest.approx(math.exp(0.5))
    loss = client.get(f"/api/batches/{r.json()['batch_id']}/loss", params={"bypass": "true"}).json()
    assert loss["clipped_share"] == pytest.approx(1 / 3) and loss["masked_share"] == 0.0


def test_nan_and_null_placeholders_on_masked_tokens_are_not_scored(client):
    """NaN and null where a trainer scored nothing (prompt, tool output) are accepted as "not
    scored": stored as 0.0, counted in ``meta.not_scored``, never compared."""
    ep = {
        "tokens": [f"t{i}" for i in range(6)],
        "kinds": ["prompt", "prompt", "policy", "policy", "tool", "policy"],
        "reward": 1.0,
        "advantages": [0.0, 0.0, 1.0, 1.0, 0.0, 1.0],
        "logprobs": [None, -11.0, -0.5, -1.0, NAN, -2.0],
        "rollout_logprobs": [NAN, None, -0.25, -1.0, NAN, -2.5],
    }
    run = client.post("/api/runs", json={"name": "nan placeholders"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", content=jsonl([ep]))  # NaN as JSON's `NaN`
    assert r.status_code == 201, r.text
    m = client.get(f"/api/runs/{run['id']}").json()["steps"][0]["metrics"]
    # Policy tokens 2, 3, 5 only, as with 0.0 placeholders: -0.25, 0, +0.5.
    assert m["mean_log_ratio"] == pytest.approx(0.25 / 3)
    assert m["max_abs_log_ratio"] == 0.5
    assert m["clip_fraction"] == pytest.approx(1 / 3) and m["masked_fraction"] == 0.0
    stored = client.get(f"/api/episodes/{r.json()['episodes'][0]['slug']}").json()
    assert stored["rollout_logprobs"] == [0.0, 0.0, -0.25, -1.0, 0.0, -2.5]
    assert stored["logprobs"] == [0.0, -11.0, -0.5, -1.0, 0.0, -2.0]
    assert stored["meta"]["not_scored"] == {"logprobs": 2, "rollout_logprobs": 3}


@pytest.mark.parametrize("value", [NAN, None])
def test_a_placeholder_on_a_policy_token_is_refused(client, value):
    ep = {
        "tokens": ["a", "b", "c"],
        "kinds": ["prompt", "policy", "policy"],
        "reward": 1.0,
        "logprobs": [-1.0, -0.5, -0.25],
        "rollout_logprobs": [NAN, -0.5, value],  # the prompt's NaN is fine, token 2 is trained
    }
    r = client.post("/api/uploads", content=jsonl([ep, ep]))
    err = r.json()["error"]
    assert r.status_code == 422 and err["code"] == "not_finite"
    assert (err["field"], err["episode"], err["line"]) == ("rollout_logprobs", 1, 1)
    assert "at token 2" in err["message"]
    assert row_counts(client) == (0, 0)  # nothing stored


def test_a_miles_dashboard_file_with_zero_placeholders(client):
    """miles' dashboard columns (radixark/miles ``save_dashboard_columns``; the sample of
    fixtures/formats/miles_parquet with a training-side ``log_probs`` column added): the engine's
    ``rollout_log_probs`` are 0.0 on the loss-masked observation (miles#2476), where the trainer
    scored -12 and -13. Compared there they would be 12 and 13 nats of mismatch; they are not."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {
        "sample_index": 1,
        "response_length": 6,
        "total_length": 9,
        "tokens": [1, 5, 6, 30, 31, 40, 41, 32, 2],
        "loss_mask": [1, 1, 0, 0, 1, 1],
        "rollout_log_probs": [-1.0, -0.5, 0.0, 0.0, -0.25, -0.0625],
        "log_probs": [-1.5, -0.5, -12.0, -13.0, -0.25, -0.5625],
        "reward": 1.0,
    }
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([row]), buf)
    run = client.post("/api/runs", json={"name": "miles"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", files={"file": ("rollout_3.parquet", buf.getvalue())})
    assert r.status_code == 201, r.text
    m = client.get(f"/api/runs/{run['id']}").json()["steps"][0]["metrics"]
    # Trained tokens 30, 31, 32, 2: log_probs - rollout = -0.5, 0, 0, -0.5 -> mean -0.25, max 0.5.
    assert m["mean_log_ratio"] == pytest.approx(-0.25)
    assert m["max_abs_log_ratio"] == pytest.approx(0.5)
