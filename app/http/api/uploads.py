"""POST /api/uploads: a file in any known format (multipart ``file``, a JSON body, or raw bytes),
validated whole, stored in one transaction."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from sqlmodel import Session
from starlette.datastructures import FormData
from starlette.types import Message

from app.core.configs import parse_config
from app.core.errors import ApiError
from app.core.schemas import UploadOut
from app.core.settings import Settings
from app.core.trainers import check_trainer, trainer_of_config
from app.http.api._json import json_response
from app.http.api.deps import require_write
from app.ingest import FORMATS, iter_upload, load_tokenizer
from app.ingest._notes import collecting
from app.storage.db import SessionDep
from app.storage.store import VISIBILITIES, create_batch_streaming

router = APIRouter(tags=["uploads"])


def _too_large(n: int | str, limit: int) -> ApiError:
    return ApiError(
        413,
        "too_large",
        f"the upload is {n} bytes; the limit is {limit} bytes (setting CREDITLENS_MAX_UPLOAD_BYTES). "
        "Split the file into several uploads.",
    )


def _check_declared(request: Request, limit: int) -> None:
    """413 before reading a body whose declared length is beyond ``limit`` (a chunked body
    declares none: what arrives is counted too)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(declared, limit)


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole raw body; 413 beyond ``limit``."""
    head, _ = await _read_head(request, limit, limit + 1)  # no segment ends before the limit
    return head


async def _read_head(request: Request, limit: int, segment: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """(the body's first ``segment`` bytes or more, the rest as segments still to be received —
    None when the head is the whole body). 413 beyond ``limit``."""
    _check_declared(request, limit)
    pieces = _segments(request.stream(), limit, segment)
    head = await anext(pieces, b"")
    return head, (pieces if len(head) >= segment else None)


async def _segments(chunks: AsyncIterator[bytes], limit: int, segment: int) -> AsyncIterator[bytes]:
    """A body in pieces of ``segment`` bytes or more (the last may be shorter); 413 once more than
    ``limit`` bytes arrived in all."""
    pieces: list[bytes] = []
    size = received = 0
    async for chunk in chunks:
        received += len(chunk)
        if received > limit:
            raise _too_large(f"more than {limit}", limit)
        pieces.append(chunk)
        size += len(chunk)
        if size >= segment:
            yield b"".join(pieces)
            pieces, size = [], 0
    if pieces:
        yield b"".join(pieces)


# Room for the multipart framing (boundaries, part headers, small form fields) around the file.
_MULTIPART_SLACK = 64 * 1024


def _capped(request: Request, limit: int) -> Request:
    """The same request whose body stream raises 413 once more than ``limit`` (+ slack) bytes arrived."""
    received = 0

    async def receive() -> Message:
        nonlocal received
        message = await request.receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit + _MULTIPART_SLACK:
                raise _too_large(f"more than {limit}", limit)
        return message

    return Request(request.scope, receive)


@dataclass
class UploadBody:
    """What an upload request sent: the file's bytes and its format, name and file name (each
    None when not given)."""

    data: bytes
    format: str | None
    name: str | None
    filename: str | None
    tokenizer: bytes | None = None  # a tokenizer.json whose pieces show the upload's token ids
    visibility: str | None = None  # public|unlisted; None: the server's CREDITLENS_DEFAULT_VISIBILITY
    mapping: str | None = None  # JSON {native field: record key} (app/ingest/_mapping.py)
    trainer: str | None = None  # the trainer that computed the advantages (app/core/trainers.py)
    config: dict[str, Any] | None = None  # its configuration file, read (app/core/configs.py)
    # A raw body longer than one segment (read_upload with stream=True): ``data`` is its head, and
    # ``rest`` the segments still to be received; run_ingest hands them to the reading thread.
    rest: AsyncIterator[bytes] | None = None


def resolve_visibility(given: str | None, settings: Settings) -> str:
    """``given`` (public|unlisted) or the server's default; 422 naming the field otherwise."""
    if given is None or given == "":
        return settings.default_visibility
    if given not in VISIBILITIES:
        raise ApiError(
            422,
            "invalid_visibility",
            f"visibility must be one of {', '.join(VISIBILITIES)}; got {given[:40]!r}.",
            field="visibility",
        )
    return given


async def read_tokenizer(form: FormData) -> bytes | None:
    """The bytes of the optional ``tokenizer`` multipart part (a tokenizer.json), or None;
    :func:`ingest` checks its size and turns it into a decoder for the upload's token ids."""
    part = form.get("tokenizer")
    if part is None:
        return None
    # The part is already bounded by the upload limit (_capped); its own limit is checked by
    # load_tokenizer, off the event loop.
    return part.encode() if isinstance(part, str) else await part.read()


async def read_upload(
    request: Request,
    format: str | None,
    name: str | None,
    visibility: str | None = None,
    mapping: str | None = None,
    trainer: str | None = None,
    stream: bool = False,
) -> UploadBody:
    """The body of an upload request, the one reading of POST /api/uploads and of a run's steps:
    multipart (``file`` [+ ``format``, ``name``, ``tokenizer`` (a tokenizer.json for uploads of
    token ids), ``trainer``, ``config`` (the trainer's configuration file) form fields]), a JSON body, or the raw file bytes
    (``format``/``name`` from the query). 413 beyond CREDITLENS_MAX_UPLOAD_BYTES. ``stream``: a raw
    body longer than CREDITLENS_UPLOAD_SEGMENT_BYTES comes back as its head and the rest still to
    be received (``UploadBody.rest``; give the body to :func:`run_ingest`)."""
    settings = request.app.state.settings
    limit = settings.max_upload_bytes
    ctype = request.headers.get("content-type", "")
    filename = None
    tokenizer = None
    if ctype.startswith("multipart/form-data"):
        _check_declared(request, limit)
        # Count what arrives too: a chunked body declares no length, and the form parser would
        # spool all of it to disk before the size check below.
        form = await _capped(request, limit).form()
        upload_file = form.get("file")
        if upload_file is None or isinstance(upload_file, str):
            raise ApiError(422, "missing_file", "the multipart upload has no `file` part.", field="file")
        data = await upload_file.read()
        if len(data) > limit:
            raise _too_large(len(data), limit)
        filename = upload_file.filename
        tokenizer = await read_tokenizer(form)
        fmt, named = form.get("format"), form.get("name")
        format = format or (fmt if isinstance(fmt, str) else None)
        name = name or (named if isinstance(named, str) else None)
        vis = form.get("visibility")
        visibility = visibility or (vis if isinstance(vis, str) else None)
        mapped = form.get("mapping")
        mapping = mapping or (mapped if isinstance(mapped, str) and mapped.strip() else None)
        tr = form.get("trainer")
        trainer = trainer or (tr if isinstance(tr, str) and tr.strip() else None)
        config = await read_config(form)
    elif stream:
        data, rest = await _read_head(request, limit, settings.upload_segment_bytes)
        try:
            checked = check_trainer(trainer)
        except ApiError:
            await drain(rest)
            raise
        return UploadBody(data, format, name, None, None, visibility, mapping, checked, None, rest=rest)
    else:
        data = await _read_body(request, limit)
        config = None
    if trainer is None and config is not None:
        trainer = trainer_of_config(config)
    return UploadBody(
        data, format, name, filename, tokenizer, visibility, mapping, check_trainer(trainer), config
    )


async def read_config(form: FormData) -> dict[str, Any] | None:
    """The optional ``config`` multipart part (the trainer's configuration file: verl's
    ``.hydra/config.yaml`` or ``overrides.yaml``, a JSON object, OpenRLHF's arguments), read."""
    part = form.get("config")
    if part is None:
        return None
    text = part if isinstance(part, str) else await part.read()
    if not text.strip():
        return None
    return parse_config(text, "config")


def ingest(
    session: Session,
    body: UploadBody,
    settings: Settings,
    *,
    default_name: str | None = None,
    run_id: int | None = None,
    step: int | None = None,
    visibility: str | None = None,
    keep: int | None = None,
    trainer: str | None = None,
    trainer_config: dict[str, Any] | None = None,
    rest: Iterator[bytes] | None = None,
) -> dict[str, Any]:
    """Parse, validate and store one upload (as a run's step when ``run_id`` is given); the 201
    body. Blocking: call it in a worker thread. ``visibility``: a run step's (its run's), else the
    body's or the server's default. ``trainer``/``trainer_config``: a run step's (its run's), else
    the body's trainer; kept in the batch's meta (app/core/trainers.py). ``rest``: the body after
    ``body.data`` as it arrives (given by :func:`run_ingest`)."""
    trainer = body.trainer or trainer
    trainer_config = body.config or trainer_config
    visibility = visibility or resolve_visibility(body.visibility, settings)
    tok = body.tokenizer
    decoder = None if tok is None else load_tokenizer(tok, settings.max_tokenizer_bytes)
    with collecting() as warnings:  # what the reader noted (app/ingest/_notes.py)
        fmt, items = iter_upload(
            body.data, fmt=body.format, tokenizer=decoder, mapping=body.mapping, rest=rest
        )
        created = create_batch_streaming(
            session,
            items,
            name=body.name or default_name or body.filename or f"upload ({fmt})",
            source=f"{'upload' if run_id is None else 'run'}:{fmt}",
            meta={"format": fmt, "filename": body.filename}
            | ({"mapping": json.loads(body.mapping)} if fmt == "mapped" and body.mapping else {})
            | ({"trainer": trainer} if trainer else {})
            | ({"trainer_config": trainer_config} if trainer and trainer_config else {}),
            settings=settings,
            run_id=run_id,
            step=step,
            visibility=visibility,
            keep=keep,
        )
    out = created.model_dump()
    out["warnings"] = warnings
    if run_id is None:
        out.pop("n_episodes_seen")
    return out


T = TypeVar("T")


async def ingest_thread(request: Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread from the uploads' own share (Settings.ingest_threads)."""
    limiter = getattr(request.app.state, "ingest_limiter", None)
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=limiter)


def _interrupted() -> ApiError:
    return ApiError(
        503,
        "upload_interrupted",
        "the upload stopped before its end (the server is stopping); nothing was stored.",
    )


async def drain(rest: AsyncIterator[bytes] | None) -> None:
    """Receive and drop what is left of a body still arriving (``UploadBody.rest``), so a 4xx
    found in its head is answered once the client has sent it all, as for any other upload."""
    if rest is not None:
        async for _ in rest:
            pass


async def run_ingest(request: Request, body: UploadBody, call: Callable[[Iterator[bytes] | None], T]) -> T:
    """``call(rest)`` in an ingest thread (:func:`ingest_thread`), ``rest`` being None when the
    body is all in ``body.data``. When it is still arriving (``body.rest``), it is received
    meanwhile and handed to the thread segment by segment through ``rest`` (at most two wait at
    once, so a client sending faster than the reading waits): a prime-rl step is parsed while it uploads and never held whole. If the reading fails
    (a bad line), the rest is still received and dropped before the answer; if receiving fails (413,
    the client gone), the reading stops with that error and stores nothing."""
    rest = body.rest
    if rest is None:
        return await ingest_thread(request, call, None)
    send, receive = anyio.create_memory_object_stream[bytes](max_buffer_size=2)
    failed: list[Exception] = []
    outcome: list[T] = []
    errors: list[Exception] = []

    def segments() -> Iterator[bytes]:  # on the reading thread
        while True:
            try:
                yield anyio.from_thread.run(receive.receive)
            except anyio.EndOfStream:
                if failed:
                    raise failed[0] from None
                return

    async def read() -> None:
        try:
            outcome.append(await ingest_thread(request, call, segments()))
        except Exception as e:  # answered once the body is in (below)
            errors.append(e)
        finally:
            receive.close()  # a reading that stopped early: the sends below drop the rest

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        whole = False
        try:
            async for segment in rest:
                try:
                    await send.send(segment)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # the reading stopped (its error is the answer): receive the rest, drop it
            whole = True
        except Exception as e:  # 413, or the client went away: the reading stops with it
            failed.append(e)
        finally:
            if not whole and not failed:  # cancelled (the server stopping): never a clean end
                failed.append(_interrupted())
            send.close()  # after `failed`: the reading sees the end and then why
    if failed:
        raise failed[0]
    if errors:
        raise errors[0]
    return outcome[0]


# The query parameters of every upload route (POST /api/uploads, POST /api/runs/{id}/steps/{step}).
FormatQuery = Query(None, description="auto (default) or one of the format names; see GET /api/formats")
NameQuery = Query(None, description="batch name (default: the file name)")
MappingQuery = Query(
    None,
    description='when no format fits: JSON {native field: record key}, e.g. {"messages": "traj", '
    '"reward": "reward", "group": "task_id"} (dotted paths reach into nested objects). Fields it can '
    "fill: messages, prompt, response/completion, tokens, kinds and the other per-token fields, reward, "
    "group, truncated, bootstrap_value, task.",
)
TrainerQuery = Query(
    None,
    description="the trainer that computed the uploaded advantages: verl, trl, openrlhf, skyrl, areal, "
    "nemo_rl, prime_rl or slime (GET /api/trainers). The pages then show its dialect beside the "
    "upload and the audit names its estimators first.",
)
VisibilityQuery = Query(
    None,
    description="public (listed, by id) or unlisted (never listed or searched; reachable only by the "
    "slug in the answer's url). Default: the server's CREDITLENS_DEFAULT_VISIBILITY.",
)


@router.post(
    "/api/uploads",
    status_code=201,
    response_model=UploadOut,
    dependencies=[Depends(require_write)],
    summary="Upload episodes (any known format; auto-detected)",
)
async def upload(
    request: Request,
    session: SessionDep,
    format: str | None = FormatQuery,
    name: str | None = NameQuery,
    visibility: Literal["public", "unlisted"] | None = VisibilityQuery,
    mapping: str | None = MappingQuery,
    trainer: str | None = TrainerQuery,
) -> Response:
    """Multipart (``file`` [+ ``format``, ``name``, ``visibility``, ``mapping`` form fields]), a JSON body (native
    episodes or any JSON format), or the raw file bytes with ``?format=&name=``. All-or-nothing: a
    4xx names the line, episode and field and nothing is stored. ``mapping``: read records whose
    format is not known through {native field: record key}."""
    body = await read_upload(request, format, name, visibility, mapping, trainer, stream=True)
    settings = request.app.state.settings
    try:
        resolve_visibility(body.visibility, settings)  # 422 before any parsing
    except ApiError:
        await drain(body.rest)
        raise
    out = await run_ingest(request, body, lambda rest: ingest(session, body, settings, rest=rest))
    return json_response(out, status_code=201)


@router.get("/api/formats", tags=["uploads"], summary="The upload formats and how they are detected")
def list_formats() -> list[dict[str, str]]:
    return [{"name": f.name, "description": f.description} for f in FORMATS.values()]
