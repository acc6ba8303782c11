"""verifiers v1 traces (``Trace.to_record()`` as JSONL, one trace per line; what prime-rl's
orchestrator and ``vf`` dump). A trace keeps its conversation as a message graph, ``nodes``: each
``MessageNode`` has ``parent`` (index of its predecessor, null for a root), ``message`` (role,
content, tool calls), ``sampled`` (a model call produced it) and the tokens it adds to the
sequence:

* ``token_ids``: its leading template scaffold and its own tokens; concatenated along a
  root-to-leaf path they are exactly the ids the model saw (token-in/token-out by construction);
* ``mask`` (parallel to ``token_ids``): true for the model-sampled tokens -> policy; false ->
  tool inside a ``tool`` message, prompt elsewhere (scaffold, system/user, a prompt-supplied
  assistant message);
* ``logprobs``, ``advantages``, ``reference_logprobs``: compact, one per sampled token (the true
  entries of ``mask``) -> ``logprobs``, ``advantages`` (the scheme ``uploaded``), ``ref_logprobs``;
  ``advantages`` null means *unassigned* (never scored), not 0: a branch with an unassigned
  sampled node has no uploaded advantages and ``meta.advantages_unassigned`` lists its turns;
* ``loss_weights`` (named streams aligned to ``token_ids``) -> ``meta.token_signals``.

Each root-to-leaf path (``branch``) is an episode, except where verifiers forked on a re-render:
when a turn's prompt re-renders an earlier sampled answer as other tokens (a renderer-level break:
the same message, retokenized), verifiers keeps the sampled answer as a leaf and starts a sibling
node with the same message (not sampled) holding the re-rendered ids, under which the trace goes
on. Such a pair is joined back into one episode as it was sampled (token-in/token-out,
app/ingest/_drift.py): the sampled answer's ids stay in the row, what the re-render adds after it
(the input form's closing scaffold) is prompt, and ``meta.drift`` keeps the re-render (the turn
whose prompt made it, the re-rendered ids, how many sampled ids differ, the first differing pair). The reward is the sum of ``rewards``' weighted
scores (null when every reward is null: scoring did not run); ``stop_condition`` ``max_turns`` /
``*_tokens`` / ``context_length`` marks it truncated. A branch without token ids (an eval relay)
shows the messages' text. A ``mask`` of another length than its ``token_ids``, or one that makes
an input message's tokens trainable, is kept with ``meta.mask_misaligned`` (the audit's
``mask_misaligned``); compact fields of the wrong length are refused naming the node. Group: the
task's ``example_id`` (else ``id``), else a hash of the first message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.core.schemas import EpisodeIn, Kind
from app.ingest._common import Record, short_hash
from app.ingest._document import Document
from app.ingest._drift import align_turn, name_rerenders
from app.ingest._ids import shown_tokens
from app.ingest._registry import Pair, register_format
from app.ingest._spans import SpanBuilder, arguments_text
from app.ingest._tokenizer import TokenDecoder

TRUNCATING = {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length"}


def sniff(doc: Document) -> bool:
    first = doc.first
    if not (isinstance(first, dict) and isinstance(first.get("nodes"), list)):
        return False
    nodes = first["nodes"]
    return ("agent" in first or "task" in first) and (
        not nodes or (isinstance(nodes[0], dict) and "message" in nodes[0] and "parent" in nodes[0])
    )


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return json.dumps(content)


def _branches(nodes: list[Any], rec: Record) -> list[list[int]]:
    """Every root-to-leaf path of node indices, leaves in node order."""
    has_child = set()
    for i, n in enumerate(nodes):
        if not isinstance(n, dict) or not isinstance(n.get("message"), dict):
            raise rec.error(
                "wrong_type", f"field `nodes[{i}]` must be an object with a `message`.", f"nodes[{i}]"
            )
        p = n.get("parent")
        if p is not None:
            if not isinstance(p, int) or not 0 <= p < i:
                raise rec.error(
                    "wrong_type",
                    f"field `nodes[{i}].parent` is {p!r}; expected an earlier node's index.",
                    f"nodes[{i}].parent",
                )
            has_child.add(p)
    paths = []
    for leaf in (i for i in range(len(nodes)) if i not in has_child):
        path: list[int] = []
        nid: int | None = leaf
        while nid is not None:
            path.append(nid)
            nid = nodes[nid].get("parent")
        paths.append(path[::-1])
    return paths


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message without its empty fields (verifiers hashes None and "" content alike)."""
    return {k: v for k, v in message.items() if v not in (None, "", [], {})}


def _rerenders(nodes: list[Any]) -> dict[int, int]:
    """{re-render node: the sampled node it re-renders}: a node that is not sampled, holds token
    ids and carries the same message as an earlier sibling (same parent) that was sampled and has
    no children (verifiers' fork on a renderer-level break)."""
    children: dict[int | None, list[int]] = {}
    for i, n in enumerate(nodes):
        children.setdefault(n.get("parent"), []).append(i)
    out: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.get("sampled") or not n.get("token_ids"):
            continue
        for j in children.get(n.get("parent"), []):
            m = nodes[j]
            if (
                j < i
                and m.get("sampled")
                and m.get("token_ids")
                and j not in children
                and j not in out.values()
                and _plain(m["message"]) == _plain(n["message"])
            ):
                out[i] = j
                break
    return out


def _joined_paths(paths: list[list[int]], rerenders: dict[int, int]) -> list[list[int]]:
    """The branches with each re-render preceded by the sampled node it re-renders; the sampled
    node's own branch (that node as its leaf) is then part of the joined one and left out."""
    if not rerenders:
        return paths
    joined_leaves = set(rerenders.values())
    out = []
    for path in paths:
        if path[-1] in joined_leaves:
            continue
        new: list[int] = []
        for nid in path:
            if nid in rerenders:
                new.append(rerenders[nid])
            new.append(nid)
        out.append(new)
    return out


def _compact(node: dict[str, Any], key: str, n_sampled: int, rec: Record, f: str) -> list[float] | None:
    v = node.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise rec.error("wrong_type", f"field `{f}.{key}` must be a list of numbers.", f"{f}.{key}")
    if len(v) != n_sampled:
        raise rec.error(
            "length_mismatch",
            f"field `{f}.{key}` has {len(v)} entries for {n_sampled} sampled tokens (the true entries of `mask`).",
            f"{f}.{key}",
        )
    return [float(x) for x in v]


def _rerendered(
    node: dict[str, Any], ids: list[int], sampled_len: int, turn: int
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A re-render node read after the sampled node it re-renders (the row ``ids`` ends with that
    node's ``sampled_len`` ids): the node reduced to what it adds after the re-render (prompt), and
    the ``meta.drift`` entry of the turn whose prompt made it (None when it re-renders nothing)."""
    prompt = ids[: len(ids) - sampled_len] + list(node.get("token_ids") or [])
    d = align_turn(ids, prompt)
    new = prompt[len(ids) :] if d is None else prompt[d.new_from :]
    view = {
        **node,
        "token_ids": new,
        "mask": [False] * len(new),
        "logprobs": [],
        "advantages": None,
        "reference_logprobs": None,
        "loss_weights": None,
    }
    return view, (None if d is None else d.as_meta(turn=turn + 1, position=d.start))


def _token_branch(
    nodes: list[dict[str, Any]],
    path: list[int],
    rec: Record,
    meta: dict[str, Any],
    rerenders: dict[int, int] | None = None,
) -> tuple[list[int], list[Kind], list[int], dict[str, list[float] | None], dict[str, list[float]]]:
    ids: list[int] = []
    kinds: list[Kind] = []
    turns: list[int] = []
    rows: dict[str, list[float]] = {"logprobs": [], "advantages": [], "ref_logprobs": []}
    have = {"logprobs": True, "advantages": True, "ref_logprobs": True}
    unassigned: list[int] = []
    misaligned: list[int] = []
    reasons: list[str] = []
    weights: dict[str, list[float]] = {}
    turn = -1
    drift: list[dict[str, Any]] = []
    prev: int | None = None
    for nid in path:
        node, f = nodes[nid], f"nodes[{nid}]"
        if rerenders and rerenders.get(nid) == prev and prev is not None:
            node, d = _rerendered(node, ids, len(nodes[prev].get("token_ids") or []), turn)
            if d is not None:
                drift.append(d)
        prev = nid
        tok = node.get("token_ids") or []
        if not isinstance(tok, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in tok):
            raise rec.error(
                "wrong_type", f"field `{f}.token_ids` must be a list of token ids.", f"{f}.token_ids"
            )
        raw_mask = node.get("mask") or []
        mask = [bool(x) for x in raw_mask[: len(tok)]] + [False] * (len(tok) - len(raw_mask))
        start = len(ids)
        if len(raw_mask) != len(tok):
            reasons.append(f"`{f}.mask` has {len(raw_mask)} entries for {len(tok)} token ids")
            misaligned += [start + k for k in range(min(len(raw_mask), len(tok)), len(tok))] or [
                start + len(tok) - 1
            ]
        sampled = bool(node.get("sampled"))
        role = str(node["message"].get("role", ""))
        if sampled:
            turn += 1
        elif any(mask):  # an input message's tokens made trainable
            reasons.append(f"`{f}.mask` makes tokens of a {role or 'input'} message (not sampled) trainable")
            misaligned += [start + k for k, m in enumerate(mask) if m]
            mask = [False] * len(tok)
        n_s = sum(mask)
        off: Kind = "tool" if role == "tool" else "prompt"
        ids += tok
        kinds += ["policy" if m else off for m in mask]
        turns += [turn if m else -1 for m in mask]
        for key, dst in (
            ("logprobs", "logprobs"),
            ("advantages", "advantages"),
            ("reference_logprobs", "ref_logprobs"),
        ):
            vals = _compact(node, key, sum(bool(x) for x in raw_mask[: len(tok)]), rec, f) if n_s else None
            if vals is not None and len(vals) != n_s:
                vals = None  # the mask was cleared above: the compact values no longer have a home
            if n_s and vals is None:
                have[dst] = False
                if key == "advantages" and sampled:
                    unassigned.append(turn)
            it = iter(vals or [])
            rows[dst] += [next(it) if m else 0.0 for m in mask] if vals is not None else [0.0] * len(tok)
        lw = node.get("loss_weights")
        if isinstance(lw, dict):
            for name, w in lw.items():
                if isinstance(w, list) and len(w) == len(tok):
                    weights.setdefault(name, [0.0] * start).extend(float(x) for x in w)
        for name in weights:
            weights[name] += [0.0] * (len(ids) - len(weights[name]))
    if drift:
        meta["drift"] = drift
    if unassigned:
        meta["advantages_unassigned"] = unassigned
    if reasons:
        meta["mask_misaligned"] = {"reason": "; ".join(reasons), "at": misaligned}
    has_policy = "policy" in kinds
    fields = {k: (rows[k] if have[k] and has_policy else None) for k in rows}
    return ids, kinds, turns, fields, weights


def _text_branch(nodes: list[dict[str, Any]], path: list[int]) -> SpanBuilder:
    b = SpanBuilder()
    for nid in path:
        node = nodes[nid]
        msg = node["message"]
        role = str(msg.get("role", "user"))
        text = _text(msg.get("content"))
        calls = msg.get("tool_calls") or []
        if node.get("sampled"):
            b.open_assistant()
            b.text(text, "policy")
            for c in calls if isinstance(calls, list) else []:
                if isinstance(c, str):  # a call kept as its JSON string
                    b.text(f"<tool_call> {c}</tool_call>", "policy")
                elif isinstance(c, dict):
                    name = str(c.get("name") or (c.get("function") or {}).get("name", ""))
                    args = c.get("arguments", (c.get("function") or {}).get("arguments"))
                    b.text(f"<tool_call> {name} {arguments_text(args)}</tool_call>", "policy")
            b.add(["<|end|>"], "policy")
            b.add(["\n"], "prompt")
            b.end_turn()
        else:
            b.message(role, text, "tool" if role == "tool" else "prompt")
    return b


def _reward(obj: dict[str, Any], rec: Record) -> float | None:
    rewards = obj.get("rewards")
    if not isinstance(rewards, dict):
        return None
    total, seen = 0.0, False
    for name, r in rewards.items():
        if r is None:
            continue
        if not isinstance(r, dict):
            raise rec.error(
                "wrong_type", f"field `rewards.{name}` must be an object or null.", f"rewards.{name}"
            )
        v = r.get("value")
        if v is None and isinstance(r.get("score"), (int, float)):
            v = float(r["score"]) * float(r.get("weight", 1.0))
        if isinstance(v, (int, float)):
            total, seen = total + float(v), True
    return total if seen else None


def episodes(doc: Document, tokenizer: TokenDecoder | None) -> Iterator[Pair]:
    for rec in doc.records():
        obj = rec.obj
        if not isinstance(obj, dict) or not isinstance(obj.get("nodes"), list):
            raise rec.error(
                "missing_field", "required field `nodes` (the trace's message graph) is missing.", "nodes"
            )
        nodes: list[dict[str, Any]] = obj["nodes"]
        reward = _reward(obj, rec)
        task = obj.get("task") if isinstance(obj.get("task"), dict) else {}
        assert isinstance(task, dict)
        gid = task.get("example_id", task.get("id"))
        base: dict[str, Any] = {
            k: v for k, v in obj.items() if isinstance(v, (str, int, float, bool)) and k not in ("version",)
        }
        base["trace_version"] = obj.get("version")
        if isinstance(obj.get("metrics"), dict):
            base["metrics"] = obj["metrics"]
        paths = _branches(nodes, rec)
        rerenders = _rerenders(nodes)
        for bi, path in enumerate(_joined_paths(paths, rerenders)):
            meta = dict(base, branch=bi)
            first = _text(nodes[path[0]]["message"].get("content")) if path else ""
            group = str(gid) if gid is not None else short_hash(first)
            truncated = obj.get("stop_condition") in TRUNCATING
            if any(nodes[n].get("token_ids") for n in path):
                ids, kinds, turns, fields, weights = _token_branch(nodes, path, rec, meta, rerenders)
                if weights:
                    meta["token_signals"] = weights
                tokens = shown_tokens(ids, tokenizer, meta)
                name_rerenders(meta.get("drift", []), tokenizer)
                yield (
                    rec.line,
                    EpisodeIn.model_construct(
                        tokens=tokens,
                        kinds=kinds,
                        turn_ids=turns,
                        token_ids=ids,
                        reward=reward,
                        group=group,
                        truncated=truncated,
                        meta=meta,
                        logprobs=fields["logprobs"],
                        advantages=fields["advantages"],
                        ref_logprobs=fields["ref_logprobs"],
                    ),
                )
            else:
                yield (
                    rec.line,
                    _text_branch(nodes, path).episode(
                        reward=reward, group=group, truncated=truncated, meta=meta
                    ),
                )


register_format(
    name="verifiers_trace",
    description=(
        "verifiers v1 traces JSONL (Trace.to_record: nodes[] MessageNode with token_ids, mask, logprobs, "
        "advantages (null = unassigned), rewards)"
    ),
    priority=28,
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
)
