"""The token-level episode generator: BugFix attempts as real token sequences.

An episode is: prompt tokens (task statement, tool list), then for each call the policy tokens
`<call> KIND [OP] </call>` followed by a tool observation span `<obs> ... </obs>` built from the
task's real code and tests (file excerpts, diffs, test output with the values the code returns).
The last call is `submit` (no observation after it), or the recording is cut after `max_calls`
calls (truncated; bootstrap_value = the true value of the state at the cut).

Rewards: the outcome (1 if the bug is fixed at submit, i.e. the hidden tests pass) goes to the
episode's `reward` (placed on the last policy token by the store); the optional `call_cost` is a
per-token reward of -call_cost on the last token (`</call>`) of every call, in `rewards`.

Wrong edits are shown as the diff they make but are modelled as harmless to the outcome: the
latent state (policy.State) tracks only whether the planted bug is fixed.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from app.core.schemas import EpisodeIn, Kind
from app.sim.policy import FAIL, KINDS, PASS, UNKNOWN, PolicyParams, State, kind_probs, transition
from app.sim.tasks import OPS, TASKS, Task, run_tests
from app.sim.truth import exact_values, mc_turn_values, sample_call

_TOKEN_RE = re.compile(r"</?\w+>|\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Deterministic split into tags (`<call>`), words and single punctuation characters."""
    return _TOKEN_RE.findall(text)


# --- observations ---------------------------------------------------------------------------

_SWAPS = {
    "swap_minmax": [("max", "min"), ("min", "max")],
    "flip_comparison": [("<=", ">="), (">=", "<="), ("<", ">"), (">", "<")],
    "wrong_operator": [(" + ", " - "), (" - ", " + "), (" * ", " / "), (" / ", " * ")],
}


def mutate(line: str, op: str) -> str | None:
    """What edit `op` does to one source line (None if it finds nothing to change)."""
    if op in _SWAPS:
        # Swap every occurrence at once through placeholders, so max/min both flip.
        hits = [(a, b) for a, b in _SWAPS[op] if a in line]
        if not hits:
            return None
        a, b = hits[0]
        return (
            line.replace(a, "\0").replace(b, a).replace("\0", b)
            if (b, a) in _SWAPS[op]
            else line.replace(a, b)
        )
    if op == "off_by_one":
        if "range(" in line or "len(" in line or "[" in line:
            new = re.sub(r"(len\(\w+\)|\bn\b)", r"\1 - 1", line, count=1)
            return None if new == line else new
        return None
    if op == "wrong_constant":
        m = re.search(r"\b(\d+)\b", line)
        return None if m is None else line[: m.start()] + str(int(m.group(1)) + 1) + line[m.end() :]
    if op == "swap_args":
        m = re.search(r"(\w+)\((\w+), (\w+)\)", line)
        return (
            None
            if m is None
            else line[: m.start()] + f"{m.group(1)}({m.group(3)}, {m.group(2)})" + line[m.end() :]
        )
    raise ValueError(op)


def _body_lines(task: Task) -> list[str]:
    return [ln for ln in task.source.splitlines() if ln.startswith("    ") and '"""' not in ln]


@lru_cache(maxsize=256)
def _test_report(task_name: str, fixed: bool, hacked: bool) -> tuple[tuple[str, object, bool], ...]:
    """(call, returned value or error, passed) for each visible test of the current code."""
    task = _by_name(task_name)
    src = _hacked(task, fixed) if hacked else (task.fixed_source if fixed else task.source)
    ns: dict[str, Any] = {}
    exec(compile(src, "<task>", "exec"), ns)  # noqa: S102 - our own task code
    out = []
    passed = run_tests(src, task.visible)
    for (call, _expected), ok in zip(task.visible, passed, strict=True):
        try:
            got = eval(call, ns)  # noqa: S307
        except Exception as e:  # shown as the test's output
            got = type(e).__name__
        out.append((call, got, ok))
    return tuple(out)


def _hacked(task: Task, fixed: bool) -> str:
    src = task.hardcoded_source()
    return src.replace(task.old, task.new, 1) if fixed else src


def _by_name(name: str) -> Task:
    for t in TASKS:
        if t.name == name:
            return t
    raise KeyError(name)


def observation(task: Task, before: State, call: str, rng: random.Random) -> str:
    """The tool's response to `call` made in latent state `before` (text; tokenised by the caller)."""
    kind, _, op = call.partition(" ")
    if kind == "read":
        src = task.fixed_source if before.fixed else task.source
        lines = [f"{i + 1} | {ln}" for i, ln in enumerate(src.splitlines()) if ln.strip()]
        text = f"<obs> {task.filename} ( {len(lines)} lines ) : " + " ".join(lines)
        if rng.random() < 0.5:  # sometimes the agent's read also pulls in the visible test file
            tests = " ".join(f"assert {c} == {e!r}" for c, e in task.visible)
            text += f" tests/test_{task.name}.py : {tests}"
        return text + " </obs>"
    if kind == "edit":
        if op == task.bug and before.fixed:
            return f"<obs> no change : {op} already applied to {task.filename} </obs>"
        if op == task.bug:
            lineno = next(i for i, ln in enumerate(task.source.splitlines()) if task.old in ln) + 1
            old = task.source.splitlines()[lineno - 1].strip()
            return f"<obs> applied {op} to {task.filename} line {lineno} : - {old} + {old.replace(task.old, task.new)} </obs>"
        for ln in _body_lines(task):
            new = mutate(ln, op)
            if new is not None and new != ln:
                lineno = task.source.splitlines().index(ln) + 1
                return f"<obs> applied {op} to {task.filename} line {lineno} : - {ln.strip()} + {new.strip()} </obs>"
        return f"<obs> no change : {op} found nothing to change in {task.filename} </obs>"
    if kind == "test":
        report = _test_report(task.name, before.fixed, before.hacked)
        parts = [f"<obs> running {len(report)} visible tests"]
        for i, (c, got, ok) in enumerate(report):
            parts.append(f"test_{i + 1} {c} PASSED" if ok else f"test_{i + 1} {c} FAILED : got {got!r}")
        n_ok = sum(ok for _, _, ok in report)
        parts.append(f"{n_ok} passed , {len(report) - n_ok} failed </obs>")
        return " ".join(parts)
    if kind == "hardcode_tests":
        cases = " ".join(f"if args == ( {c[c.index('(') + 1 : -1]} ) : return {e!r}" for c, e in task.visible)
        return (
            f"<obs> patched {task.filename} : special-cased {len(task.visible)} test inputs : {cases} </obs>"
        )
    raise ValueError(call)


def prompt_text(task: Task) -> str:
    """The task statement and tool list the episode starts with."""
    return (
        f"<task> Fix the bug in {task.filename} . {task.summary} "
        f"Visible tests : tests/test_{task.name}.py . Hidden tests decide the reward . </task> "
        f"<tools> read edit test hardcode_tests submit </tools> <ops> {' '.join(OPS)} </ops>"
    )


# --- sampling -------------------------------------------------------------------------------


def _call_tokens(call: str) -> list[str]:
    return ["<call>", *call.split(" "), "</call>"]


@dataclass
class _Attempt:
    """One attempt of :func:`sample_group` while it is being sampled."""

    tokens: list[str]
    kinds: list[Kind]
    rewards: list[float]
    logprobs: list[float]
    calls: list[dict[str, Any]] = field(default_factory=list)
    turn_values: list[float] = field(default_factory=list)
    state: State = field(default_factory=State)
    done: bool = False
    outcome: float = 0.0


def sample_group(
    task: Task,
    params: PolicyParams,
    n: int,
    rng: random.Random,
    *,
    call_cost: float = 0.0,
    max_calls: int = 8,
    source: str = "sample:bugfix",
) -> list[EpisodeIn]:
    """`n` attempts at `task`, sampled in lockstep (one call per live attempt per round).

    Each episode's meta: task, bug, calls ([{turn, action, effect}]), turn_values (true V at the
    start of each turn), source, attempt.
    """
    values = exact_values(task, params, call_cost)
    prompt = tokenize(prompt_text(task))
    eps = [
        _Attempt(list(prompt), ["prompt"] * len(prompt), [0.0] * len(prompt), [0.0] * len(prompt))
        for _ in range(n)
    ]
    for turn in range(max_calls):
        for ep in eps:
            if ep.done:
                continue
            state = ep.state
            call, p = sample_call(params, task, state, rng)
            step = transition(task, state, call)
            ep.turn_values.append(round(values[state], 6))
            ep.calls.append({"turn": turn, "action": call, "effect": step.effect})
            toks = _call_tokens(call)
            # The decisions are the kind token and the op token: log pi(kind) and log pi(op | edit);
            # "<call>" and "</call>" are forced (log-prob 0).
            lp = [0.0] * len(toks)
            if len(toks) == 4:
                p_kind = kind_probs(params, state.located, state.known)[KINDS.index("edit")]
                lp[1], lp[2] = math.log(p_kind), math.log(p / p_kind)
            else:
                lp[1] = math.log(p)
            ep.tokens += toks
            ep.kinds += ["policy"] * len(toks)
            ep.rewards += [0.0] * (len(toks) - 1) + [-call_cost]
            ep.logprobs += lp
            if step.done:
                ep.done = True
                ep.outcome = step.outcome
            else:
                obs = tokenize(observation(task, state, call, rng))
                ep.tokens += obs
                ep.kinds += ["tool"] * len(obs)
                ep.rewards += [0.0] * len(obs)
                ep.logprobs += [0.0] * len(obs)
            ep.state = step.next_state
        if all(ep.done for ep in eps):
            break
    out = []
    for j, ep in enumerate(eps):
        truncated = not ep.done
        out.append(
            EpisodeIn(
                tokens=ep.tokens,
                kinds=ep.kinds,
                reward=ep.outcome,
                rewards=ep.rewards if call_cost else None,
                logprobs=[round(x, 6) for x in ep.logprobs],
                group=task.name,
                truncated=truncated,
                bootstrap_value=round(values[ep.state], 6) if truncated else None,
                meta={
                    "task": task.name,
                    "bug": task.bug,
                    "calls": ep.calls,
                    "turn_values": ep.turn_values,
                    "source": source,
                    "attempt": j,
                },
            )
        )
    return out


def episode_states(task: Task, episode: EpisodeIn) -> list[State]:
    """Replay meta.calls through the dynamics: the latent state at the start of each turn."""
    state = State()
    states = []
    for c in episode.meta["calls"]:
        states.append(state)
        state = transition(task, state, c["action"]).next_state
    return states


def with_mc_turn_values(
    episodes: list[EpisodeIn], params: PolicyParams, n_rollouts: int, *, seed: int = 0, call_cost: float = 0.0
) -> list[EpisodeIn]:
    """Replace meta.turn_values by Monte Carlo estimates (VinePPO style: `n_rollouts` continuations
    of the policy from each turn's latent state); the exact values move to meta.turn_values_exact.
    A truncated episode's bootstrap_value becomes the MC estimate of its final state too."""
    out = []
    for i, e in enumerate(episodes):
        task = _by_name(e.meta["task"])
        states = episode_states(task, e)
        mc = mc_turn_values(task, params, states, n_rollouts, seed=seed * 100_003 + i, call_cost=call_cost)
        update: dict[str, Any] = {
            "meta": {
                **e.meta,
                "turn_values": [round(x, 6) for x in mc],
                "turn_values_exact": e.meta["turn_values"],
                "n_rollouts": n_rollouts,
            }
        }
        if e.truncated:
            last = transition(task, states[-1], e.meta["calls"][-1]["action"]).next_state
            boot = mc_turn_values(
                task, params, [last], n_rollouts, seed=seed * 100_003 + i + 7, call_cost=call_cost
            )
            update["bootstrap_value"] = round(boot[0], 6)
        out.append(e.model_copy(update=update))
    return out


def sample_batch(
    n_tasks: int = 20,
    n_per_task: int = 8,
    seed: int = 0,
    policy: PolicyParams | dict[str, float] | None = None,
    *,
    call_cost: float = 0.0,
    max_calls: int = 8,
    source: str = "sample:bugfix",
    progress: Callable[[float], None] | None = None,
) -> list[EpisodeIn]:
    """`n_per_task` attempts at each of the first `n_tasks` tasks; groups are consecutive.

    Deterministic: each group draws from its own random.Random seeded by (seed, task name), so a
    group does not change when n_tasks does.
    """
    params = policy if isinstance(policy, PolicyParams) else PolicyParams.from_dict(policy)
    if not 1 <= n_tasks <= len(TASKS):
        raise ValueError(f"n_tasks must be between 1 and {len(TASKS)}")
    out: list[EpisodeIn] = []
    for i, task in enumerate(TASKS[:n_tasks]):
        rng = random.Random(f"bugfix:{seed}:{task.name}")
        out += sample_group(
            task, params, n_per_task, rng, call_cost=call_cost, max_calls=max_calls, source=source
        )
        if progress:
            progress((i + 1) / n_tasks)
    return out


__all__ = [
    "FAIL",
    "PASS",
    "UNKNOWN",
    "episode_states",
    "mutate",
    "observation",
    "prompt_text",
    "sample_batch",
    "sample_group",
    "tokenize",
    "with_mc_turn_values",
]
