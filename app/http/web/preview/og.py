"""Open Graph / Twitter card tags of the episode, batch and run pages (read from the rows' small
columns; the image they point to is the page's preview.png)."""

from __future__ import annotations

from typing import TypedDict

from fastapi import Request
from sqlmodel import func, select

from app.core import urls
from app.http.web.preview.layout import H, W
from app.storage.db import SessionDep
from app.storage.models import Batch, Episode


def short_num(v: float | None) -> str:
    """A number as the previews print it: 3 significant digits, "—" for none."""
    return "—" if v is None else f"{v:.3g}"


def absolute(request: Request, path: str) -> str:
    """``path`` as an absolute URL on the host the request came to (crawlers need absolute URLs)."""
    return str(request.base_url).rstrip("/") + path


class OgTags(TypedDict):
    """What templates/_og.html renders."""

    title: str
    description: str
    url: str
    image: str
    image_alt: str
    width: int
    height: int


def og_tags(request: Request, title: str, description: str, image_path: str, alt: str) -> OgTags:
    """The Open Graph / Twitter card values templates/_og.html renders."""
    return {
        "title": title,
        "description": description,
        "url": absolute(request, request.url.path),
        "image": absolute(request, image_path),
        "image_alt": alt,
        "width": W,
        "height": H,
    }


def episode_og(request: Request, session: SessionDep, slug: str) -> OgTags | None:
    """Tags for /e/{slug}, from the episode row's small columns (None if it does not exist)."""
    row = session.exec(
        # sqlmodel's select is typed for at most 4 columns; 5 work the same at run time.
        select(Episode.task, Episode.n_tokens, Episode.n_policy, Episode.reward, Episode.group).where(  # type: ignore[call-overload]
            Episode.slug == slug
        )
    ).first()
    if row is None:
        return None
    task, n, n_policy, reward, group = row
    title = f"{task or 'Episode'} · creditlens"
    desc = f"Which tokens got the credit: reward {short_num(reward)}, {n} tokens ({n_policy} policy)"
    desc += f", group {group}." if group else "."
    alt = f"Token strips of episode {slug}: blue tokens got positive advantage, red negative."
    return og_tags(request, title, desc, urls.episode_preview(slug), alt)


def batch_og(
    request: Request, session: SessionDep, batch_id: int, ref: int | str | None = None
) -> OgTags | None:
    """Tags for /b/{ref} (``ref``: what its URLs carry, its slug when unlisted; default the id)."""
    ref = batch_id if ref is None else ref
    row = session.exec(select(Batch.name, Batch.n_episodes).where(Batch.id == batch_id)).first()
    if row is None:
        return None
    name, n = row
    title = f"{name or f'Batch {ref}'} · creditlens"
    desc = f"{n} episodes: reward histogram, zero-variance groups and per-episode credit."
    alt = f"Batch {ref}: reward histogram and one cell per episode coloured by its advantage."
    return og_tags(request, title, desc, urls.batch_preview(ref), alt)


def run_og(request: Request, session: SessionDep, ref: int | str) -> OgTags | None:
    """Tags for /r/{ref} (its id, or its slug when unlisted), from the run's name and its number
    of steps (None if it does not exist)."""
    from app.storage.runs import run_by_ref

    run = run_by_ref(session, ref)
    if run is None:
        return None
    n = session.exec(select(func.count()).select_from(Batch).where(Batch.run_id == run.id)).one()
    title = f"{run.name} · creditlens"
    desc = f"Training run, {n} step{'s' if n != 1 else ''}: pass rate, mean score, zero-variance share and advantages per step."
    alt = f"Run {run.name}: its main metrics per training step, one small chart each."
    return og_tags(request, title, desc, urls.run_preview(ref), alt)
