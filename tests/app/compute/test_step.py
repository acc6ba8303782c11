"""What a batch and a run step store, computed before any write (app/compute/step.py): a hand-made
step of four episodes whose numbers are worked out in the comments, with no database."""

from __future__ import annotations

import itertools

import pytest

from app.compute.step import compute_step, prepare_batch, prepared_rows
from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.core.settings import Settings

KINDS = ["prompt", "prompt", "policy", "policy", "policy"]


def episode(reward: float, group: str, adv: float, prompt_adv: float = 0.0) -> EpisodeIn:
    """Five tokens: two prompt tokens ("a b", the same prompt in every episode), three policy
    tokens with advantage ``adv``; ``prompt_adv`` on the first prompt token."""
    return EpisodeIn(
        tokens=["a", "b", "c", "d", "e"],
        kinds=KINDS,
        reward=reward,
        group=group,
        advantages=[prompt_adv, 0.0, adv, adv, adv],
    )


# Two groups of two, RLOO advantages (+1 for the pass, -1 for the fail); the last episode also
# puts 0.5 on a prompt token: an error finding, and the step's only flagged episode.
STEP = [
    episode(1.0, "g0", 1.0),
    episode(0.0, "g0", -1.0),
    episode(1.0, "g1", 1.0),
    episode(0.0, "g1", -1.0, prompt_adv=0.5),
]


def slugs():
    counter = itertools.count()
    return lambda: f"s{next(counter)}"


def test_a_step_is_computed_over_every_episode_and_stored_for_the_kept_ones():
    step = compute_step(((None, e) for e in STEP), settings=None, keep=2, step=7, new_slug=slugs())
    batch = step.batch
    assert (len(batch.rows), batch.slugs, batch.n_seen) == (4, ["s0", "s1", "s2", "s3"], 4)
    # keep=2: the flagged group first (g1, 2 episodes), which fills it.
    assert batch.kept == [2, 3]
    # The metrics describe all four: pass rate 2/4; |A| on policy tokens 4 x 3 x 1 = 12, off
    # them 0.5, so the share off policy is 0.5 / 12.5 = 0.04; one error finding.
    m = step.metrics
    assert (m["n_episodes"], m["pass_rate"], m["mean_abs_advantage"]) == (4, 0.5, 1.0)
    assert m["nonpolicy_advantage_share"] == pytest.approx(0.04)
    assert m["audit_errors"] == 1
    # Search fields of the kept ones only, in kept order: episode 3 has 0.5 of its 3.5 |A| off
    # policy (1/7) and the finding.
    assert [f.nonpolicy_abs_adv_share for f in step.fields] == [0.0, pytest.approx(1 / 7)]
    assert [(f.n_findings, f.finding_codes, f.flagged) for f in step.fields] == [
        (0, "", False),
        (1, "credit_on_non_policy_tokens", True),
    ]
    # The audit as the stored batch sees it: episode 3 of the step is episode 1 of the batch.
    assert step.audit is not None and len(step.audit.refs) == 2 and step.audit.n_errors == 1
    (finding,) = step.audit.body["findings"]
    assert (finding["episodes"], finding["tokens"], finding["slugs"]) == ([1], [[1, 0]], ["s3"])
    assert finding["n_episodes_seen"] == 1
    # One prompt ("a b") over all four episodes, two of them kept; sum |A| on policy tokens 12.
    (prompt,) = step.prompts
    assert (prompt.prompt, prompt.n, prompt.n_passed, prompt.n_kept, prompt.sum_abs_adv) == (
        "a b",
        4,
        2,
        2,
        12.0,
    )
    # The diagnostics describe all four too, by slug.
    assert batch.diagnostics is not None and batch.diagnostics["pass_rate"] == 0.5
    assert [e["slug"] for e in batch.diagnostics["whiten_vs_center"]["episodes"]] == batch.slugs


def test_an_upload_keeps_every_episode_and_has_its_diagnostics():
    batch = prepare_batch(((i, e) for i, e in enumerate(STEP, 1)), settings=None, new_slug=slugs())
    assert batch.kept == [0, 1, 2, 3] and batch.n_seen == 4
    assert batch.diagnostics is not None
    assert [g["group"] for g in batch.diagnostics["groups"]] == ["g0", "g1"]
    assert [g["mean_reward"] for g in batch.diagnostics["groups"]] == [0.5, 0.5]


def test_too_many_or_no_episodes_is_refused_before_anything_is_computed():
    with pytest.raises(ApiError) as e:
        prepared_rows(((None, x) for x in STEP), Settings(max_episodes_per_upload=3))
    assert (e.value.status, e.value.code) == (413, "too_many_episodes")
    assert "the upload has 4 episodes; the limit is 3" in e.value.message
    with pytest.raises(ApiError) as e:
        prepared_rows(iter([]), None)
    assert (e.value.status, e.value.code) == (422, "empty_upload")
