"""Any transcript, found by its shape: the catch-all after every dedicated format.

An agent framework's, an evaluation harness's or a trainer's file that no dedicated format claims
is read by the structural reader (app/ingest/_structure.py) from any container
(app/ingest/_containers.py: JSON, JSONL, an object holding a list of records, a zip of JSON such as
Inspect AI's ``.eval``, gzip):

* a record's messages are found by shape under any key or at the top (a bare list of messages, a
  list of message lists, JSONL of messages), in any of the common message shapes, roles by the
  one role table (app/ingest/_roles.py);
* a list of records holding transcripts (``samples``, ``simulations``, ``episodes``, …) is one
  episode per record;
* reward and group by name (``reward``, ``score``, ``success``, Inspect's scores, …; ``task_id``,
  ``instance_id``, …); no reward: ``reward: null`` and the answer's ``warnings`` name the keys
  looked at. Roles outside the table, and records skipped (error lines, transcripts without a
  model turn, when others have one), are warnings too;
* a file that is not episodes (a metrics log, an evaluation summary, an event stream) is a 422
  ``not_episodes`` that says what it looks like.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

from app.core.errors import ApiError
from app.ingest import _notes
from app.ingest._common import Record
from app.ingest._containers import is_gzip, is_torch_zip, json_members, records
from app.ingest._document import Document
from app.ingest._opencode import Session, export_session, is_export, is_hook_line, session_record, sessions
from app.ingest._registry import Pair, register_format
from app.ingest._run_trees import is_run, merge_runs, trace_record, traces
from app.ingest._structure import (
    WILD,
    Path,
    Plan,
    build_episode,
    episode_records,
    get_path,
    item_shape,
    plan_of,
    reward_keys_looked_at,
)
from app.ingest._tokenizer import TokenDecoder

NAME = "transcript"
SOURCE = f"upload:{NAME}"


def _is_message_record(obj: Any) -> bool:
    """A record that is one message of a transcript spread over the file (JSONL of messages, a
    bare JSON array of messages)."""
    if item_shape(obj) is None:
        return False
    plan = plan_of(obj)
    return plan is None or plan.parts == [()]


def sniff(doc: Document) -> bool:
    if is_gzip(doc.data):
        return True
    if doc.is_zip:
        names = doc.zip_names
        return names is not None and not is_torch_zip(names) and bool(json_members(names))
    first = doc.first
    if first is None:
        return False
    return (
        _is_message_record(first)
        or is_run(first)
        or is_export(first)
        or plan_of(first) is not None
        or _notes.describe(first) is not None
    )


def _not_episodes(message: str) -> ApiError:
    return ApiError(422, "not_episodes", message[:1].upper() + message[1:])


class _Plans:
    """The plan of each record, computed once per set of top-level keys (every line of a file is
    usually the same shape)."""

    def __init__(self) -> None:
        self.by_keys: dict[tuple[str, ...], Plan | None] = {}

    def of(self, obj: Any) -> Plan | None:
        if not isinstance(obj, dict):
            return plan_of(obj)
        key = tuple(obj)
        plan = self.by_keys.get(key)
        if plan is None or not _fits(obj, plan):  # same keys, another shape inside: look again
            plan = self.by_keys[key] = plan_of(obj)
        return plan


def _fits(obj: Any, plan: Plan) -> bool:
    """True when ``plan`` reads ``obj`` (its records root and, without one, its message lists)."""
    if WILD in plan.root:
        return isinstance(get_path(obj, plan.root[: plan.root.index(WILD)]), list)
    return _reads(obj, plan.parts, plan.texts)


def _reads(obj: Any, parts: list[Path], texts: tuple[str | None, str] | None) -> bool:
    if texts is not None:
        return isinstance(obj, dict) and isinstance(obj.get(texts[1]), str)
    return any(isinstance(obj if not p else get_path(obj, p), list) for p in parts)


def _episode_plans(obj: Any, plan: Plan) -> Iterator[tuple[Any, str, Plan]]:
    """(episode record, where, how to read it): a record of a list whose messages sit elsewhere
    than in the first record's gets a plan of its own."""
    for rec, where in episode_records(obj, plan):
        if plan.root and not _reads(rec, plan.parts, plan.texts):
            own = plan_of(rec)
            if own is not None and not own.root:
                yield rec, where, own
                continue
        yield rec, where, plan


def episodes(doc: Document, _tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
    """One episode per transcript of the upload (module docstring)."""
    it = records(doc)
    head = next(it, None)
    if head is None:
        raise ApiError(422, "empty_upload", "the upload holds no records.")
    first_rec, _ = head
    if _is_message_record(first_rec.obj):
        yield from _one_transcript(first_rec, it)
        return
    if is_hook_line(first_rec.obj):
        objs = [first_rec.obj, *(r.obj for r, _ in it)]
        yield from _opencode_sessions(
            first_rec,
            sessions(objs),
            f"an opencode plugin's hook log ({len(objs)} lines of [hook, payload])",
            "opencode hook log",
        )
        return
    if is_export(first_rec.obj):
        found = [export_session(first_rec.obj), *(export_session(r.obj) for r, _ in it if is_export(r.obj))]
        yield from _opencode_sessions(
            first_rec, found, "an opencode session export", "opencode session export"
        )
        return
    if _is_event_tuple(first_rec.obj):
        yield from _event_stream(first_rec, it)
        return
    if is_run(first_rec.obj):
        yield from _run_traces(first_rec, it)
        return
    plans = _Plans()
    n = 0
    problems: list[str] = []
    skipped_errors = 0
    missing_reward = 0
    unknown: Counter[str] = Counter()  # role -> messages kept as prompt
    for rec, member in _chain(head, it):
        plan = plans.of(rec.obj)
        if plan is None:
            described = _notes.describe(rec.obj)
            if _notes.is_error_record(rec.obj):
                skipped_errors += 1
                continue
            if n == 0 and described is not None and rec is first_rec:
                lines = doc.data.count(b"\n") + (0 if doc.data.endswith(b"\n") else 1)
                raise _not_episodes(_notes.describe(rec.obj, lines if not doc.is_zip else None) or described)
            problems.append(
                f"{_where(rec, member)}: no list of messages found (the record's keys: "
                + ", ".join(f"`{k}`" for k in list(rec.obj)[:8])
                + ")"
                if isinstance(rec.obj, dict)
                else f"{_where(rec, member)}: a {type(rec.obj).__name__}, not a record"
            )
            continue
        for obj, where, own in _episode_plans(rec.obj, plan):
            built = build_episode(obj, own.parts, where, SOURCE, own.texts)
            unknown.update(built.unknown_roles)
            if built.episode is None:
                problems.append(f"{_where(rec, member)}{' ' + where if where else ''}: {built.problem}")
                continue
            n += 1
            missing_reward += built.reward_missing
            if member:
                built.episode.meta.setdefault("file", member)
            yield rec.line, built.episode
    if n == 0:
        if problems:
            raise ApiError(
                422,
                "no_episodes",
                "no episode in the upload: " + "; ".join(p.rstrip(".") for p in problems[:3]) + ".",
            )
        raise _not_episodes(
            f"every record ({skipped_errors}) is an error report, not an episode."
            if skipped_errors
            else "the upload holds no transcript."
        )
    _warn_all(unknown, missing_reward, n, problems, skipped_errors)


def _chain(head: tuple[Record, str], rest: Iterator[tuple[Record, str]]) -> Iterator[tuple[Record, str]]:
    yield head
    yield from rest


def _where(rec: Record, member: str) -> str:
    parts = [member] if member else []
    if rec.line is not None:
        parts.append(f"line {rec.line}")
    parts.append(f"record {rec.episode}")
    return ", ".join(parts)


def _warn_all(unknown: dict[str, int], missing: int, n: int, problems: list[str], errors: int) -> None:
    _notes.unknown_roles(unknown)
    if missing:
        _notes.warn(
            f"{missing} of {n} episodes have no reward (stored with reward null); looked at: "
            + reward_keys_looked_at()
            + '. Map the reward with mapping={"reward": "<path>"} if it is elsewhere.'
        )
    if problems:
        _notes.warn(f"{len(problems)} records skipped: " + "; ".join(problems[:3]))
    if errors:
        _notes.warn(f"{errors} lines are error reports, not episodes; skipped.")


def _one_transcript(first: Record, rest: Iterator[tuple[Record, str]]) -> Iterator[Pair]:
    """A file whose records are the messages of one transcript."""
    items = [first.obj, *(r.obj for r, _ in rest)]
    built = build_episode(items, [()], "", SOURCE)
    if built.episode is None:
        raise ApiError(422, "no_policy_tokens", f"{built.problem}")
    _warn_all(built.unknown_roles, int(built.reward_missing), 1, [], 0)
    yield first.line, built.episode


def _is_event_tuple(obj: Any) -> bool:
    """A ``[name, payload, …]`` line of a session's event log (SDK traffic, hook events)."""
    return isinstance(obj, list) and len(obj) >= 2 and isinstance(obj[0], str)


def _event_items(v: Any, depth: int = 4) -> Iterator[Any]:
    """The message-like objects inside an event's payload, in order."""
    if item_shape(v) is not None and not isinstance(v, list):
        yield v
    elif depth > 0 and isinstance(v, list):
        for x in v:
            yield from _event_items(x, depth - 1)
    elif depth > 0 and isinstance(v, dict):
        for x in v.values():
            if isinstance(x, (dict, list)):
                yield from _event_items(x, depth - 1)


def _event_stream(first: Record, rest: Iterator[tuple[Record, str]]) -> Iterator[Pair]:
    """A file of ``[name, payload]`` event lines: the messages and tool events found in the
    payloads, in order, are one session's transcript (an event sent and then echoed by the stream
    is read once); a file in which none is found says what it is."""
    items: list[Any] = []
    last: tuple[Any, ...] | None = None
    n = 0
    for rec in (first, *(r for r, _ in rest)):
        n += 1
        for x in _event_items(rec.obj[1:] if isinstance(rec.obj, list) else rec.obj):
            key = (x.get("type"), x.get("role"), json.dumps(x.get("content"), sort_keys=True, default=str))
            if key != last:
                items.append(x)
            last = key
    built = build_episode(items, [()], "", SOURCE) if items else None
    if built is None or built.episode is None:
        raise _not_episodes(_notes.describe(first.obj, n) or "the upload holds no transcript.")
    built.episode.meta["events"] = n
    _warn_all(built.unknown_roles, int(built.reward_missing), 1, [], 0)
    yield first.line, built.episode


def _opencode_sessions(first: Record, found: list[Session], what: str, kind: str) -> Iterator[Pair]:
    """opencode sessions (app/ingest/_opencode.py: a plugin's hook log or ``opencode export``
    files; ``what`` says which): one episode per session in which the model speaks."""
    n = missing = 0
    problems: list[str] = []
    unknown: Counter[str] = Counter()  # role -> messages kept as prompt
    for sess in found:
        rec = session_record(sess)
        if not any(m["role"] == "assistant" for m in rec["messages"]):
            problems.append(f"session {sess.id}: no message of the model")
            continue
        built = build_episode(rec, [("messages",)], f"session {sess.id}", SOURCE)
        unknown.update(built.unknown_roles)
        if built.episode is None:
            problems.append(f"session {sess.id}: {built.problem}")
            continue
        n += 1
        missing += built.reward_missing
        built.episode.meta["format_of_file"] = kind
        yield first.line, built.episode
    if n == 0:
        raise _not_episodes(
            f"this is {what} in which no session has a message of the model"
            + (f" ({'; '.join(problems[:3])})" if problems else "")
            + ": there is nothing to give credit to."
        )
    _warn_all(unknown, missing, n, problems, 0)


def _run_traces(first: Record, rest: Iterator[tuple[Record, str]]) -> Iterator[Pair]:
    """A file of traced runs (LangSmith; app/ingest/_run_trees.py): one episode per trace, its
    model and tool runs merged in time order."""
    lines: dict[str, int | None] = {}
    objs: list[Any] = []
    for rec in (first, *(r for r, _ in rest)):
        objs.append(rec.obj)
        if isinstance(rec.obj, dict) and isinstance(rec.obj.get("id"), str):
            lines.setdefault(rec.obj["id"], rec.line)
    runs, other = merge_runs(objs)
    n = missing = 0
    problems: list[str] = []
    unknown: Counter[str] = Counter()  # role -> messages kept as prompt
    for tid, trace_runs in traces(runs):
        if not any(r["run_type"] == "llm" for r in trace_runs):
            problems.append(f"trace {tid}: {len(trace_runs)} runs and no `llm` run")
            continue
        built = build_episode(trace_record(tid, trace_runs), [("messages",)], f"trace {tid}", SOURCE)
        unknown.update(built.unknown_roles)
        if built.episode is None:
            problems.append(f"trace {tid}: {built.problem}")
            continue
        n += 1
        missing += built.reward_missing
        yield lines.get(trace_runs[0]["id"]), built.episode
    if n == 0:
        raise ApiError(
            422,
            "no_episodes",
            f"no episode in the upload's {len(runs)} traced runs: "
            + ("; ".join(p.rstrip(".") for p in problems[:3]) or "no trace has a model run")
            + ".",
        )
    _warn_all(unknown, missing, n, problems, 0)
    if other:
        _notes.warn(f"{other} records are not traced runs; skipped.")


register_format(
    name=NAME,
    description="any transcript found by shape (messages under any key, ShareGPT, Gemini parts, "
    "Anthropic blocks, Responses items, action/observation steps; Inspect .eval zips, gzip)",
    priority=90,
    sniff=sniff,
    episodes=episodes,
)
