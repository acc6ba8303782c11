"""Talk mode: a guided tour of where per-token credit comes from, on the demo data, one URL per step.

Each step is text (rendered server-side, autoescaped) plus a `view` the browser resolves against
the JSON API (static/talk.js): demo episodes are found by batch name through ``/api/batches?q=``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core import urls

# Demo batch names (fixtures/demo/<stem>.jsonl); the first that exists wins.
HANDBUILT = ["handbuilt"]
BUGFIX = ["bugfix", "demo"]


@dataclass(frozen=True)
class Step:
    """One talk step. view: {"type": "text" | "strip" | "group" | "batch", ...} for talk.js."""

    title: str
    paragraphs: list[str]
    view: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    links: list[tuple[str, str]] = field(default_factory=list)


STEPS: list[Step] = [
    Step(
        "Which tokens got the credit?",
        [
            "A multi-turn agent episode is one token sequence: the prompt, the policy's calls, and the tools' answers.",
            "Policy-gradient training multiplies every policy token's log-probability by one number, its advantage. "
            "This tour shows where those numbers come from, and where they go wrong.",
            "Arrow keys, PageUp/PageDown or space step through; every step has its own URL.",
        ],
    ),
    Step(
        "Returns on the hand-built row",
        [
            "Three calls of two, two and one tokens, separated by tool spans of three and two tokens; "
            "a cost of 0.1 on the last token of each call and an outcome of 1 at the end.",
            "Rewards live on the policy token that earned them, and time advances only on policy tokens. "
            "With γ = 1 the first call's return is −0.1 − 0.1 + 0.9 = 0.7. Tool cells carry nothing: "
            "the running sum is carried across them unchanged.",
        ],
        {"type": "strip", "batch": HANDBUILT, "schemes": ["returns"], "gamma": 1.0, "lam": 0.95},
    ),
    Step(
        "Discount once per policy token",
        [
            "With γ = 0.9 the return at position 1 is −0.1 + 0.9 × 0.639 = 0.475: the discount is applied once "
            "across the three tool positions, not four times.",
            "A recursion that stepped through tool positions would make the effective horizon depend on how verbose the tools were.",
        ],
        {"type": "strip", "batch": HANDBUILT, "schemes": ["returns"], "gamma": 0.9, "lam": 0.95},
    ),
    Step(
        "The naive-GAE tool-span bug",
        [
            "Same row, made-up critic values that are deliberately huge (9) at the tool positions. GAE with λ = 0 is the TD error.",
            "Masked recursion, position 1: −0.1 + V(c5) − V(c1) = −0.1 + 0.6 − 0.4 = 0.1. "
            "A naive recursion steps into the tool span: −0.1 + 9 − 0.4 = 8.5, and 8.2 at the end of the second call.",
            "Real critics are not 9 at tool positions; they are untrained numbers that look plausible, "
            "so the bug changes training without crashing it.",
        ],
        {"type": "strip", "batch": HANDBUILT, "schemes": ["td"], "gamma": 1.0, "lam": 0.0, "naive": True},
    ),
    Step(
        "Group baselines and std normalisation",
        [
            "Critic-free methods compare attempts at the same task: each attempt's advantage is its reward minus the group's baseline.",
            "GRPO also divides by the group's standard deviation. With the sample std, a group with one success in eight "
            "is scaled by 2.83 and a group with four by 1.87: the rare success is pushed hardest.",
        ],
        {"type": "group", "batch": BUGFIX, "pick": "mixed"},
    ),
    Step(
        "Zero-variance groups carry no gradient",
        [
            "When all attempts fail, or all pass, every advantage in the group is exactly zero.",
            "The chart counts them on the demo batch below: each hatched bar is a group that gives no gradient at all.",
        ],
        {"type": "batch", "batch": BUGFIX, "figure": "zero_variance"},
    ),
    Step(
        "Batch whitening vs group centering",
        [
            "Whitening across the batch compares an attempt with attempts at other tasks: failures on never-solved tasks are "
            "pushed down although no better attempt exists; group centering gives them exactly 0.",
            "Successes on easy tasks get more under batch whitening than under group centering: the chart below shows both "
            "for every episode of the demo batch.",
        ],
        {"type": "batch", "batch": BUGFIX, "figure": "whiten_vs_center"},
    ),
    Step(
        "Turn-level credit",
        [
            "One successful episode of the demo batch under three schemes. The outcome row is uniform: every call, whatever it "
            "did, gets the same credit.",
            "The critic-based rows differ from call to call. Token-level GAE also varies inside a call, mostly noise; "
            "turn-level GAE removes that by construction.",
        ],
        {
            "type": "strip",
            "batch": BUGFIX,
            "pick": "success",
            "schemes": ["outcome", "token_gae", "turn_gae"],
            "gamma": 1.0,
            "lam": 0.95,
        },
    ),
    Step(
        "Why critics struggle",
        [
            "A critic must infer from tokens alone whether an edit fixed the bug, which depends on hidden tests it never sees. "
            "Below, the TD row uses the demo's learned critic and the oracle row the simulator's true values: where they part, "
            "the critic was wrong about what a call did.",
            "So the critic-based rows can give the decisive edit little credit. λ converts critic error into variance: "
            "the λ lab shows the trade-off on an MDP with exact values.",
        ],
        {
            "type": "strip",
            "batch": BUGFIX,
            "pick": "success",
            "schemes": ["td", "turn_gae", "oracle"],
            "gamma": 1.0,
            "lam": 0.0,
        },
        [(urls.lab("lambda"), "Open the λ lab")],
    ),
    Step(
        "Now look at your own episodes",
        [
            "Upload a batch (native JSONL or your trainer's dump) on the home page; every view is a link you can share.",
        ],
        links=[(urls.HOME, "Home and upload")],
    ),
]


def step_or_none(n: int) -> Step | None:
    """Step ``n`` (1-based) or None."""
    return STEPS[n - 1] if 1 <= n <= len(STEPS) else None
