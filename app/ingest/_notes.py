"""What an upload's answer says besides its episodes, and what a file that holds no episodes is.

**Warnings** (:func:`warn`, :func:`collecting`): a reader notes what it did that the user should
know (a role it kept as prompt, rewards it could not find and the keys it looked at, records it
skipped); the upload route collects them for the upload and puts them in its 201 answer under
``warnings``. Outside :func:`collecting` a warning goes nowhere.

**Not episodes** (:func:`describe`): a file that is something else — a trainer's metrics log, an
evaluation summary, an error report, an event stream — gets a sentence that says what it looks
like instead of a list of its first keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_CURRENT: ContextVar[dict[str, int] | None] = ContextVar("creditlens_upload_warnings", default=None)


@contextmanager
def collecting() -> Iterator[list[str]]:
    """Collect the warnings of the code run inside; the list is filled when the block ends (each
    warning once, with how many times it was given when more than once)."""
    seen: dict[str, int] = {}
    token = _CURRENT.set(seen)
    out: list[str] = []
    try:
        yield out
    finally:
        _CURRENT.reset(token)
        out.extend(w if n == 1 else f"{w} ({n} times)" for w, n in seen.items())


def warn(message: str) -> None:
    """Note ``message`` for the answer of the upload being read (no-op outside :func:`collecting`)."""
    seen = _CURRENT.get()
    if seen is not None:
        seen[message] = seen.get(message, 0) + 1


def unknown_roles(counts: dict[str, int]) -> None:
    """Warn about roles outside the role table (app/ingest/_roles.py), with their message counts."""
    for role, n in sorted(counts.items()):
        warn(
            f"role `{role}` is not in the role table ({n} message{'s' if n != 1 else ''}); kept as "
            "prompt (shown, given no credit)."
        )


# ---- files that are not episodes -----------------------------------------------------------------

METRIC_CONTAINERS = ("data", "metrics", "scalars", "logs")
SUMMARY_NAMES = (
    "accuracy",
    "avg_reward",
    "mean_reward",
    "correct_count",
    "total_count",
    "num_examples",
    "final accuracy",
    "pass@1",
    "total_samples",
    "completed_samples",
)
_ERROR_KEYS = frozenset({"detail", "error", "errors", "exception", "traceback"})


def _numbers(d: dict[str, Any]) -> list[str]:
    return [k for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _keys(names: list[str], k: int = 4) -> str:
    return ", ".join(f"`{n}`" for n in names[:k]) + (", …" if len(names) > k else "")


def metrics_log(first: Any) -> list[str] | None:
    """The metric names when ``first`` is a line of a training metrics log (a ``step`` and numeric
    metrics, at the top or under ``data``/``metrics``), else None."""
    if not isinstance(first, dict):
        return None
    step = first.get("step", first.get("global_step", first.get("_step")))
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    nums = [k for k in _numbers(first) if k not in ("step", "global_step", "_step")]
    for key in METRIC_CONTAINERS:
        inner = first.get(key)
        if isinstance(inner, dict):
            nums += _numbers(inner)
    return nums if len(nums) >= 2 else None


# Metric name prefixes that name the trainer whose logger wrote them.
TRAINER_PREFIXES = (
    (("actor/", "critic/", "timing_s/"), "verl"),
    (("train/", "eval/"), "TRL / transformers"),
    (("rollout/", "perf/"), "slime"),
)


def trainer_named(metrics: list[str]) -> str | None:
    """The trainer whose logger names metrics as ``metrics`` are named, when the names say."""
    for prefixes, name in TRAINER_PREFIXES:
        if any(m.startswith(prefixes) for m in metrics):
            return name
    return None


def _trainer_of(metrics: list[str]) -> str:
    name = trainer_named(metrics)
    return f" (metric names as {name} logs them)" if name else ""


# Where a metrics log goes instead (app/ingest/_metrics_logs.py reads it there).
ATTACH_HINT = (
    "upload it to a run with `POST /api/runs/{id}/logged-metrics` or `creditlens log-metrics RUN "
    "FILE`: the run page draws it beside the metrics creditlens computes"
)


def describe(first: Any, n_lines: int | None = None) -> str | None:
    """A sentence saying what a file whose first record is ``first`` looks like, when that is
    not an episode; None when it may be one."""
    lines = f"{n_lines} line{'s' if n_lines != 1 else ''} of " if n_lines else ""
    metrics = metrics_log(first)
    if metrics is not None:
        trainer = _trainer_of(metrics)
        return (
            f"this looks like a training metrics log{trainer}: {lines}`step` and numeric metrics "
            f"({_keys(metrics)}), not episodes: {ATTACH_HINT}. For credit per token, upload the "
            "trainer's rollout or trajectory dump, or log each step with its episodes "
            "(`POST /api/runs/{id}/steps/{step}`)."
        )
    if isinstance(first, dict):
        low = {k.lower(): k for k in first}
        summary = [low[n] for n in SUMMARY_NAMES if n in low]
        nested = [k for k, v in first.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if summary and not nested:
            return (
                "this looks like an evaluation summary (aggregate scores: "
                + ", ".join(f"`{k}` = {first[k]!r}" for k in summary[:3])
                + "), not episodes. Upload the per-sample results file written beside it (its "
                "lines hold each sample's messages and score)."
            )
        if first and set(first) <= _ERROR_KEYS:
            key = next(iter(first))
            return f"the first record is an error report (`{key}`: {str(first[key])[:120]}), not an episode."
    if isinstance(first, list) and len(first) >= 2 and isinstance(first[0], str):
        return (
            f"each record is a [name, payload] event tuple (the first is `{first[0][:60]}`): a "
            "session's event stream, not a transcript. Export the session's messages (role and "
            "content per message) and upload those, or map its fields with `mapping=`."
        )
    if isinstance(first, str):
        return f"the first record is a bare string ({first[:80]!r}), not an episode."
    return None


def is_error_record(obj: Any) -> bool:
    """True for a line that reports an error instead of holding an episode (a ``{"detail": …}``
    validation error, an ``{"error": …}``, or a bare string)."""
    return isinstance(obj, str) or (isinstance(obj, dict) and bool(obj) and set(obj) <= _ERROR_KEYS)
