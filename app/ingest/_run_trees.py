"""Traced runs (LangSmith): one episode per trace, its model and tool runs merged in time order.

A LangSmith export holds one JSON object per *run* — a span of a trace: ``{id, trace_id,
parent_run_id, dotted_order, run_type, name, start_time, inputs, outputs, ...}`` with ``run_type``
``llm``, ``tool``, ``retriever``, ``chain``, ``parser``, ``prompt`` or ``embedding``. The SDK's
own run operations are the same runs in two halves: a create (``inputs``, ``start_time``) and a
patch (``outputs``, ``end_time``, ``error``) of the same ``id``, merged here.

Runs belong to the trace ``trace_id`` names (else the root of ``dotted_order``, else the run
``parent_run_id`` leads to) and are read in time order (``start_time``, then ``dotted_order``,
which sorts a trace in the order it ran, then the file's order):

* an ``llm`` run: the messages of its input (``inputs.messages``, a batch's first list; or
  ``inputs.prompts``) that the transcript does not hold yet — an agent's next call re-sends the
  conversation so far — then its output (``outputs.generations``' first message or text, or an
  OpenAI-shaped ``outputs.choices``): the model's turn;
* a ``tool`` or ``retriever`` run: a tool result (its ``outputs``' ``output``, or the retrieved
  documents' text), unless a later model input carries the same result;
* chains, parsers, prompts: the graph around them, not messages.

A trace without an ``llm`` run has nothing to give credit to and is skipped (counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.ingest._structure import _Ctx, read_messages, text_of

RUN_TYPES = frozenset({"llm", "tool", "retriever", "chain", "parser", "prompt", "embedding"})
TRACE_KEYS = ("trace_id", "dotted_order", "parent_run_id")
TOOL_RUNS = ("tool", "retriever")


def is_run(obj: Any) -> bool:
    """True for a traced run (or a run operation's create half): a ``run_type`` LangSmith knows
    and a place in a trace."""
    return (
        isinstance(obj, dict)
        and obj.get("run_type") in RUN_TYPES
        and isinstance(obj.get("id"), str)
        and any(k in obj for k in TRACE_KEYS)
    )


def _is_patch(obj: Any) -> bool:
    return (
        isinstance(obj, dict) and isinstance(obj.get("id"), str) and ("outputs" in obj or "end_time" in obj)
    )


def merge_runs(records: Iterable[Any]) -> tuple[list[dict[str, Any]], int]:
    """The runs of ``records`` with their create and patch halves merged by ``id`` (a later
    non-null field wins), in the order first seen; and how many records are neither."""
    by_id: dict[str, dict[str, Any]] = {}
    other = 0
    for obj in records:
        if not (is_run(obj) or _is_patch(obj)):
            other += 1
            continue
        run = by_id.setdefault(obj["id"], {})
        run.update({k: v for k, v in obj.items() if v is not None and v != "None"})
    return [r for r in by_id.values() if r.get("run_type") in RUN_TYPES], other


def _trace_of(run: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> str:
    tid = run.get("trace_id")
    if isinstance(tid, str) and tid:
        return tid
    dotted = run.get("dotted_order")
    if isinstance(dotted, str) and "Z" in dotted:
        return dotted.split(".", 1)[0].split("Z", 1)[1]
    seen = set()
    while isinstance(run.get("parent_run_id"), str) and run["parent_run_id"] in by_id:
        if run["id"] in seen:
            break
        seen.add(run["id"])
        run = by_id[run["parent_run_id"]]
    return str(run["id"])


def traces(runs: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(trace id, its runs in time order) in the order the traces start."""
    by_id = {r["id"]: r for r in runs}
    grouped: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, r in enumerate(runs):
        grouped.setdefault(_trace_of(r, by_id), []).append((i, r))

    def when(item: tuple[int, dict[str, Any]]) -> tuple[str, str, int]:
        i, r = item
        start, dotted = r.get("start_time"), r.get("dotted_order")
        return (start if isinstance(start, str) else "", dotted if isinstance(dotted, str) else "", i)

    out = [(tid, [r for _, r in sorted(items, key=when)]) for tid, items in grouped.items()]
    return sorted(out, key=lambda t: when((0, t[1][0]))[:2])


def _first_batch(v: Any) -> list[Any]:
    """A batch of message lists (``[[m, m], ...]``) -> its first list; a list as it is."""
    if isinstance(v, list) and v and all(isinstance(x, list) for x in v):
        return list(v[0])
    return list(v) if isinstance(v, list) else []


def llm_input(run: dict[str, Any]) -> list[Any]:
    """The messages an ``llm`` run was given."""
    ins = run.get("inputs")
    if not isinstance(ins, dict):
        return []
    if isinstance(ins.get("messages"), list):
        return _first_batch(ins["messages"])
    prompts = ins.get("prompts") or ins.get("prompt") or ins.get("input")
    if isinstance(prompts, str):
        prompts = [prompts]
    return (
        [{"role": "user", "content": p} for p in prompts if isinstance(p, str)]
        if isinstance(prompts, list)
        else []
    )


def llm_output(run: dict[str, Any]) -> list[Any]:
    """The model's reply of an ``llm`` run, as message items."""
    outs = run.get("outputs")
    if not isinstance(outs, dict):
        return []
    gens = outs.get("generations")
    if isinstance(gens, list) and gens:
        first = gens[0][0] if isinstance(gens[0], list) and gens[0] else gens[0]
        if isinstance(first, dict):
            if isinstance(first.get("message"), dict):
                return [first["message"]]
            if isinstance(first.get("text"), str):
                return [{"role": "assistant", "content": first["text"]}]
    if isinstance(outs.get("choices"), list):
        return [outs]  # an OpenAI completion: read as a chunk
    for key in ("output", "content", "text"):
        if isinstance(outs.get(key), (str, dict)):
            v = outs[key]
            return (
                [v]
                if isinstance(v, dict) and ("role" in v or "lc" in v)
                else [{"role": "assistant", "content": text_of(v)}]
            )
    return []


def tool_output(run: dict[str, Any]) -> dict[str, Any] | None:
    """A ``tool`` or ``retriever`` run's result as a tool message, or None when it has none."""
    outs = run.get("outputs")
    if isinstance(outs, dict) and isinstance(outs.get("documents"), list):
        text = "\n\n".join(
            text_of(d.get("page_content", d)) if isinstance(d, dict) else text_of(d)
            for d in outs["documents"]
        )
    elif isinstance(outs, dict) and "output" in outs:
        out = outs["output"]
        if isinstance(out, dict) and isinstance(out.get("kwargs"), dict):  # a serialized ToolMessage
            out = out["kwargs"].get("content", out)
        text = text_of(out)
    elif outs is not None:
        text = text_of(outs)
    elif isinstance(run.get("error"), str):
        text = f"error: {run['error']}"
    else:
        return None
    return {"role": "tool", "name": run.get("name") or run["run_type"], "content": text}


def _key(item: Any, ctx: _Ctx) -> tuple[Any, ...]:
    """What makes two message items the same message (any shape: as the reader reads them)."""
    return tuple((m.kind, " ".join(m.text.split()), tuple(m.calls)) for m in read_messages([item], ctx))


def trace_items(runs: list[dict[str, Any]]) -> list[Any]:
    """The message items of one trace's runs (module docstring), each message once."""
    ctx = _Ctx()
    items: list[Any] = []
    seen: set[tuple[Any, ...]] = set()

    def add(item: Any) -> None:
        key = _key(item, ctx)
        if key and key not in seen:
            seen.add(key)
            items.append(item)

    for run in runs:
        if run["run_type"] == "llm":
            for m in llm_input(run):
                add(m)
            for m in llm_output(run):
                add(m)
        elif run["run_type"] in TOOL_RUNS:
            got = tool_output(run)
            if got is not None:
                add(got)
    return items


def root_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace's root run (no parent; else its first)."""
    return next(
        (r for r in runs if not r.get("parent_run_id") and "." not in str(r.get("dotted_order", ""))), runs[0]
    )


def trace_record(tid: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace as an episode record: its messages, its root's name, ids and scalar metadata."""
    root = root_of(runs)
    extra = root.get("extra")
    metadata = extra.get("metadata") if isinstance(extra, dict) else None
    counts = {f"n_{t}_runs": sum(r["run_type"] == t for r in runs) for t in ("llm", "tool", "retriever")}
    return {
        "trace_id": tid,
        "name": root.get("name"),
        **{k: n for k, n in counts.items() if n},
        "metadata": metadata if isinstance(metadata, dict) else {},
        "messages": trace_items(runs),
    }
