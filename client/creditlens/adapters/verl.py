"""verl: log a ``DataProto`` at advantage time (tested with verl 0.9.1).

Call it in ``RayPPOTrainer.fit`` right after ``compute_advantage``::

    from creditlens.adapters.verl import log_dataproto
    log_dataproto(run, self.global_steps, batch, self.tokenizer)

verl left-pads prompts and right-pads responses; ``attention_mask`` covers prompt + response
and marks the padding. Inside the response, ``response_mask`` is 1 on tokens the policy chose
and 0 on tool/observation tokens of a multi-turn rollout. The per-token tensors of the response
are read by the key table the server's ``verl_pt`` importer reads (``creditlens.keys.VERL_PER_TOKEN``:
``token_level_rewards`` else ``token_level_scores``, ``values``, ``advantages``, ``old_log_prob``
else ``old_log_probs``, ``ref_log_prob``, ``rollout_log_probs``, ``entropys``) and sent with zeros
on the prompt; ``returns`` goes to each episode's ``meta.returns`` (prompt zeros, padding cut),
as the importer keeps it. ``uid`` (one per prompt, shared by its ``n`` samples) becomes the group.
"""

from __future__ import annotations

from typing import Any

from creditlens.keys import VERL_PER_TOKEN, first_key

__all__ = ["log_dataproto", "FIELDS"]

# native field (a ``log_tensors`` argument) -> the verl keys for it, first present wins
FIELDS = {name: keys for name, keys in VERL_PER_TOKEN.items() if name != "returns"}


def log_dataproto(run: Any, step: int, data: Any, tokenizer: Any = None) -> None:
    """Log one verl ``DataProto`` as training step ``step`` of ``run`` (never raises for bad
    data unless the client is strict; see ``Run.log_tensors``). The run's steps say they are
    verl's (``run.trainer``), unless the run named another trainer."""
    import torch

    if getattr(run, "trainer", None) is None:
        run.trainer = "verl"

    try:
        batch = data.batch
        present = {k: batch[k] for k in batch.keys()}
        prompts, responses = present["prompts"], present["responses"]
        P = prompts.shape[1]
        attn: Any = present.get("attention_mask")
        rmask: Any = present.get("response_mask")
        if rmask is None:  # older verl: the response part of the attention mask
            rmask = attn[:, P:]
        if attn is None:
            attn = torch.cat([prompts.new_ones(prompts.shape), torch.ones_like(rmask)], dim=1)
        # Codes of creditlens.wire: 0 prompt, 1 policy, 2 tool, 255 padding.
        kinds = torch.cat(
            [torch.zeros_like(prompts, dtype=torch.uint8), torch.where(rmask.bool(), 1, 2).to(torch.uint8)],
            dim=1,
        )
        kinds = torch.where(attn.bool(), kinds, torch.full_like(kinds, 255))
        per_token: dict[str, Any] = {}
        for arg in FIELDS:
            key = first_key(FIELDS, arg, present)
            if key is not None:
                t = present[key].detach().float()
                per_token[arg] = torch.cat([t.new_zeros((t.shape[0], P)), t], dim=1)
        meta = None
        returns_key = first_key(VERL_PER_TOKEN, "returns", present)
        if returns_key is not None:
            returns = present[returns_key].detach().double()
            keep = attn.bool()
            meta = [
                {"returns": [0.0] * int(keep[b, :P].sum()) + returns[b][keep[b, P:]].tolist()}
                for b in range(returns.shape[0])
            ]
        groups = None
        uid = data.non_tensor_batch.get("uid") if data.non_tensor_batch is not None else None
        if uid is not None:
            groups = [str(u) for u in list(uid)]
        token_ids = torch.cat([prompts, responses], dim=1)
    except Exception as e:  # noqa: BLE001 - never break the trainer; the run reports it
        run._bad_argument(ValueError(f"log_dataproto: this DataProto could not be read: {e!r}"))
        return
    run.log_tensors(
        step, token_ids=token_ids, kinds=kinds, groups=groups, tokenizer=tokenizer, meta=meta, **per_token
    )
