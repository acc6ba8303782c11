"""A trainer's own metrics log, read as {step: {metric: number}} to attach to a run.

Not an episode format (it is not in ``FORMATS``): a metrics log holds no episodes, only the numbers
a trainer wrote per step. ``POST /api/runs/{id}/logged-metrics`` reads one with :func:`read` and
stores what it returns beside the run's own metrics.

Shapes read (JSON, JSONL or a JSON array; gzip of any of them):

* verl's file logger (``trainer.logger=file``): one line per step, ``{"step": N, "data":
  {metric: value}}``;
* prime-rl's file monitor (``metrics.jsonl``): ``{"step": N, "time": wall, **metrics}``;
* TRL / transformers' ``trainer_state.json``: its ``log_history`` list, each entry with its
  ``step`` (train and eval entries of one step are merged);
* a Weights & Biases history export (``wandb-history.jsonl``, ``run.scan_history()`` dumped as
  JSONL): ``{"_step": N, metric: value, "_runtime": .., "_timestamp": ..}``;
* any line of a step (``step``, ``global_step``, ``_step``, ``train/global_step``) with numeric
  metrics at its top, under ``data``/``metrics``/``scalars``/``logs``, or nested (flattened as
  ``outer/inner``).

Values that are not finite numbers (text, true/false, null, lists, W&B media objects, NaN,
infinities) are skipped and counted; wall-clock keys (``time``, ``timestamp``, ``_timestamp``,
``_runtime``, ``_wandb``) are not metrics. Records of one step are merged, a later value winning. A
line that is not JSON is a 422 naming it; a file with no record of a step is a 422 saying what it
looks like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import ApiError
from app.ingest import _notes
from app.ingest._containers import gunzip, is_gzip
from app.ingest._document import Document
from app.ingest._structure import item_shape, plan_of

STEP_KEYS = ("step", "global_step", "_step", "train/global_step", "trainer/global_step")
# Containers whose entries are metrics without a prefix (verl's ``data``).
CONTAINERS = _notes.METRIC_CONTAINERS
# Keys that are the time of the line, not a metric.
WALL_CLOCK = frozenset({"time", "timestamp", "_timestamp", "_runtime", "_wandb", "wall_time"})
MAX_STEP = 2**31 - 1
MAX_NAME = 200  # longer metric names are skipped (counted): a key that long is data, not a name
MAX_DEPTH = 4  # nested objects flattened this deep


@dataclass
class MetricsLog:
    """A metrics log as read: per step its metrics, and what was left out."""

    steps: dict[int, dict[str, float]]
    shape: str  # what the file is ("verl file logger", "TRL trainer_state.json", ...)
    trainer: str | None  # the trainer the shape or the metric names point to, when they do
    n_records: int = 0  # records read (lines, log_history entries)
    records_without_step: int = 0  # records with no step (skipped)
    skipped: dict[str, int] = field(default_factory=dict)  # metric -> values skipped (not numbers)

    @property
    def names(self) -> list[str]:
        """The metric names in the order the steps first name them."""
        return list(dict.fromkeys(n for m in self.steps.values() for n in m))

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


def _step_of(rec: dict[str, Any]) -> int | None:
    for key in STEP_KEYS:
        v = rec.get(key)
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, int) and 0 <= v <= MAX_STEP:
            return v
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _collect(
    obj: dict[str, Any], prefix: str, out: dict[str, float], skipped: dict[str, int], depth: int
) -> None:
    """The numbers of ``obj`` into ``out`` (names prefixed), what is not a number into ``skipped``."""
    for key, v in obj.items():
        name = f"{prefix}{key}"
        if not prefix and (key in STEP_KEYS or key in WALL_CLOCK):
            continue
        if _is_number(v):
            if len(name) <= MAX_NAME:
                out[name] = float(v)
                continue
        elif isinstance(v, dict) and depth < MAX_DEPTH and "_type" not in v:  # "_type": W&B media
            inner = "" if not prefix and key in CONTAINERS else f"{name}/"
            _collect(v, inner, out, skipped, depth + 1)
            continue
        skipped[name[:MAX_NAME]] = skipped.get(name[:MAX_NAME], 0) + 1


def _records(doc: Document) -> tuple[list[Any], str | None]:
    """Every record (a bad JSON line: 422 ``bad_json`` naming it), with the shape the container
    says (a ``trainer_state.json``'s ``log_history``)."""
    out: list[Any] = []
    shape = None
    for rec in doc.records():
        obj = rec.obj
        if isinstance(obj, dict) and isinstance(obj.get("log_history"), list):
            shape = "TRL / transformers trainer_state.json (log_history)"
            out.extend(obj["log_history"])
        else:
            out.append(obj)
    return out, shape


def _shape_of(first: dict[str, Any], metrics: list[str]) -> tuple[str, str | None]:
    """What kind of log a record of ``first``'s keys is, and the trainer it points to."""
    if isinstance(first.get("data"), dict) and "step" in first:
        trainer = "verl"
        return "verl file logger (one {step, data} line per step)", trainer
    if "_step" in first:
        return "Weights & Biases history export", _notes.trainer_named(metrics)
    if "step" in first and "time" in first:
        return "prime-rl file monitor (metrics.jsonl)", "prime-rl"
    return "JSON lines of step records", _notes.trainer_named(metrics)


def read(data: bytes) -> MetricsLog:
    """The metrics log of an upload's bytes (module docstring); ApiError 422 when it is none."""
    if is_gzip(data):
        data = gunzip(data)
    doc = Document.of(data)
    if not doc.data.strip():
        raise ApiError(422, "empty_upload", "the file is empty; nothing was stored.")
    if doc.is_zip:
        raise ApiError(
            422,
            "not_a_metrics_log",
            "this is a zip archive, not a metrics log: upload the trainer's metrics file itself "
            "(JSONL, JSON or its gzip); nothing was stored.",
        )
    records, shape = _records(doc)
    steps: dict[int, dict[str, float]] = {}
    skipped: dict[str, int] = {}
    without = 0
    first: dict[str, Any] | None = None
    for obj in records:
        step = _step_of(obj) if isinstance(obj, dict) else None
        if step is None:
            without += 1
            continue
        assert isinstance(obj, dict)
        first = first if first is not None else obj
        _collect(obj, "", steps.setdefault(step, {}), skipped, 0)
    if first is None:
        raise ApiError(422, "not_a_metrics_log", _not_a_log(records))
    log = MetricsLog(
        steps={s: m for s, m in sorted(steps.items()) if m},
        shape="",
        trainer=None,
        n_records=len(records),
        records_without_step=without,
        skipped=skipped,
    )
    if not log.steps:
        raise ApiError(
            422,
            "not_a_metrics_log",
            f"{len(steps)} records have a step but no numeric metric (values skipped: "
            + ", ".join(f"`{k}`" for k in list(skipped)[:5])
            + "); nothing was stored.",
        )
    found_shape, log.trainer = _shape_of(first, log.names)
    log.shape = shape or found_shape
    if shape is not None:
        log.trainer = "TRL / transformers"
    return log


def _not_a_log(records: list[Any]) -> str:
    first = records[0] if records else None
    what = _notes.describe(first) if first is not None else None
    if what is None and first is not None and (plan_of(first) is not None or item_shape(first) is not None):
        what = (
            "it holds transcripts: post them as a step of the run "
            "(`POST /api/runs/{id}/steps/{step}`) or upload them (`POST /api/uploads`)."
        )
    looks = f" The first record: {what[:1].lower()}{what[1:]}" if what else ""
    return (
        "no record of a training step found (a metrics log has a `step`, `global_step` or `_step` "
        f"per line, with numeric metrics); nothing was stored.{looks}"
    )
