"""Which episodes a run step keeps (app/compute/retention.py) and the search fields computed before
(app/compute/episode_fields.py): hand-made steps whose answer is worked out in the comments."""

from __future__ import annotations

import numpy as np

from app.compute.episode_fields import EpisodeFields, add_findings, episode_fields
from app.compute.retention import choose


def step(n_groups: int, size: int):
    labels = [f"g{i // size}" for i in range(n_groups * size)]
    return labels, [False] * len(labels), [0.1] * len(labels), [0.5] * len(labels)


def groups_of(labels, kept):
    return sorted({labels[i] for i in kept})


def test_everything_is_kept_when_it_fits():
    labels, flagged, adv, rew = step(2, 4)
    assert choose(labels, flagged, adv, rew, keep=8) == list(range(8))


def test_flagged_groups_first_then_largest_adv_and_reward_extremes_then_random():
    labels, flagged, adv, rew = step(10, 4)  # 10 groups of 4; keep 16 = 4 groups
    flagged[4 * 7 + 2] = True  # g7 flagged
    adv[4 * 3] = 5.0  # g3 has the largest |A|
    rew[4 * 5 + 1] = 9.0  # g5 the highest reward
    rew[4 * 8 + 3] = -9.0  # g8 the lowest
    kept = choose(labels, flagged, adv, rew, keep=16, seed=3)
    # g7 (4) then, in turn, g3, g5 (8 more: 12 = 3/4 of 16); the last 4 at random.
    assert {"g7", "g3", "g5"} <= set(groups_of(labels, kept))
    assert len(kept) == 16 and len(groups_of(labels, kept)) == 4
    # Whole groups only, in upload order.
    assert kept == sorted(kept)
    assert all(sum(labels[i] == g for i in kept) == 4 for g in groups_of(labels, kept))
    # The random part depends on the seed only: the same step keeps the same episodes.
    assert choose(labels, flagged, adv, rew, keep=16, seed=3) == kept


def test_a_group_that_does_not_fit_is_passed_over():
    labels = ["a"] * 6 + ["b"] * 2 + ["c"] * 2
    kept = choose(labels, [True] + [False] * 9, [1.0] * 10, [0.0] * 10, keep=4)
    assert groups_of(labels, kept) == ["b", "c"]  # a (flagged, 6) does not fit in 4


def test_a_step_is_never_stored_empty():
    labels = ["a"] * 6 + ["b"] * 6
    adv = [0.1] * 6 + [3.0] * 6
    kept = choose(labels, [False] * 12, adv, [0.0] * 12, keep=4)
    assert groups_of(labels, kept) == ["b"]  # larger than keep, but the first choice: whole


def test_ungrouped_episodes_are_groups_of_their_own():
    labels = [None] * 10
    kept = choose(labels, [False] * 10, [float(i) for i in range(10)], [0.0] * 10, keep=3)
    assert len(kept) == 3 and 9 in kept  # the largest |A| first


def test_episode_fields_by_hand():
    kinds = np.array([0, 0, 1, 1, 2, 1], dtype=np.uint8)  # prompt prompt policy policy tool policy
    row = {
        "kinds": kinds,
        "advantages": np.array([0.5, 0.0, -2.0, 1.0, 0.5, 0.0]),
        "logprobs": np.array([0.0, 0.0, -1.0, -0.5, 0.0, -2.0]),
        "rollout_logprobs": np.array([0.0, 0.0, -1.5, -0.5, 0.0, -1.0]),
        "entropy": np.array([9.0, 9.0, 1.0, 2.0, 9.0, 3.0]),
    }
    f = episode_fields(row)
    assert f.n_tool_tokens == 1
    assert f.max_abs_adv == 2.0
    # |A| total 4.0; off policy 0.5 (prompt) + 0.5 (tool) = 1.0.
    assert f.nonpolicy_abs_adv_share == 0.25 and f.flagged
    # logp - rollout on policy tokens: 0.5, 0, -1: the largest ratio is e^0.5.
    assert f.max_ratio == float(np.exp(0.5))
    assert f.mean_entropy == 2.0  # (1 + 2 + 3) / 3
    bare = episode_fields({"kinds": kinds})
    assert (bare.max_abs_adv, bare.max_ratio, bare.mean_entropy, bare.flagged) == (None, None, None, False)


def test_findings_are_counted_on_the_episodes_they_name():
    fields = [EpisodeFields(0, 0.0, 0.0, None, None) for _ in range(4)]
    add_findings(
        fields,
        [
            {"code": "credit_on_prompt", "severity": "error", "episodes": [0, 2]},
            {"code": "scale_mismatch", "severity": "warning", "episodes": [2]},
            # An error about 3 of the 4 episodes is about the step: it counts, but flags none.
            {"code": "mismatch_unexplained", "severity": "error", "episodes": [1, 2, 3]},
        ],
    )
    assert [(f.n_findings, f.finding_codes, f.flagged) for f in fields] == [
        (1, "credit_on_prompt", True),
        (1, "mismatch_unexplained", False),
        (3, "credit_on_prompt scale_mismatch mismatch_unexplained", True),
        (1, "mismatch_unexplained", False),
    ]
