"""The episode store's queries: store a batch all-or-nothing, read it back, delete it.

What a batch or a run step stores is computed before the write by app/compute/step.py; this
module writes it in one transaction. Validation lives in app/core/validate.py, the byte codecs in
app/storage/codecs.py, the domain rules (score, pass, groups) in app/core/domain.py. Public API (pinned by the contracts): :func:`create_batch`,
:func:`get_episode`, :func:`episode_or_404`, :func:`get_batch`, :func:`list_batches`,
:func:`episode_to_native`, :func:`load_demo`, :func:`delete_episode`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import CursorResult, func, insert, or_
from sqlalchemy import delete as sa_delete
from sqlalchemy.orm.exc import ObjectDeletedError, StaleDataError
from sqlmodel import Session, col, select

from app.compute.episode_fields import EpisodeFields
from app.compute.prompts import PromptStep
from app.compute.step import Item, KeptAudit, PreparedBatch, RunStep, compute_step, prepare_batch, too_many
from app.core import urls
from app.core.arrays import json_dumps, pack_row
from app.core.errors import ApiError, not_found
from app.core.packing import pack
from app.core.resources import demo_dir
from app.core.schemas import EpisodeIn
from app.core.settings import Settings
from app.core.trainers import trainer_options
from app.core.validate import text_column
from app.storage.audit_models import BatchAudit, EpisodeAudit
from app.storage.db import writing
from app.storage.models import Batch, BatchStats, Episode, EpisodeSearch, Run, saved_id
from app.storage.prompt_models import PromptStepRow, RunPrompt

# A row a URL can name by id or slug.
T = TypeVar("T", Batch, Run)


class CreatedEpisode(BaseModel):
    id: int
    slug: str
    url: str


class CreatedBatch(BaseModel):
    batch_id: int
    episodes: list[CreatedEpisode]
    delete_token: str
    # Where the batch is read: its page and API URLs (by slug when unlisted, by id when public).
    visibility: str = "public"
    url: str = ""
    api_url: str = ""
    n_episodes_seen: int = 0  # before retention (a run step's keep)


PUBLIC = "public"
UNLISTED = "unlisted"
VISIBILITIES = (PUBLIC, UNLISTED)


def batch_ref(b: Batch) -> int | str:
    """What a batch's URLs carry: its slug when unlisted (its id answers 404), else its id."""
    return b.slug if b.visibility == UNLISTED and b.slug else saved_id(b)


def row_by_ref(session: Session, model: type[T], ref: int | str) -> T | None:
    """The batch or run (``model``) a URL names: a public one by its integer id, any one by its
    slug. An unlisted one's id names nothing (None), so sequential ids never reveal it."""
    ref = str(ref)
    if ref.isascii() and ref.isdigit():
        row = row_by_id(session, model, int(ref)) if len(ref) < 20 else None
        return row if row is not None and row.visibility == PUBLIC else None
    if not ref or len(ref) > 64:
        return None
    return session.exec(select(model).where(col(model.slug) == ref)).first()


def row_by_ref_or_404(session: Session, model: type[T], ref: int | str, what: str) -> T:
    """:func:`row_by_ref`, or ApiError 404 naming ``what`` ("Batch 7"): the same answer for
    "unlisted" and "no such row"."""
    row = row_by_ref(session, model, ref)
    if row is None:
        raise not_found(f"{what} {ref}")
    return row


def row_by_id(session: Session, model: type[T], row_id: int) -> T | None:
    """The row of ``model`` with this id, or None. Ids are positive 64-bit integers; anything else
    (e.g. /b/9223372036854775808) cannot exist, and SQLite would raise OverflowError (a 500) on
    binding it."""
    if not 0 < row_id < 2**63:
        return None
    return session.get(model, row_id)


def batch_by_ref(session: Session, ref: int | str) -> Batch | None:
    """:func:`row_by_ref` for batches."""
    return row_by_ref(session, Batch, ref)


def batch_by_ref_or_404(session: Session, ref: int | str) -> Batch:
    """:func:`batch_by_ref`, or ApiError 404 (the same answer for "unlisted" and "no such batch")."""
    return row_by_ref_or_404(session, Batch, ref, "Batch")


def new_slug() -> str:
    """An unguessable share slug: 144 random bits, URL-safe (24 characters)."""
    return secrets.token_urlsafe(18)


def hash_token(token: str) -> str:
    """sha256 hex of a delete token (only the hash is stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_batch(
    session: Session,
    episodes: list[EpisodeIn],
    *,
    name: str,
    source: str,
    meta: dict[str, Any] | None = None,
    lines: list[int | None] | None = None,
    settings: Settings | None = None,
    visibility: str = PUBLIC,
) -> CreatedBatch:
    """Validate every episode, then store the batch and its episodes in one transaction.

    ``lines``: the file line of each episode, for error messages. Returns the new ids, slugs and
    URLs, and the batch's delete token (shown once; only its hash is stored)."""
    if settings is not None and len(episodes) > settings.max_episodes_per_upload:
        raise too_many(len(episodes), settings)
    items: Iterable[Item] = zip(lines if lines else [None] * len(episodes), episodes, strict=True)
    return create_batch_streaming(
        session, items, name=name, source=source, meta=meta, settings=settings, visibility=visibility
    )


def create_batch_streaming(
    session: Session,
    items: Iterable[Item],
    *,
    name: str,
    source: str,
    meta: dict[str, Any] | None = None,
    settings: Settings | None = None,
    run_id: int | None = None,
    step: int | None = None,
    visibility: str = PUBLIC,
    keep: int | None = None,
) -> CreatedBatch:
    """:func:`create_batch` over ``(line, episode)`` pairs produced lazily (uploads): what the batch
    stores is computed as they stream in (app/compute/step.py), then written in one transaction.
    Nothing is written until every episode passed.

    ``run_id``/``step``: the batch is that step of that run, stored with what
    :func:`app.compute.step.compute_step` computed over every episode (metrics, audit, search
    fields, prompt history) and, in full, the episodes ``keep`` (the run's) chose. A step the run
    already has raises sqlalchemy's IntegrityError (the unique constraint decides, also between
    concurrent posts)."""
    batch = Batch(
        name=text_column(name) or "",
        source=source,
        meta_json=json_dumps(meta or {}),
        slug=new_slug(),
        visibility=visibility,
        run_id=run_id,
        step=step,
    )
    if run_id is None:
        return _write(session, batch, prepare_batch(items, settings=settings, new_slug=new_slug))
    trainer, options = trainer_options(meta or {})
    computed = compute_step(
        items,
        settings=settings,
        keep=keep,
        step=step or 0,
        new_slug=new_slug,
        trainer=trainer,
        options=options,
    )
    batch.metrics_json = json_dumps(computed.metrics)
    batch.n_episodes_seen = computed.batch.n_seen
    return _write(session, batch, computed.batch, computed)


def _packed_rows(prepared: PreparedBatch) -> tuple[list[dict[str, Any]], int]:
    """The kept rows as ``episode`` inserts (slug and position added, arrays packed:
    app/core/arrays.py pack_row) and the bytes they take. Consumes ``prepared.rows``: each row's
    arrays are let go once it is packed, so the write never holds a second copy of the batch."""
    queue = deque((i, prepared.rows[i]) for i in prepared.kept)
    prepared.rows.clear()
    out: list[dict[str, Any]] = []
    size = 0
    while queue:
        i, row = queue.popleft()
        packed: dict[str, Any] = {**row, "slug": prepared.slugs[i], "position": i}
        size += pack_row(packed)
        out.append(packed)
    return out, size


def _write(
    session: Session, batch: Batch, prepared: PreparedBatch, step: RunStep | None = None
) -> CreatedBatch:
    """Write ``batch`` with the kept episodes of ``prepared`` and its diagnostics in one
    transaction; a run ``step`` adds its audit, prompt history and search rows. Everything was
    computed before the write turn, which holds only the inserts."""
    delete_token = secrets.token_urlsafe(24)
    audit = None if step is None else step.audit
    rows, stored = _packed_rows(prepared)
    refs = [] if audit is None else [pack(r.astype("<f8")) for r in audit.refs]
    batch.n_episodes = len(rows)
    batch.stored_bytes = stored + sum(map(len, refs))
    batch.delete_token_hash = hash_token(delete_token)
    slugs = [row["slug"] for row in rows]
    with writing(session):
        try:
            session.add(batch)
            session.flush()
            batch_id = saved_id(batch)
            for row in rows:
                row["batch_id"] = batch_id
            # One executemany: far faster than ORM objects for thousands of rows.
            session.execute(insert(Episode), rows)
            # The batch's diagnostics, stored once with it: the batch API only reads them.
            if prepared.diagnostics is not None:
                session.add(
                    BatchStats(
                        batch_id=batch_id,
                        n_episodes=len(rows),
                        diagnostics_json=json_dumps(prepared.diagnostics),
                    )
                )
            found = session.execute(select(Episode.slug, Episode.id).where(Episode.batch_id == batch_id))
            ids: dict[str, int] = {slug: i for slug, i in found.all()}
            if step is not None:
                if audit is not None:
                    _insert_audit(session, batch_id, audit, [ids[s] for s in slugs], refs)
                if step.prompts:
                    _insert_prompts(session, batch, step.prompts)
                _insert_search(session, batch, rows, step.fields, ids)
            session.commit()
        except Exception:
            session.rollback()
            raise
    ref = batch_ref(batch)
    return CreatedBatch(
        batch_id=batch_id,
        episodes=[CreatedEpisode(id=ids[s], slug=s, url=urls.episode(s)) for s in slugs],
        delete_token=delete_token,
        visibility=batch.visibility,
        url=urls.batch(ref),
        api_url=urls.api_batch(ref),
        n_episodes_seen=prepared.n_seen,
    )


def _insert_audit(
    session: Session, batch_id: int, audit: KeptAudit, ids: list[int], refs: list[bytes]
) -> None:
    """The step's audit rows (app/storage/audit_models.py), in the batch's transaction."""
    session.execute(
        insert(BatchAudit),
        [
            {
                "batch_id": batch_id,
                "n_episodes": len(ids),
                "n_errors": audit.n_errors,
                "searched": audit.body["searched"],
                "result_json": json_dumps(audit.body),
                "seconds": audit.seconds,
            }
        ],
    )
    session.execute(
        insert(EpisodeAudit),
        [{"episode_id": i, "batch_id": batch_id, "reference": r} for i, r in zip(ids, refs, strict=True)],
    )


def _insert_search(
    session: Session,
    batch: Batch,
    rows: list[dict[str, Any]],
    fields: list[EpisodeFields],
    ids: dict[str, int],
) -> None:
    """The kept episodes' search rows (``episode_search``), in the batch's transaction."""
    session.execute(
        insert(EpisodeSearch),
        [
            {
                "episode_id": ids[row["slug"]],
                "run_id": batch.run_id,
                "step": batch.step,
                "position": row["position"],
                "batch_id": batch.id,
                "slug": row["slug"],
                "group": row["group"],
                "reward": row["reward"],
                "passed": row["passed"],
                "n_tokens": row["n_tokens"],
                **f.columns(),
            }
            for row, f in zip(rows, fields, strict=True)
        ],
    )


def _insert_prompts(session: Session, batch: Batch, prompts: list[PromptStep]) -> None:
    """The step's prompt history rows (app/storage/prompt_models.py), in the batch's transaction;
    a prompt the run has seen before keeps its first row (concurrent steps: the database decides)."""
    new = [
        {
            "run_id": batch.run_id,
            "key": p.key,
            "prompt": p.prompt,
            "n_tokens": p.n_tokens,
            "first_step": batch.step,
        }
        for p in prompts
    ]
    dialect = session.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        from sqlalchemy.dialects import postgresql, sqlite

        ins = (sqlite if dialect == "sqlite" else postgresql).insert(RunPrompt)
        session.execute(ins.on_conflict_do_nothing(index_elements=["run_id", "key"]), new)
    else:  # pragma: no cover - the two databases the service runs on are above
        have = set(session.execute(select(RunPrompt.key).where(RunPrompt.run_id == batch.run_id)).scalars())
        rows = [r for r in new if r["key"] not in have]
        if rows:
            session.execute(insert(RunPrompt), rows)
    session.execute(
        insert(PromptStepRow),
        [
            {
                "run_id": batch.run_id,
                "key": p.key,
                "step": batch.step,
                "batch_id": batch.id,
                "n": p.n,
                "n_passed": p.n_passed,
                "sum_abs_adv": p.sum_abs_adv if p.has_adv else None,
                "n_adv_tokens": p.n_adv_tokens,
                "n_kept": p.n_kept,
                "group": p.group,
            }
            for p in prompts
        ],
    )


# ---------------------------------------------------------------------------------------------
# Reading.


def get_episode(session: Session, slug: str) -> Episode | None:
    """The episode with share slug ``slug``, or None."""
    return session.exec(select(Episode).where(Episode.slug == slug)).first()


def episode_or_404(session: Session, slug: str) -> Episode:
    """The episode with share slug ``slug``; ApiError 404 otherwise."""
    ep = get_episode(session, slug)
    if ep is None:
        raise not_found(f"Episode {slug!r}")
    return ep


def get_batch(session: Session, batch_id: int) -> Batch | None:
    return row_by_id(session, Batch, batch_id)


def batch_or_404(session: Session, batch_id: int) -> Batch:
    b = get_batch(session, batch_id)
    if b is None:
        raise not_found(f"Batch {batch_id}")
    return b


LIKE_ESCAPE = "\\"


def like_escape(text: str) -> str:
    """``text`` as a literal LIKE pattern under ``ESCAPE '\\'`` (escape first, then % and _)."""
    return (
        text.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2)
        .replace("%", LIKE_ESCAPE + "%")
        .replace("_", LIKE_ESCAPE + "_")
    )


def list_batches(
    session: Session,
    *,
    q: str | None = None,
    source: str | None = None,
    limit: int = 100,
    offset: int = 0,
    steps: bool | None = None,
) -> list[Batch]:
    """Batches, newest first; ``q`` searches batch names and sources and the tasks and groups of
    their episodes (case-insensitive); ``source`` filters by prefix; ``steps``: only a run's
    steps (True), none of them (False), or both (None)."""
    stmt = select(Batch)
    stmt = stmt.where(Batch.visibility == PUBLIC)  # unlisted batches are never listed nor searched
    if q:
        # `q` is literal text: %, _ and the escape character itself match only themselves.
        like = "%" + like_escape(q.lower()) + "%"
        in_episodes = select(Episode.batch_id).where(
            or_(
                func.lower(Episode.task).like(like, escape=LIKE_ESCAPE),
                func.lower(Episode.group).like(like, escape=LIKE_ESCAPE),
            )
        )
        stmt = stmt.where(
            or_(
                func.lower(Batch.name).like(like, escape=LIKE_ESCAPE),
                func.lower(Batch.source).like(like, escape=LIKE_ESCAPE),
                col(Batch.id).in_(in_episodes),
            )
        )
    if source:
        stmt = stmt.where(col(Batch.source).startswith(source))
    if steps is not None:
        stmt = stmt.where(col(Batch.run_id).is_not(None) if steps else col(Batch.run_id).is_(None))
    stmt = stmt.order_by(col(Batch.created_at).desc(), col(Batch.id).desc()).offset(offset).limit(limit)
    return list(session.exec(stmt).all())


# ---------------------------------------------------------------------------------------------
# Deleting.


def require_delete_token(stored_hash: str | None, token: str | None, returned_by: str) -> None:
    """ApiError 403 unless ``token`` hashes to ``stored_hash`` (compared in constant time);
    ``returned_by`` says where the user got the token ("the upload", "the run's creation")."""
    if not token or stored_hash is None or not secrets.compare_digest(hash_token(token), stored_hash):
        raise ApiError(
            403,
            "bad_delete_token",
            f"the delete token is missing or wrong; send the `delete_token` returned by {returned_by} "
            "as the `X-Delete-Token` header or the `token` query parameter.",
        )


def check_delete_token(session: Session, batch_id: int, token: str | None) -> None:
    """ApiError 403 unless ``token`` is the delete token returned when the batch was created."""
    require_delete_token(batch_or_404(session, batch_id).delete_token_hash, token, "the upload")


def delete_episode(session: Session, slug: str, token: str | None) -> None:
    """Delete one episode (token = its batch's delete token); the batch goes when it is empty."""
    ep = episode_or_404(session, slug)
    check_delete_token(session, ep.batch_id, token)
    batch = session.get(Batch, ep.batch_id)
    if batch is None:  # the batch was deleted meanwhile
        raise not_found(f"Episode {slug!r}")
    with writing(session):
        _delete_episode(session, ep, batch, slug)


def _delete_episode(session: Session, ep: Episode, batch: Batch, slug: str) -> None:
    try:
        from app.storage.batch_stats import store_batch_diagnostics

        session.delete(ep)
        batch.n_episodes = max(0, batch.n_episodes - 1)
        session.flush()
        store_batch_diagnostics(session, saved_id(batch))  # the new state's (none for an emptied batch)
        session.flush()
        if batch.n_episodes == 0:
            session.delete(batch)
        session.commit()
    except (StaleDataError, ObjectDeletedError):  # deleted by a concurrent request: gone either way
        session.rollback()
        raise not_found(f"Episode {slug!r}") from None


def delete_batch(session: Session, batch_id: int, token: str | None) -> None:
    """Delete a batch and all its episodes (token = the batch's delete token)."""
    check_delete_token(session, batch_id, token)
    with writing(session):
        try:
            # Bulk deletes: a batch's episodes are never loaded (their arrays can be gigabytes).
            session.execute(sa_delete(Episode).where(col(Episode.batch_id) == batch_id))
            session.execute(sa_delete(BatchStats).where(col(BatchStats.batch_id) == batch_id))
            deleted = session.execute(sa_delete(Batch).where(col(Batch.id) == batch_id))
            gone = deleted.rowcount if isinstance(deleted, CursorResult) else 1
            session.commit()
        except (StaleDataError, ObjectDeletedError):  # deleted by a concurrent request
            session.rollback()
            raise not_found(f"Batch {batch_id}") from None
    if not gone:  # deleted by a concurrent request meanwhile
        raise not_found(f"Batch {batch_id}")


# ---------------------------------------------------------------------------------------------
# Demo data.


def _demo_meta(path: Path) -> dict[str, Any]:
    """``<stem>.meta.json`` beside a demo file: the batch's metadata (sampler settings, diagnostics)."""
    meta_path = path.with_name(path.stem + ".meta.json")
    if not meta_path.is_file():
        return {}
    meta = json.loads(meta_path.read_text())
    return meta if isinstance(meta, dict) else {}


def load_demo(session: Session, folder: Path | None = None) -> list[CreatedBatch]:
    """If the database has no batches, store every ``folder/*.jsonl`` (native JSONL, one episode
    per line) as one batch named by the file stem, source "demo", with ``<stem>.meta.json`` merged
    into the batch's meta when present. Missing folder: nothing."""
    if session.exec(select(Batch.id).limit(1)).first() is not None:
        return []
    folder = demo_dir() if folder is None else Path(folder)
    if not folder.is_dir():
        return []
    from app.ingest import parse_upload

    created = []
    for path in sorted(folder.glob("*.jsonl")):
        parsed = parse_upload(path.read_bytes(), fmt="native", source="demo")
        if not parsed.episodes:
            continue
        created.append(
            create_batch(
                session,
                parsed.episodes,
                name=path.stem,
                source="demo",
                meta={"file": path.name, **_demo_meta(path)},
                lines=parsed.lines,
            )
        )
    return created
