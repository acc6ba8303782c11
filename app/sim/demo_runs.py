"""Two short training runs from the built-in simulator, for the demo data (``creditlens serve --demo``,
``make run``): a newcomer's first screen has a run's timeline, its prompt history, its episode
search and a comparison to look at.

Both runs train the same BugFix agent (app/sim/policy.py) over :data:`STEPS` steps: at step ``s``
the policy's knobs are :func:`policy_at` of its progress, a skill that rises and a reward hack
(``hardcode_tests``) that fades, so the pass rate climbs. Each step samples
:data:`N_TASKS` tasks × :data:`N_PER_TASK` attempts (groups of the same task: the same prompt
every step, so each prompt has a history) and carries the trainer's GRPO advantages
(estimators.groups.grpo: score minus the group's mean over its sample std + 1e-6) on the policy
tokens.

The second run has a credit bug switched on for steps :data:`BUG_STEPS`: the advantages are
written on every response token, tool output included (the loss mask forgotten), and while it is
on the policy stops improving. The audit names it on those steps (credit on non-policy tokens),
retention keeps the flagged groups, and the comparison shows where the runs part.

Deterministic: every step's sample is seeded by (run, step). Fast: tens of small episodes per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from sqlmodel import Session, select

from app.core.schemas import EpisodeIn
from app.core.settings import Settings
from app.sim.env import sample_batch
from app.sim.policy import PolicyParams
from app.storage.models import Run
from app.storage.runs import create_run
from app.storage.store import create_batch_streaming
from estimators.groups import grpo

STEPS = 40
N_TASKS = 6
N_PER_TASK = 6
KEEP = 24  # of the 36 episodes of a step: the batch page says "24 of 36 kept"
BUG_STEPS = range(18, 24)
SEED = 24


@dataclass(frozen=True)
class DemoRun:
    """One demo run: its name, its config (shown on its page), the seed of its samples, and the
    steps on which its credit bug is on (empty: none)."""

    name: str
    seed: int
    bug_steps: range

    @property
    def config(self) -> dict[str, Any]:
        return {
            "env": "bugfix (built-in simulator)",
            "estimator": "grpo",
            "steps": STEPS,
            "tasks_per_step": N_TASKS,
            "attempts_per_task": N_PER_TASK,
            "credit_bug": (
                f"advantages on tool tokens, steps {self.bug_steps.start}-{self.bug_steps.stop - 1}"
                if self.bug_steps
                else None
            ),
            "demo": True,
        }


RUNS = (
    DemoRun("demo: bugfix grpo", SEED, range(0)),
    DemoRun("demo: bugfix grpo, tool-token credit bug", SEED + 1, BUG_STEPS),
)


def progress_at(step: int, bug_steps: range) -> float:
    """How far training has got at ``step`` (0 to 1): one unit per step, none while a credit bug
    is on (the update pushes tool tokens the policy never wrote)."""
    learned = sum(1 for s in range(step) if s not in bug_steps)
    return learned / (STEPS - 1)


def policy_at(progress: float) -> PolicyParams:
    """The policy after ``progress`` of the run: skill, reading and testing up, the hack down."""
    p = progress
    return PolicyParams(
        skill_shift=-1.5 + 3.0 * p,
        read_propensity=-2.5 + 2.0 * p,
        test_propensity=-2.0 + 1.5 * p,
        exploit_propensity=-0.5 - 3.0 * p,
    )


def step_episodes(run: DemoRun, step: int) -> list[EpisodeIn]:
    """The episodes of ``run``'s ``step``, with the trainer's advantages (see the module docstring)."""
    episodes = sample_batch(
        N_TASKS,
        N_PER_TASK,
        seed=run.seed * 1000 + step,
        policy=policy_at(progress_at(step, run.bug_steps)),
        source="demo",
    )
    scores = torch.tensor([e.reward for e in episodes], dtype=torch.float64)
    adv = grpo(scores, [e.group for e in episodes]).tolist()
    bug = step in run.bug_steps
    out = []
    for e, a in zip(episodes, adv, strict=True):
        a = round(a, 6)
        per_token = [a if k == "policy" or (bug and k == "tool") else 0.0 for k in e.kinds]
        out.append(e.model_copy(update={"advantages": per_token}))
    return out


def load_demo_runs(session: Session, settings: Settings | None = None) -> list[int]:
    """Store the demo runs when the database has no run yet; returns their ids (none stored: [])."""
    if session.exec(select(Run.id).limit(1)).first() is not None:
        return []
    ids = []
    for demo in RUNS:
        run, _token = create_run(session, demo.name, demo.config, keep=KEEP)
        assert run.id is not None
        for step in range(STEPS):
            create_batch_streaming(
                session,
                ((None, e) for e in step_episodes(demo, step)),
                name=f"{demo.name} step {step}",
                source="demo",
                settings=settings,
                run_id=run.id,
                step=step,
                visibility=run.visibility,
                keep=KEEP,
            )
        ids.append(run.id)
    return ids
