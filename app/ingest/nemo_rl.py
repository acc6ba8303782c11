"""NeMo-RL ``train_data_step{N}.jsonl``: ``token_ids``, ``token_loss_mask``, ``rewards``,
``advantages``, ``generation_logprobs``, ``prev_logprobs``, ``input_lengths``, ``content``.

Tokens are shown as ids (``⟨1234⟩``) unless the record carries ``tokens`` (strings) or the upload
a ``tokenizer.json``. ``token_loss_mask`` 1 -> policy; 0 before the first policy token -> prompt, after it ->
tool. ``input_lengths`` cuts padding. ``rewards`` is the per-sample outcome reward (a per-token
list of the same length is taken as per-token rewards); ``prev_logprobs`` (the training
policy's) become ``logprobs`` and ``generation_logprobs`` (the generation engine's)
``rollout_logprobs``; with only one of them it is ``logprobs``. ``reference_policy_logprobs``
become ``ref_logprobs``; the ids ``token_ids``; the logged ``advantages`` become ``advantages``,
offered as the scheme ``uploaded``. Group: ``group``/``idx`` if
present, else a hash of the prompt token ids."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.core.schemas import EpisodeIn
from app.ingest._common import (
    Record,
    as_float,
    float_list,
    id_token,
    mask_kinds,
    scalar_meta,
    short_hash,
)
from app.ingest._document import Document
from app.ingest._registry import register_format
from app.ingest._tokenizer import TokenDecoder
from creditlens.keys import NEMO_RL, first_key

NAME = "nemo_rl"


def sniff(doc: Document) -> bool:
    first = doc.first
    return isinstance(first, dict) and "token_ids" in first and "token_loss_mask" in first


def _int_list(value: Any, rec: Record, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, (int, bool)) for v in value):
        raise rec.error("wrong_type", f"field `{name}` must be a list of integers.", name)
    return [int(v) for v in value]


def _key(obj: dict[str, Any], field: str) -> str:
    """NeMo-RL's key for ``field`` (creditlens.keys.NEMO_RL) that the record has, else the first."""
    return first_key(NEMO_RL, field, obj) or NEMO_RL[field][0]


def episode_from_record(rec: Record, tokenizer: TokenDecoder | None = None) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict):
        raise rec.error("wrong_type", "expected a JSON object with `token_ids` and `token_loss_mask`.")
    ids_key, mask_key, len_key = _key(obj, "token_ids"), _key(obj, "loss_mask"), _key(obj, "length")
    ids = _int_list(obj.get(ids_key), rec, ids_key)
    mask = _int_list(obj.get(mask_key), rec, mask_key)
    n = len(ids)
    if len(mask) != n:
        raise rec.error(
            "length_mismatch",
            f"field `{mask_key}` has {len(mask)} entries but `{ids_key}` has {n}.",
            mask_key,
        )
    length = obj.get(len_key)
    if isinstance(length, list) and len(length) == 1:
        length = length[0]
    if length is not None:
        if not isinstance(length, int) or not 0 < length <= n:
            raise rec.error(
                "wrong_type",
                f"field `{len_key}` is {length!r}; expected an integer in 1..{n}.",
                len_key,
            )
        n = length
    ids, mask = ids[:n], mask[:n]
    tokens = obj.get("tokens")
    if not (isinstance(tokens, list) and len(tokens) >= n and all(isinstance(t, str) for t in tokens[:n])):
        tokens = None
    special = None
    if tokens is not None:
        tokens = tokens[:n]
    elif tokenizer is not None:
        tokens, special = tokenizer.row(np.asarray(ids, dtype=np.int64))
    else:
        tokens = [id_token(i) for i in ids]

    def per_token(field: str) -> list[float] | None:
        name = _key(obj, field)
        v = obj.get(name)
        if v is None:
            return None
        return float_list(v[:n] if isinstance(v, list) and len(v) >= n else v, rec, name, n, ids_key)

    reward_key = _key(obj, "reward")
    rewards_field = obj.get(reward_key)
    reward = rewards = None
    if isinstance(rewards_field, list) and len(rewards_field) == 1:
        rewards_field = rewards_field[0]
    if isinstance(rewards_field, list):
        rewards = per_token("reward")
    else:
        reward = as_float(rewards_field, rec, reward_key)
    # With both, the training policy's are `logprobs` and the engine's (vLLM) `rollout_logprobs`:
    # their ratio is the rollout/training mismatch. With one of them, it is `logprobs`.
    logprobs, rollout_logprobs = per_token("logprobs"), per_token("rollout_logprobs")
    if logprobs is None:
        logprobs, rollout_logprobs = rollout_logprobs, None
    meta = scalar_meta(obj, {*NEMO_RL["reward"], *NEMO_RL["length"], *NEMO_RL["group"]})
    if isinstance(obj.get("content"), (list, str)):
        meta["content"] = obj["content"]
    meta["source"] = f"upload:{NAME}"
    if special:
        meta["special_tokens"] = special
    kinds = mask_kinds(mask)
    first_policy = kinds.index("policy") if "policy" in kinds else n
    group = obj.get(_key(obj, "group"))
    if group is None:
        group = short_hash(",".join(map(str, ids[:first_policy])))
    return EpisodeIn.model_construct(
        tokens=tokens,
        kinds=kinds,
        reward=reward,
        rewards=rewards,
        values=per_token("values"),
        logprobs=logprobs,
        advantages=per_token("advantages"),
        ref_logprobs=per_token("ref_logprobs"),
        rollout_logprobs=rollout_logprobs,
        token_ids=ids,
        group=str(group),
        meta=meta,
    )


register_format(
    name=NAME,
    description=(
        "NeMo-RL train_data JSONL (token_ids, token_loss_mask, rewards, advantages, generation_logprobs)"
    ),
    priority=50,
    sniff=sniff,
    record=episode_from_record,
    takes_tokenizer=True,
)
