"""`python -m app.sim.make_fixtures` (= `make fixtures`): regenerate fixtures/demo/, deterministically.

Writes (native JSONL, one episode per line; `load_demo` stores each file as one batch named by its
stem):
  handbuilt.jsonl  a hand-built three-call row with made-up values (numbers checked by hand in
                   tests/sim/test_sim_fixtures.py);
  bugfix.jsonl     20 BugFix tasks x 8 attempts from the default policy, with true turn values and
                   the values of a critic fitted on the batch (so token/turn GAE rows mean something);
  bugfix.meta.json the sampler's diagnostics for bugfix.jsonl (critic explained variance etc.).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from app.core.resources import demo_dir
from app.core.schemas import EpisodeIn
from app.sim.service import SampleRequest, run_sample

DEMO_DIR = demo_dir()
# Seed 8 gives the batch shape the demo is built around: 6 of 20 groups (30% of episodes) have zero variance,
# all of them all-fail, and about 30% of the positive outcome credit lands on useless calls.
DEMO_SEED = 8


def handbuilt_episode() -> EpisodeIn:
    """A hand-built row: three calls of two, two and one tokens, tool spans of three and two
    tokens, a cost of 0.1 on the last token of each call and an outcome of 1 at the end.

    Returns at gamma = 1: position 9: -0.1 + 1 = 0.9; positions 5-6: -0.1 + 0.9 = 0.8; positions
    0-1: -0.1 + 0.8 = 0.7 at the first call. At gamma = 0.9, position 5 gets
    0.9 * (-0.1 + 0.9 * 0.9) = 0.639 and position 1 gets -0.1 + 0.9 * 0.639 = 0.475.

    Values: V(c1) = 0.4, V(c5) = 0.6 and garbage 9 at tool positions; V(c6) = 0.7 makes the naive
    recursion give 8.2 at position 6 (-0.1 + 9 - 0.7), and 8.5 at position 1 is -0.1 + 9 - 0.4.
    V(c0) = 0.3 and V(c9) = 0.8 are free choices.
    """
    tokens = ["read", "limit.py", "def", "limit", ":", "edit", "swap_minmax", "tests", "pass", "submit"]
    kinds = ["policy", "policy", "tool", "tool", "tool", "policy", "policy", "tool", "tool", "policy"]
    return EpisodeIn(
        tokens=tokens,
        kinds=kinds,
        reward=1.0,
        rewards=[0.0, -0.1, 0.0, 0.0, 0.0, 0.0, -0.1, 0.0, 0.0, -0.1],
        values=[0.3, 0.4, 9.0, 9.0, 9.0, 0.6, 0.7, 9.0, 9.0, 0.8],
        group="handbuilt",
        meta={
            "task": "handbuilt",
            "source": "demo",
            "note": "Hand-built row; values are made up, 9 at tool positions is "
            "deliberate garbage that a masked recursion must ignore.",
            "calls": [
                {"turn": 0, "action": "read limit.py", "effect": "read"},
                {"turn": 1, "action": "edit swap_minmax", "effect": "decisive_edit"},
                {"turn": 2, "action": "submit", "effect": "submit"},
            ],
        },
    )


def _line(ep: EpisodeIn) -> str:
    return json.dumps(ep.model_dump(exclude_none=True), separators=(",", ":"), ensure_ascii=False)


def write_fixtures(folder: Path = DEMO_DIR, seed: int = DEMO_SEED, verbose: bool = True) -> dict[str, Any]:
    """Write the demo files into `folder`; returns the BugFix batch's diagnostics."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "handbuilt.jsonl").write_text(_line(handbuilt_episode()) + "\n")
    result = run_sample(SampleRequest(n_tasks=20, n_per_task=8, seed=seed, critic=True))
    episodes = [e.model_copy(update={"meta": {**e.meta, "source": "demo"}}) for e in result.episodes]
    (folder / "bugfix.jsonl").write_text("".join(_line(e) + "\n" for e in episodes))
    (folder / "bugfix.meta.json").write_text(json.dumps(result.meta, indent=1, sort_keys=True) + "\n")
    d = result.diagnostics
    if verbose:
        c = d.get("critic", {})
        print(
            f"wrote {folder}: handbuilt.jsonl, bugfix.jsonl ({len(episodes)} episodes, pass rate {d['pass_rate']:.2f}, "
            f"zero-variance share {d['zero_variance_share']:.2f}, useless credit share {d['useless_credit_share']:.2f}, "
            f"critic EV train {c.get('explained_variance_train')} fresh {c.get('explained_variance_fresh')})"
        )
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEMO_DIR, help="folder to write (default fixtures/demo)")
    ap.add_argument("--seed", type=int, default=DEMO_SEED)
    args = ap.parse_args(argv)
    write_fixtures(args.out, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
