"""RL Logging Board JSONL (the de-facto token-level PPO dump): ``prompt``, ``response``,
``response_tokens`` (list of str), ``logprobs``, ``ref_logprobs``, ``values``, ``token_rewards``,
``reward``, ``step``.

The prompt is tokenised with the offline tokenizer (prompt tokens); ``response_tokens`` are the
policy tokens (or, if absent, ``response`` tokenised). Per-token arrays are given on the response
only; prompt positions get 0. When ``token_rewards`` is present it already carries the reward (it
is what PPO trained on), so it becomes ``rewards`` and the logged ``reward`` is kept as
``meta.reward``; otherwise ``reward`` is the outcome reward. Group: ``group`` or a hash of the prompt.
"""

from __future__ import annotations

from app.core.schemas import EpisodeIn, Kind
from app.core.tokenize import tokenize
from app.ingest._common import Record, as_float, float_list, scalar_meta, short_hash
from app.ingest._document import Document
from app.ingest._registry import register_format

NAME = "rl_logging_board"


def sniff(doc: Document) -> bool:
    return isinstance(doc.first, dict) and "response_tokens" in doc.first


def episode_from_record(rec: Record) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict):
        raise rec.error("wrong_type", "expected a JSON object with `prompt` and `response_tokens`.")
    prompt_text = obj.get("prompt", "")
    if not isinstance(prompt_text, str):
        raise rec.error("wrong_type", "field `prompt` must be a string.", "prompt")
    resp = obj.get("response_tokens")
    if resp is None:
        if not isinstance(obj.get("response"), str):
            raise rec.error(
                "missing_field", "field `response_tokens` (or `response`) is missing.", "response_tokens"
            )
        resp = tokenize(obj["response"])
    if not isinstance(resp, list) or not all(isinstance(t, str) for t in resp):
        raise rec.error("wrong_type", "field `response_tokens` must be a list of strings.", "response_tokens")
    n = len(resp)
    prompt = tokenize(prompt_text)
    pad = [0.0] * len(prompt)
    arrays = {}
    for name in ("values", "logprobs", "token_rewards"):
        arr = float_list(obj.get(name), rec, name, n, "response_tokens")
        arrays[name] = None if arr is None else pad + arr
    reward = as_float(obj.get("reward"), rec, "reward")
    meta = scalar_meta(obj, {"prompt", "response", "reward", "group"})
    meta["source"] = f"upload:{NAME}"
    if arrays["token_rewards"] is not None and reward is not None:
        meta["reward"] = reward
        reward = None
    kinds: list[Kind] = ["prompt"] * len(prompt)
    kinds += ["policy"] * n
    return EpisodeIn.model_construct(
        tokens=prompt + resp,
        kinds=kinds,
        reward=reward,
        rewards=arrays["token_rewards"],
        values=arrays["values"],
        logprobs=arrays["logprobs"],
        group=str(obj.get("group") or short_hash(prompt_text)),
        meta=meta,
    )


register_format(
    name=NAME,
    description="RL Logging Board JSONL (prompt, response_tokens, logprobs, values, token_rewards, reward)",
    priority=40,
    sniff=sniff,
    record=episode_from_record,
)
