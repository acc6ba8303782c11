"""Searching a run's kept episodes: ``GET /api/runs/{id}/episodes?sort=&limit=&offset=&FIELD__OP=v``.

The fields are stored at ingest in the narrow ``episode_search`` table (app/storage/models.py;
computed by app/compute/episode_fields.py; ``step``, ``group``, ``reward``, ``passed`` and
``n_tokens`` copied from the episode), so a search is one indexed query that never reads an
episode's arrays. Operators: ``eq``, ``ne``, ``gt``, ``lt`` on numbers; ``eq``, ``ne``,
``contains`` on texts (``group``); ``eq``, ``ne`` on ``passed``; ``findings`` is the number of
audit findings naming the episode for ``eq``/``ne``/``gt``/``lt`` and sorting, and its finding
codes for ``contains``. ``FIELD=value`` means ``FIELD__eq=value``. Every parameter that is not
understood is a 422 naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Mapped
from sqlmodel import Session, col

from app.core.errors import ApiError
from app.storage.models import SEARCH_NUMBERS, Batch, EpisodeSearch
from app.storage.store import LIKE_ESCAPE, like_escape

NUMBER_OPS = ("eq", "ne", "gt", "lt")
TEXT_OPS = ("eq", "ne", "contains")
LIMIT_DEFAULT = 50
LIMIT_MAX = 500
RESERVED = ("sort", "limit", "offset")


@dataclass(frozen=True)
class Field:
    column: Mapped[Any]
    kind: str  # int | float | bool | text | findings
    ops: tuple[str, ...]


FIELDS: dict[str, Field] = {
    "step": Field(col(EpisodeSearch.step), "int", NUMBER_OPS),
    "group": Field(col(EpisodeSearch.group), "text", TEXT_OPS),
    "reward": Field(col(EpisodeSearch.reward), "float", NUMBER_OPS),
    "passed": Field(col(EpisodeSearch.passed), "bool", ("eq", "ne")),
    "n_tokens": Field(col(EpisodeSearch.n_tokens), "int", NUMBER_OPS),
    "n_tool_tokens": Field(col(EpisodeSearch.n_tool_tokens), "int", NUMBER_OPS),
    "max_abs_adv": Field(col(EpisodeSearch.max_abs_adv), "float", NUMBER_OPS),
    "nonpolicy_abs_adv_share": Field(col(EpisodeSearch.nonpolicy_abs_adv_share), "float", NUMBER_OPS),
    "max_ratio": Field(col(EpisodeSearch.max_ratio), "float", NUMBER_OPS),
    "mean_entropy": Field(col(EpisodeSearch.mean_entropy), "float", NUMBER_OPS),
    "findings": Field(col(EpisodeSearch.n_findings), "findings", (*NUMBER_OPS, "contains")),
}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(422, "bad_search", message, field=param)


def _value(param: str, field: Field, op: str, raw: str) -> Any:
    kind = "text" if field.kind == "findings" and op == "contains" else field.kind
    kind = "int" if kind == "findings" else kind
    try:
        if kind == "int":
            v: Any = int(raw)
            if not -(2**63) <= v < 2**63:
                raise ValueError
            return v
        if kind == "float":
            v = float(raw)
            if not math.isfinite(v):
                raise ValueError
            return v
        if kind == "bool":
            return {"true": True, "1": True, "false": False, "0": False}[raw.lower()]
    except (ValueError, KeyError):
        want = {"int": "an integer", "float": "a finite number", "bool": "true or false"}[kind]
        raise _bad(param, f"parameter `{param}` needs {want}; got {raw!r}.") from None
    if "\x00" in raw:
        raise _bad(param, f"parameter `{param}` holds a NUL character.")
    return raw


def _condition(param: str, raw: str) -> ColumnElement[bool]:
    name, _, op = param.partition("__")
    op = op or "eq"
    field = FIELDS.get(name)
    if field is None:
        raise _bad(
            param,
            f"unknown search parameter `{param}`: use FIELD__OP=value with a field of "
            f"{', '.join(FIELDS)} (or sort, limit, offset).",
        )
    if op not in field.ops:
        raise _bad(param, f"parameter `{param}`: field `{name}` takes the operators {', '.join(field.ops)}.")
    value = _value(param, field, op, raw)
    column = (
        col(EpisodeSearch.finding_codes) if field.kind == "findings" and op == "contains" else field.column
    )
    if op == "contains":
        return func.lower(column).like("%" + like_escape(value.lower()) + "%", escape=LIKE_ESCAPE)
    # The comparisons are SQL expressions (sqlalchemy's operators), typed Any through Mapped.
    cond: ColumnElement[bool]
    if op == "eq":
        cond = column == value
    elif op == "ne":  # NULL (no such data) is not equal to a value either
        cond = (column != value) | column.is_(None)
    else:
        cond = column > value if op == "gt" else column < value
    return cond


def _order(sort: str | None) -> list[ColumnElement[Any] | Mapped[Any]]:
    if not sort:
        return [col(EpisodeSearch.step), col(EpisodeSearch.position)]
    name = sort[1:] if sort.startswith("-") else sort
    field = FIELDS.get(name)
    if field is None:
        raise _bad(
            "sort", f"parameter `sort` must be a field or -field of {', '.join(FIELDS)}; got {sort!r}."
        )
    c = field.column
    # Episodes without the value last, in both directions and on every database.
    return [c.is_(None), c.desc() if sort.startswith("-") else c.asc(), col(EpisodeSearch.episode_id)]


def _int_param(params: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = lo - 1
    if not lo <= v <= hi:
        raise _bad(name, f"parameter `{name}` must be an integer from {lo} to {hi}; got {raw!r}.")
    return v


@dataclass
class SearchPage:
    rows: list[dict[str, Any]]
    total: int
    limit: int
    offset: int


COLUMNS = (
    "slug",
    "step",
    "batch_id",
    "group",
    *SEARCH_NUMBERS,
    "finding_codes",
)


def search(session: Session, run_id: int, params: list[tuple[str, str]]) -> SearchPage:
    """One page of the run's kept episodes matching every filter in ``params`` (the query string's
    pairs), sorted; ApiError 422 naming the first parameter that is not understood."""
    seen: dict[str, str] = {}
    conditions = [col(EpisodeSearch.run_id) == run_id]
    for name, raw in params:
        if name in RESERVED:
            if name in seen:
                raise _bad(name, f"parameter `{name}` is given twice.")
            seen[name] = raw
            continue
        conditions.append(_condition(name, raw))
    limit = _int_param(seen, "limit", LIMIT_DEFAULT, 1, LIMIT_MAX)
    offset = _int_param(seen, "offset", 0, 0, 2**31 - 1)
    order = _order(seen.get("sort"))
    where = and_(*conditions)
    total = session.execute(select(func.count()).select_from(EpisodeSearch).where(where)).scalar_one()
    # The page's ids first (sorted and skipped over the narrow index entries: a deep page does not
    # read the rows it skips), then those rows, then their batches' refs: a join before the sort
    # and the limit would look up the batch of every matching episode.
    page_ids = [
        i
        for (i,) in session.execute(
            select(col(EpisodeSearch.episode_id)).where(where).order_by(*order).offset(offset).limit(limit)
        ).all()
    ]
    by_id = {
        r[0]: r[1:]
        for r in session.execute(
            select(col(EpisodeSearch.episode_id), *(col(getattr(EpisodeSearch, c)) for c in COLUMNS)).where(
                col(EpisodeSearch.episode_id).in_(page_ids)
            )
        ).all()
    }
    rows = [dict(zip(COLUMNS, by_id[i], strict=True)) for i in page_ids if i in by_id]
    batch_ids = sorted({r["batch_id"] for r in rows})
    refs = {
        b: (slug if visibility == "unlisted" and slug else b)
        for b, visibility, slug in session.execute(
            select(col(Batch.id), col(Batch.visibility), col(Batch.slug)).where(col(Batch.id).in_(batch_ids))
        ).all()
    }
    for row in rows:
        row["batch_ref"] = refs.get(row["batch_id"], row["batch_id"])
        codes = row.pop("finding_codes")
        row["findings"] = codes.split() if codes else []
    return SearchPage(rows=rows, total=int(total), limit=limit, offset=offset)
