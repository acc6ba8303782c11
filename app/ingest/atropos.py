"""Atropos ScoredDataGroup JSONL (what an environment's ``--env.data_path_to_save_groups`` or
``process`` command writes: one group per line, atroposlib/envs/base.py ``ScoredDataGroup``).

Each line holds G sequences of one prompt, and each sequence is an episode of that group:

* ``tokens`` [G][T_i] token ids; ``masks`` [G][T_i]: ``-100`` = not trained (prompt, or an
  observation after the first trained token: tool), any other value (Atropos writes the label id
  itself, or 1) = policy;
* ``scores`` [G]: the outcome reward of each sequence;
* optional per-token lists: ``advantages`` (the trainer's, offered as the scheme ``uploaded``),
  ``ref_logprobs`` (nullable, or null per sequence), ``inference_logprobs`` (-> ``logprobs``),
  ``token_scores`` and ``token_weights`` (shown as the signal rows of those names, kept in
  ``meta.token_signals``). An empty list means "not given";
* ``messages`` [G] (chat messages or the decoded text) and ``overrides`` [G] go to meta.

The group is the line (``line-3``): a ScoredDataGroup is one prompt's group. Tokens are shown
as the pieces of the ``tokenizer.json`` sent with the upload, else ``⟨id⟩``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from app.core.errors import ApiError, located
from app.core.schemas import EpisodeIn, Kind
from app.ingest._common import Record, float_list, id_token, scalar_meta
from app.ingest._document import Document
from app.ingest._registry import Pair, register_format
from app.ingest._tokenizer import TokenDecoder

NOT_TRAINED = -100
PER_TOKEN = ("advantages", "ref_logprobs", "inference_logprobs", "token_scores", "token_weights")


def sniff(doc: Document) -> bool:
    first = doc.first
    if not isinstance(first, dict):
        return False
    toks = first.get("tokens")
    return (
        isinstance(toks, list)
        and "masks" in first
        and "scores" in first
        and (not toks or isinstance(toks[0], list))
    )


def _err(rec: Record, episode: int, code: str, message: str, field: str) -> ApiError:
    return located(422, code, message, field=field, line=rec.line, episode=episode)


def _ints(v: Any, rec: Record, ep: int, field: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise _err(rec, ep, "wrong_type", f"field `{field}` must be a list of integers.", field)
    return v


def episodes_of_group(
    rec: Record, first_episode: int, tokenizer: TokenDecoder | None = None
) -> Iterator[EpisodeIn]:
    """The G episodes of one ScoredDataGroup record, numbered from ``first_episode``."""
    obj = rec.obj
    if not isinstance(obj, dict):
        raise rec.error("wrong_type", "expected a JSON object (a ScoredDataGroup) per line.")
    for key in ("tokens", "masks", "scores"):
        if not isinstance(obj.get(key), list):
            raise _err(
                rec, first_episode, "missing_field", f"required field `{key}` (a list) is missing.", key
            )
    tokens, masks, scores = obj["tokens"], obj["masks"], obj["scores"]
    G = len(tokens)
    for key, v in (("masks", masks), ("scores", scores)):
        if len(v) != G:
            raise _err(
                rec,
                first_episode,
                "length_mismatch",
                f"field `{key}` has {len(v)} entries but `tokens` has {G} sequences; one per sequence.",
                key,
            )
    extras = {}
    for key in PER_TOKEN:
        v = obj.get(key)
        if v is None or v == []:
            continue
        if not isinstance(v, list) or len(v) != G:
            raise _err(
                rec,
                first_episode,
                "length_mismatch",
                f"field `{key}` must hold one list per sequence ({G}).",
                key,
            )
        extras[key] = v
    msgs = obj.get("messages") if isinstance(obj.get("messages"), list) else None
    overrides = obj.get("overrides") if isinstance(obj.get("overrides"), list) else None
    group = f"line-{rec.line if rec.line is not None else rec.episode}"
    group_meta = scalar_meta(obj, set())
    for g in range(G):
        ep_no = first_episode + g
        ids = _ints(tokens[g], rec, ep_no, f"tokens[{g}]")
        mask = _ints(masks[g], rec, ep_no, f"masks[{g}]")
        n = len(ids)
        if len(mask) != n:
            raise _err(
                rec,
                ep_no,
                "length_mismatch",
                f"field `masks[{g}]` has {len(mask)} entries but `tokens[{g}]` has {n}.",
                f"masks[{g}]",
            )
        score = scores[g]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise _err(
                rec, ep_no, "wrong_type", f"field `scores[{g}]` is {score!r}; expected a number.", "scores"
            )
        where = Record(rec.line, ep_no, obj)
        rows = {k: float_list(v[g], where, f"{k}[{g}]", n, f"tokens[{g}]") for k, v in extras.items()}
        kinds: list[Kind] = []
        seen = False
        for m in mask:
            if m != NOT_TRAINED:
                seen = True
                kinds.append("policy")
            else:
                kinds.append("tool" if seen else "prompt")
        meta: dict[str, Any] = dict(group_meta)
        meta["index_in_group"] = g
        if msgs is not None and g < len(msgs) and msgs[g] is not None:
            meta["messages"] = msgs[g]
        if overrides is not None and g < len(overrides) and isinstance(overrides[g], dict):
            meta["overrides"] = overrides[g]
        signals = {k: rows[k] for k in ("token_scores", "token_weights") if rows.get(k) is not None}
        if signals:
            meta["token_signals"] = signals
        special = None
        if tokenizer is not None:
            toks, special = tokenizer.row(np.asarray(ids, dtype=np.int64))
        else:
            toks = [id_token(i) for i in ids]
        if special:
            meta["special_tokens"] = special
        yield EpisodeIn.model_construct(
            tokens=toks,
            kinds=kinds,
            reward=float(score),
            logprobs=rows.get("inference_logprobs"),
            advantages=rows.get("advantages"),
            ref_logprobs=rows.get("ref_logprobs"),
            token_ids=ids,
            group=group,
            meta=meta,
        )


def episodes(doc: Document, tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
    """(line, episode) pairs: every sequence of every group, in file order."""
    n = 1
    for rec in doc.records():
        for ep in episodes_of_group(rec, n, tokenizer):
            yield rec.line, ep
            n += 1


register_format(
    name="atropos",
    description="Atropos ScoredDataGroup JSONL (one group per line: tokens, masks with -100, scores, messages)",
    priority=12,
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
)
