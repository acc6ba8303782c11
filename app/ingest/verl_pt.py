"""verl batches saved with ``torch.save``: a dict (or ``{"batch": ..., "non_tensor_batch": ...}``,
as ``DataProto`` keeps them) holding

* ``prompts`` [B, P] and ``responses`` [B, R] token ids, ``response_mask`` [B, R] (1 = LLM token,
  0 = tool token or padding), optional ``attention_mask`` [B, P + R] (marks padding);
* ``token_level_rewards`` (else ``token_level_scores``) [B, R]; optional ``values``,
  ``old_log_probs`` (-> ``logprobs``), ``ref_log_prob`` (-> ``ref_logprobs``),
  ``rollout_log_probs`` (-> ``rollout_logprobs``), ``entropys`` (-> ``entropy``) and
  ``advantages`` (the trainer's own, offered as the scheme ``uploaded``) [B, R];
* or an actor micro-batch (``update_policy``'s input): ``input_ids`` (or ``inputs_ids``) [B, L]
  whose last R positions are ``responses`` [B, R], ``attention_mask`` [B, L], ``old_log_prob`` (or
  ``old_log_probs``), ``advantages``, optional ``response_mask`` (default: the response part of
  ``attention_mask``), ``values``, ``returns`` (kept in ``meta.returns``) [B, R];
* optional ``uid`` (GRPO group ids: a list of str, or an int tensor), ``vocab`` (list of str,
  id -> token), ``pad_token_id``.

Loaded with ``torch.load(..., weights_only=True)``: tensors, lists, dicts, str and numbers only,
never arbitrary pickled objects (a numpy object array of uids is refused; save ``list(uids)``).
The ids are kept as ``token_ids``; tokens are shown as the pieces of the ``tokenizer.json`` sent
with the upload (special tokens marked in ``meta.special_tokens``), else of ``vocab``, else as
``⟨id⟩``. Padding is cut using ``attention_mask``, else prompt ids equal to ``pad_token_id`` and
the response after its last masked-in token.
Zeros of ``response_mask`` inside the response are tool tokens.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.core.errors import ApiError, located
from app.core.schemas import Kind
from app.ingest._common import id_token
from app.ingest._damage import torch_load_damage
from app.ingest._document import Document
from app.ingest._ids import dump_episode
from app.ingest._registry import Pair, register_format
from app.ingest._tokenizer import TokenDecoder
from creditlens.keys import VERL, VERL_PER_TOKEN, first_key

if TYPE_CHECKING:
    import torch

NAME = "verl_pt"
_ZIP = b"PK\x03\x04"
_PARTS = ("batch", "non_tensor_batch", "meta_info")


def sniff(doc: Document) -> bool:
    # torch.save writes a zip archive (or, with the legacy format, a pickle starting with 0x80);
    # its zip holds `<archive>/data.pkl` (any other zip, e.g. Inspect's .eval, is not torch's).
    names = doc.zip_names
    torch_zip = names is None or any(n == "data.pkl" or n.endswith("/data.pkl") for n in names)
    return (doc.is_zip and torch_zip) or doc.data[:1] == b"\x80"


def _err(message: str, field: str | None = None, episode: int | None = None) -> ApiError:
    return located(422, "bad_verl_batch", message, field=field, episode=episode)


def load(data: bytes) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of the upload: a dict, else 422 ``bad_verl_batch``."""
    import torch

    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for disallowed globals, RuntimeError for junk
        if (cut := torch_load_damage(e)) is not None:
            raise cut from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ApiError(
            422,
            "bad_verl_batch",
            "could not load this file with torch.load(weights_only=True): "
            f"{first}. Save a dict of tensors, lists and strings (e.g. uid as a list of str).",
        ) from None
    if not isinstance(obj, dict):
        raise _err(f"expected a dict of tensors, got {type(obj).__name__}.")
    return obj


def normalise(obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(one flat dict of a batch's keys, whether it was an actor micro-batch): ``DataProto``'s
    ``batch``/``non_tensor_batch``/``meta_info`` merged with the top level, and a micro-batch
    given ``prompts`` and ``response_mask`` as a batch has them."""
    d: dict[str, Any] = {}
    for part in _PARTS:
        if isinstance(obj.get(part), dict):
            d.update(obj[part])
    d.update({k: v for k, v in obj.items() if k not in _PARTS})
    micro = "prompts" not in d and first_key(VERL, "input_ids", d) is not None and "responses" in d
    return (_from_actor_micro_batch(d) if micro else d), micro


def _from_actor_micro_batch(d: dict[str, Any]) -> dict[str, Any]:
    """The fields of an actor's micro-batch (what ``DataParallelPPOActor.update_policy`` feeds the
    model: ``input_ids`` [B, L], ``responses`` [B, R], ``attention_mask`` [B, L], ``old_log_prob(s)``,
    ``advantages``, optional ``response_mask``, ``values``, ``returns`` [B, R]) as a batch: the
    response is the last R positions of ``input_ids``, the prompt the L - R before it."""
    import torch

    key = first_key(VERL, "input_ids", d) or "input_ids"
    ids = torch.as_tensor(d[key])
    responses = torch.as_tensor(d["responses"])
    if ids.dim() != 2 or responses.dim() != 2 or responses.shape[0] != ids.shape[0]:
        raise _err(
            f"fields `{key}` and `responses` must be 2-D [B, L] and [B, R] tensors with the same B; "
            f"got {tuple(ids.shape)} and {tuple(responses.shape)}.",
            key,
        )
    L, R = ids.shape[1], responses.shape[1]
    if R > L:
        raise _err(f"field `responses` has {R} positions but `{key}` only {L}.", "responses")
    if not torch.equal(ids[:, L - R :], responses):
        row = int(torch.nonzero((ids[:, L - R :] != responses).any(dim=1))[0])
        raise located(
            422,
            "bad_verl_batch",
            f"the last {R} positions of `{key}` differ from `responses` in row {row}; an actor "
            "micro-batch's input ids end with its response ids.",
            field=key,
            episode=row + 1,
        )
    out = dict(d)
    out["prompts"] = ids[:, : L - R]
    if "response_mask" not in out:
        if "attention_mask" not in out:
            raise _err(
                "an actor micro-batch needs `response_mask` or `attention_mask` (which tokens count).",
                "response_mask",
            )
        out["response_mask"] = torch.as_tensor(out["attention_mask"])[:, L - R :]
    return out


@dataclass
class Batch:
    """A validated verl batch: [B, P] prompts, [B, R] responses and response mask, the per-token
    tensors by native field (float64), the optional [B, P + R] attention mask and the rest."""

    prompts: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    per_token: dict[str, torch.Tensor]
    attention_mask: torch.Tensor | None
    uid: list[Any] | None
    vocab: Any
    pad_token_id: Any
    step: Any
    micro: bool


def validate(d: dict[str, Any], micro: bool = False) -> Batch:
    """The batch of a normalised dict (:func:`normalise`), every shape checked; 422 naming the
    field otherwise."""
    import torch

    for k in ("prompts", "responses", "response_mask"):
        if k not in d:
            raise _err(f"field `{k}` is missing; a verl batch needs prompts, responses and response_mask.", k)
    prompts = torch.as_tensor(d["prompts"])
    responses = torch.as_tensor(d["responses"])
    rmask = torch.as_tensor(d["response_mask"])
    if prompts.dim() != 2 or responses.dim() != 2:
        raise _err("fields `prompts` and `responses` must be 2-D [B, P] and [B, R] tensors.", "responses")
    B, P = prompts.shape
    R = responses.shape[1]
    if tuple(rmask.shape) != (B, R):
        raise _err(
            f"field `response_mask` has shape {tuple(rmask.shape)} but `responses` has {(B, R)}.",
            "response_mask",
        )
    per_token = {}
    for name in VERL_PER_TOKEN:
        key = first_key(VERL_PER_TOKEN, name, d)
        if key is None:
            continue
        t = torch.as_tensor(d[key]).to(torch.float64)
        if tuple(t.shape) != (B, R):
            raise _err(f"field `{key}` has shape {tuple(t.shape)} but `responses` has {(B, R)}.", key)
        per_token[name] = t
    attn = torch.as_tensor(d["attention_mask"]) if "attention_mask" in d else None
    if attn is not None and tuple(attn.shape) != (B, P + R):
        raise _err(
            f"field `attention_mask` has shape {tuple(attn.shape)}; expected {(B, P + R)}.", "attention_mask"
        )
    uid = d.get("uid")
    if uid is not None:
        uid = uid.tolist() if hasattr(uid, "tolist") else list(uid)
        if len(uid) != B:
            raise _err(f"field `uid` has {len(uid)} entries but the batch has {B} rows.", "uid")
    step_key = first_key(VERL, "step", d)
    return Batch(
        prompts=prompts,
        responses=responses,
        response_mask=rmask,
        per_token=per_token,
        attention_mask=attn,
        uid=uid,
        vocab=d.get("vocab"),
        pad_token_id=d.get("pad_token_id"),
        step=None if step_key is None else d[step_key],
        micro=micro,
    )


def rows(batch: Batch, tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
    """One native episode per row, padding cut (by ``attention_mask``, else the pad id and the
    response after its last masked-in token)."""
    import torch

    P = batch.prompts.shape[1]
    R = batch.responses.shape[1]
    attn = batch.attention_mask
    for b in range(batch.prompts.shape[0]):
        p_ids = batch.prompts[b]
        if attn is not None:
            p_keep = attn[b, :P] != 0
            r_keep = attn[b, P:] != 0
        else:
            pad = batch.pad_token_id
            p_keep = p_ids != pad if pad is not None else torch.ones(P, dtype=torch.bool)
            nz = torch.nonzero(batch.response_mask[b]).flatten()
            r_keep = torch.zeros(R, dtype=torch.bool)
            if len(nz):
                r_keep[: int(nz[-1]) + 1] = True
        p_list = p_ids[p_keep].tolist()
        ids = p_list + batch.responses[b][r_keep].tolist()
        m = batch.response_mask[b][r_keep].tolist()
        special = None
        if tokenizer is not None:
            tokens, special = tokenizer.row(np.asarray(ids, dtype=np.int64))
        else:
            tokens = [id_token(i, batch.vocab) for i in ids]
        zeros = [0.0] * len(p_list)
        arrays = {name: zeros + t[b][r_keep].tolist() for name, t in batch.per_token.items()}
        meta: dict[str, Any] = {"source": f"upload:{NAME}", "row": b}
        if "returns" in arrays:
            meta["returns"] = arrays["returns"]
        if batch.micro:
            meta["verl_input"] = "actor micro-batch"
        if isinstance(batch.step, (int, float)):
            meta["step"] = batch.step
        if special:
            meta["special_tokens"] = special
        kinds: list[Kind] = ["prompt"] * len(p_list)
        kinds += ["policy" if x else "tool" for x in m]
        yield (
            None,
            dump_episode(
                tokens,
                kinds,
                ids,
                group=None if batch.uid is None else str(batch.uid[b]),
                meta=meta,
                signals=arrays,
            ),
        )


def episodes(doc: Document, tokenizer: TokenDecoder | None = None) -> Iterator[Pair]:
    """Load, normalise the keys, validate, then one episode per row."""
    yield from rows(validate(*normalise(load(doc.data))), tokenizer)


register_format(
    name=NAME,
    description=(
        "verl DataProto dict saved with torch.save (prompts, responses, response_mask, "
        "token_level_rewards, values, uid)"
    ),
    priority=5,
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
)
