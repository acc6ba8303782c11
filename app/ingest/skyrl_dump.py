"""SkyRL dumps: ``{trainer.export_path}/dumped_data/global_step_{N}_training_input.pkl``
(``trainer.dump_data_batch=true``), read with
the restricted unpickler (app/ingest/_unpickle.py): nothing in the pickle runs, and a pickle that
asks for anything beyond plain containers, numbers, strings, numpy arrays, torch tensors and
SkyRL's own batch classes is refused by name. SkyRL's ``TrainingInputBatch`` / ``TensorBatch``
(``skyrl_train.training_batch``, a ``dict`` of [B, ...] tensors with ``metadata``) and
``torch.device`` are built as inert stand-ins: their tensors and metadata are read, no method of
theirs exists here.

Two shapes:

* a training batch (``global_step_N_training_input.pkl``): ``sequences`` [B, P + R] (prompts
  left-padded, responses right-padded), ``attention_mask`` [B, P + R], and the response-side
  fields [B, R] (R = ``metadata.response_length``, else their width): ``response_mask``,
  ``loss_mask`` (1 -> policy, 0 inside the response -> tool: the environment's turns), ``advantages``
  (the scheme ``uploaded``), ``rewards`` (per token), ``action_log_probs`` -> ``logprobs``,
  ``rollout_logprobs`` -> ``rollout_logprobs``, ``base_action_log_probs`` -> ``ref_logprobs``,
  ``values``; ``returns`` is kept in ``meta.token_signals``. The prompt's tokens are those of
  ``attention_mask`` 1 left of the response; the group is ``metadata.uids[i]``;
* a generator output (``GeneratorOutput``, a dict of per-sample lists): ``prompt_token_ids``,
  ``response_ids``, ``loss_masks``, ``rewards`` (per token, or one per sample), optional
  ``rollout_logprobs``; group: the hash of the prompt ids.

Step-wise training (``generator.step_wise_trajectories``) writes one sample per turn: its prompt is
the whole context the engine got, its response that turn's ids, and ``trajectory_ids``
(``TrajectoryID``: ``instance_id``, ``repetition_id``; in a training batch ``metadata``) with
``is_last_step`` say which samples are the turns of one trajectory (a training batch without
``trajectory_ids``: its consecutive rows up to each ``is_last_step``). Those samples are joined into
one episode as it was sampled (token-in/token-out, app/ingest/_drift.py): each turn's response ids
are its policy tokens (loss mask 0: tool), the new part of the next turn's prompt is tool; a prompt
that re-renders the ids sampled before it (a loop that decodes and re-encodes the history) is
accepted and measured in ``meta.drift``. The group is the trajectory's ``instance_id`` (else the
batch's ``uids`` entry).

A loss mask longer or shorter than its response is kept (missing entries untrained) with
``meta.mask_misaligned``; any other field of the wrong shape is a 422 naming it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.errors import ApiError, located
from app.core.schemas import EpisodeIn, Kind
from app.ingest._common import short_hash
from app.ingest._document import Document
from app.ingest._drift import TurnAssembler, keep_drift
from app.ingest._ids import dump_episode, shown_tokens
from app.ingest._registry import Pair, register_format
from app.ingest._tokenizer import TokenDecoder
from app.ingest._unpickle import safe_loads

MODULE = "skyrl_train.training_batch"


class _Batch(dict[str, Any]):
    """Stands in for SkyRL's ``TensorBatch`` classes: its items are the tensors, ``state`` what
    ``__getstate__`` gave (``batch_dict`` of torch.save bytes, ``metadata``)."""

    state: dict[str, Any]

    def __setstate__(self, state: Any) -> None:
        self.state = state if isinstance(state, dict) else {}


def _device(*args: Any) -> str:
    """Stands in for ``torch.device``: the device's name."""
    return ":".join(str(a) for a in args)


class _TrajectoryID:
    """Stands in for SkyRL's ``TrajectoryID`` dataclass (``skyrl_train.generators.base``): its
    ``instance_id`` and ``repetition_id``, nothing else."""

    def __init__(self, instance_id: Any = None, repetition_id: Any = None) -> None:
        self.instance_id, self.repetition_id = instance_id, repetition_id

    def __setstate__(self, state: Any) -> None:
        state = state if isinstance(state, dict) else {}
        self.instance_id, self.repetition_id = state.get("instance_id"), state.get("repetition_id")

    def __str__(self) -> str:
        return f"{self.instance_id}_{self.repetition_id}"


STAND_INS: dict[tuple[str, str], Any] = {
    (MODULE, name): _Batch for name in ("TensorBatch", "TrainingInputBatch", "TrainingOutputBatch")
}
STAND_INS[("torch", "device")] = _device
STAND_INS[("skyrl_train.generators.base", "TrajectoryID")] = _TrajectoryID

# Training batch field -> native per-token field (the response side).
NATIVE = {
    "advantages": "advantages",
    "rewards": "rewards",
    "action_log_probs": "logprobs",
    "rollout_logprobs": "rollout_logprobs",
    "base_action_log_probs": "ref_logprobs",
    "values": "values",
}
SIGNALS = ("returns",)


def sniff(doc: Document) -> bool:
    head = doc.data[:4096]
    return head[:1] == b"\x80" and (
        MODULE.encode() in head or (b"response_ids" in head and b"loss_masks" in doc.data[:65536])
    )


def _err(message: str, field: str | None = None, episode: int | None = None) -> ApiError:
    return located(422, "bad_skyrl_dump", message, field=field, episode=episode)


def _array(v: Any, name: str) -> np.ndarray:
    """A tensor, numpy array or nested list as a numpy array (float64 or int64)."""
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    try:
        return np.asarray(v)
    except (TypeError, ValueError):
        raise _err(f"field `{name}` is not an array of numbers.", name) from None


def _tensors(obj: _Batch) -> dict[str, Any]:
    """The batch's tensors: its items, else the state's ``batch_dict`` (torch.save bytes read by
    torch's weights-only loader)."""
    if len(obj):
        return dict(obj)
    out: dict[str, Any] = {}
    raw = obj.state.get("batch_dict")
    if isinstance(raw, dict):
        import torch

        for k, b in raw.items():
            if isinstance(b, (bytes, bytearray)):
                out[str(k)] = torch.load(io.BytesIO(bytes(b)), weights_only=True)
    return out


def _fit_mask(mask: list[int], n: int, start: int) -> tuple[list[int], dict[str, Any] | None]:
    """``mask`` fitted to a response of ``n`` ids starting at row position ``start``."""
    fitted = mask[:n] + [0] * (n - len(mask))
    if len(mask) == n:
        return fitted, None
    lo = len(mask) if len(mask) < n else max(0, n - (len(mask) - n))
    return fitted, {
        "reason": f"the loss mask has {len(mask)} entries for a response of {n} ids",
        "mask_length": len(mask),
        "ids_length": n,
        "at": [start + k for k in range(lo, n)],
    }


def _episode(
    prompt: list[int],
    response: list[int],
    mask: list[int],
    fields: dict[str, list[float] | None],
    signals: dict[str, list[float]],
    group: str,
    meta: dict[str, Any],
    tokenizer: TokenDecoder | None,
) -> EpisodeIn:
    ids = prompt + response
    fitted, bad = _fit_mask(mask, len(response), len(prompt))
    if bad is not None:
        meta["mask_misaligned"] = bad
    kinds: list[Kind] = ["prompt"] * len(prompt)
    seen = False
    for m in fitted:
        seen = seen or bool(m)
        kinds.append("policy" if m else ("tool" if seen else "prompt"))
    pad = [0.0] * len(prompt)
    full = {k: (None if v is None else pad + v) for k, v in fields.items()}
    if signals:
        meta["token_signals"] = {k: pad + v for k, v in signals.items()}
    tokens = shown_tokens(ids, tokenizer, meta)
    return dump_episode(tokens, kinds, ids, group=group, meta=meta, signals=full)


@dataclass
class _Sample:
    """One sample of a dump: prompt and response ids, the response's loss mask and per-token rows."""

    prompt: list[int]
    response: list[int]
    mask: list[int]
    fields: dict[str, list[float] | None]
    signals: dict[str, list[float]]
    group: str
    meta: dict[str, Any] = field(default_factory=dict)


def _trajectories(ids: Any, last: Any, n: int) -> list[list[int]] | None:
    """The sample indices of each trajectory of a step-wise dump, in order: by ``trajectory_ids``
    when there are (one per sample), else the consecutive samples up to each ``is_last_step`` (a
    training batch keeps a trajectory's steps together); None when the dump is not step-wise."""
    if last is None or not hasattr(last, "__len__") or len(last) != n:
        return None
    if not isinstance(ids, (list, tuple, np.ndarray)) or len(ids) != n:
        if ids is not None:
            return None
        ids = [None] * n
    runs: list[list[int]] = []
    open_: dict[str, list[int]] = {}
    for i, t in enumerate(ids):
        k = str(t) if t is not None else ""
        run = open_.get(k)
        if run is None:
            run = open_[k] = []
            runs.append(run)
        run.append(i)
        if bool(last[i]):
            del open_[k]  # the trajectory's last step: a later sample of that id is another one
    return runs


def _instance(t: Any) -> str | None:
    got = getattr(t, "instance_id", None)
    return None if got is None else str(got)


def _joined(samples: list[_Sample], traj: Any, tokenizer: TokenDecoder | None) -> EpisodeIn:
    """The samples of one step-wise trajectory as one episode, as it was sampled."""
    asm = TurnAssembler()
    names = {k for s in samples for k in s.fields}
    have = {k: all(s.fields.get(k) is not None for s in samples) for k in names}
    rows: dict[str, list[float]] = {k: [] for k in names}
    sig_names = {k for s in samples for k in s.signals}
    sigs: dict[str, list[float]] = {k: [] for k in sig_names}
    reasons: list[str] = []
    at: list[int] = []
    for s in samples:
        fitted, bad = _fit_mask(s.mask, len(s.response), 0)
        kinds = ["policy" if m else "tool" for m in fitted]
        n_new = asm.add_turn(s.prompt, s.response, "tool", kinds)
        start = len(asm.ids) - len(s.response)
        if bad is not None:
            reasons.append(f"step {len(reasons) + 1}: {bad['reason']}")
            at += [start + k for k in bad["at"]]
        for k in names:
            rows[k] += [0.0] * n_new + (s.fields.get(k) or [0.0] * len(s.response))
        for k in sig_names:
            sigs[k] += [0.0] * n_new + s.signals.get(k, [0.0] * len(s.response))
    first = samples[0]
    meta: dict[str, Any] = {**first.meta, "samples": [s.meta.get("sample") for s in samples]}
    meta.pop("sample", None)
    meta["trajectory"] = str(traj)
    if samples[-1].meta.get("stop_reason") is not None:
        meta["stop_reason"] = samples[-1].meta["stop_reason"]
    if reasons:
        meta["mask_misaligned"] = {"reason": "; ".join(reasons), "at": at}
    if sigs:
        meta["token_signals"] = sigs
    ids = asm.ids
    tokens = shown_tokens(ids, tokenizer, meta)
    keep_drift(meta, asm.drift, tokenizer)
    ep = dump_episode(
        tokens,
        asm.kinds,  # type: ignore[arg-type]
        ids,
        group=_instance(traj) or first.group,
        meta=meta,
        signals={k: (rows[k] if have[k] else None) for k in names},
    )
    ep.turn_ids = asm.turns
    return ep


def _emit(samples: list[_Sample], traj_ids: Any, last: Any, tokenizer: TokenDecoder | None) -> Iterator[Pair]:
    """Each sample as its episode, or each step-wise trajectory's samples joined into one."""
    runs = _trajectories(traj_ids, last, len(samples))
    if runs is None:
        for s in samples:
            yield (
                None,
                _episode(s.prompt, s.response, s.mask, s.fields, s.signals, s.group, s.meta, tokenizer),
            )
        return
    for k, run in enumerate(runs):
        traj = traj_ids[run[0]] if traj_ids is not None else f"{samples[run[0]].group}#{k}"
        yield None, _joined([samples[i] for i in run], traj, tokenizer)


def _finite_row(a: np.ndarray, name: str, i: int) -> list[float]:
    row = a.astype(np.float64)
    if not np.isfinite(row).all():
        raise _err(f"field `{name}` holds a non-finite number in sample {i + 1}.", name, i + 1)
    return [float(x) for x in row]


def _training_batch(batch: _Batch, tokenizer: TokenDecoder | None) -> Iterator[Pair]:
    t = _tensors(batch)
    got = batch.state.get("metadata")
    meta_all: dict[str, Any] = got if isinstance(got, dict) else {}
    for need in ("sequences", "attention_mask", "loss_mask"):
        if need not in t or t[need] is None:
            raise _err(f"the training batch has no `{need}`.", need)
    seq, att = _array(t["sequences"], "sequences"), _array(t["attention_mask"], "attention_mask")
    loss = _array(t["loss_mask"], "loss_mask")
    if seq.ndim != 2 or att.shape != seq.shape or loss.ndim != 2 or len(loss) != len(seq):
        raise _err(
            f"`sequences` {list(seq.shape)}, `attention_mask` {list(att.shape)} and `loss_mask` "
            f"{list(loss.shape)} must be [B, T], [B, T] and [B, R].",
            "sequences",
        )
    B, T = seq.shape
    R = int(meta_all.get("response_length") or loss.shape[1])
    if not 0 < R <= T:
        raise _err(f"`metadata.response_length` {R} does not fit `sequences` of width {T}.", "metadata")
    resp = _array(t["response_mask"], "response_mask") if t.get("response_mask") is not None else None
    uids = meta_all.get("uids")
    arrays: dict[str, np.ndarray] = {}
    for name in (*NATIVE, *SIGNALS):
        v = t.get(name)
        if v is None:
            continue
        a = _array(v, name)
        if a.shape != (B, R):
            raise _err(f"field `{name}` is {list(a.shape)}; expected [B, R] = [{B}, {R}].", name)
        arrays[name] = a
    scalars = {k: v for k, v in meta_all.items() if isinstance(v, (str, int, float, bool))}
    samples: list[_Sample] = []
    for i in range(B):
        p_part = seq[i, : T - R][att[i, : T - R] != 0]
        r_live = att[i, T - R :] != 0 if resp is None else resp[i] != 0
        n = int(r_live.sum())
        response = [int(x) for x in seq[i, T - R :][:n]]
        fields: dict[str, list[float] | None] = {v: None for v in NATIVE.values()}
        for name, dst in NATIVE.items():
            if name in arrays:
                fields[dst] = _finite_row(arrays[name][i, :n], name, i)
        signals = {s: _finite_row(arrays[s][i, :n], s, i) for s in SIGNALS if s in arrays}
        mask = [int(x) for x in loss[i, :n]]
        if int(loss[i, n:].sum()):  # trained positions past the response: the mask runs long
            mask += [1] * int((loss[i, n:] != 0).sum())
        group = str(uids[i]) if isinstance(uids, list) and i < len(uids) else short_hash(str(p_part.tolist()))
        meta = {**scalars, "sample": i}
        samples.append(_Sample([int(x) for x in p_part], response, mask, fields, signals, group, meta))
    yield from _emit(samples, meta_all.get("trajectory_ids"), meta_all.get("is_last_step"), tokenizer)


def _int_rows(out: dict[str, Any], name: str) -> list[list[int]]:
    rows = out.get(name)
    if not isinstance(rows, list) or not all(
        isinstance(r, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in r) for r in rows
    ):
        raise _err(f"field `{name}` must be a list of token id lists.", name)
    return rows


def _generator_output(out: dict[str, Any], tokenizer: TokenDecoder | None) -> Iterator[Pair]:
    prompts, responses = _int_rows(out, "prompt_token_ids"), _int_rows(out, "response_ids")
    masks = out.get("loss_masks")
    if len(prompts) != len(responses) or not isinstance(masks, list) or len(masks) != len(responses):
        raise _err("`prompt_token_ids`, `response_ids` and `loss_masks` must have one entry per sample.")
    rewards, lps = out.get("rewards"), out.get("rollout_logprobs")
    samples: list[_Sample] = []
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        fields: dict[str, list[float] | None] = {"rewards": None, "rollout_logprobs": None}
        reward = rewards[i] if isinstance(rewards, list) and i < len(rewards) else None
        if isinstance(reward, list):
            if len(reward) != len(r):
                raise _err(
                    f"`rewards[{i}]` has {len(reward)} entries for {len(r)} response ids.", "rewards", i + 1
                )
            fields["rewards"] = _finite_row(np.asarray(reward, dtype=np.float64), "rewards", i)
        elif isinstance(reward, (int, float)):  # one reward per sample: on the last response id
            fields["rewards"] = [0.0] * (len(r) - 1) + [float(reward)] if r else None
        if isinstance(lps, list) and i < len(lps) and lps[i] is not None:
            if len(lps[i]) != len(r):
                raise _err(
                    f"`rollout_logprobs[{i}]` has {len(lps[i])} entries for {len(r)} ids.",
                    "rollout_logprobs",
                    i + 1,
                )
            fields["rollout_logprobs"] = _finite_row(
                np.asarray(lps[i], dtype=np.float64), "rollout_logprobs", i
            )
        m = masks[i]
        if not isinstance(m, list):
            raise _err(f"`loss_masks[{i}]` must be a list of 0/1.", "loss_masks", i + 1)
        stop = out.get("stop_reasons")
        meta: dict[str, Any] = {"sample": i}
        if isinstance(stop, list) and i < len(stop) and isinstance(stop[i], str):
            meta["stop_reason"] = stop[i]
        samples.append(_Sample(p, r, [int(bool(x)) for x in m], fields, {}, short_hash(str(p)), meta))
    yield from _emit(samples, out.get("trajectory_ids"), out.get("is_last_step"), tokenizer)


def episodes(doc: Document, tokenizer: TokenDecoder | None) -> Iterator[Pair]:
    obj = safe_loads(doc.data, STAND_INS)
    if isinstance(obj, _Batch):
        yield from _training_batch(obj, tokenizer)
    elif isinstance(obj, dict) and "response_ids" in obj:
        yield from _generator_output(obj, tokenizer)
    elif isinstance(obj, dict) and "sequences" in obj:
        batch = _Batch(obj)
        batch.state = {}
        yield from _training_batch(batch, tokenizer)
    else:
        raise _err(
            f"the pickle holds a {type(obj).__name__}, not a SkyRL training batch (`sequences`, "
            "`loss_mask`, ...) or generator output (`prompt_token_ids`, `response_ids`, `loss_masks`)."
        )


register_format(
    name="skyrl_dump",
    description=(
        "SkyRL dumped_data/*.pkl (a TrainingInputBatch: sequences, loss_mask, advantages, log-probs; or a "
        "GeneratorOutput: prompt_token_ids, response_ids, loss_masks, rewards), read without running the pickle"
    ),
    priority=4,
    sniff=sniff,
    episodes=episodes,
    takes_tokenizer=True,
)
