"""The trainers' key vocabulary: which key of each trainer's batch or dump fills which native field.

One table per trainer, read by the client's adapters (``creditlens.adapters``) and by the
server's importers of the same trainer's files (app/ingest/verl_pt.py, slime_pt.py, nemo_rl.py),
so the two never disagree on a name. Each maps a native field (or a structural role such as the
loss mask) to the trainer's keys for it, **first present wins**.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NEMO_RL", "SLIME", "TRL", "VERL", "VERL_PER_TOKEN", "first_key"]

Keys = Mapping[str, tuple[str, ...]]

# verl ``DataProto`` (``batch`` tensors [B, R] over the response, after ``compute_advantage``), and
# the actor's micro-batch (``update_policy``'s input, which names the log-probs ``old_log_prob``).
VERL_PER_TOKEN: Keys = {
    "rewards": ("token_level_rewards", "token_level_scores"),  # scores: before the KL penalty
    "values": ("values",),
    "logprobs": ("old_log_prob", "old_log_probs"),
    "advantages": ("advantages",),
    "ref_logprobs": ("ref_log_prob",),
    "rollout_logprobs": ("rollout_log_probs",),
    "entropy": ("entropys",),
    "returns": ("returns",),  # not a native field: kept in ``meta.returns``
}
VERL: Keys = {
    "prompts": ("prompts",),  # [B, P] left-padded
    "responses": ("responses",),  # [B, R] right-padded
    "response_mask": ("response_mask",),  # 1 = the policy's token, 0 = tool token or padding
    "attention_mask": ("attention_mask",),  # [B, P + R] (or [B, L] in a micro-batch)
    "input_ids": ("input_ids", "inputs_ids"),  # a micro-batch; the misspelling seen in dumps
    "group": ("uid",),
    "step": ("global_steps", "step"),
    **VERL_PER_TOKEN,
}

# slime's ``Sample.to_dict()`` (rollout dump) and train-dump samples / columns (plural names).
SLIME: Keys = {
    "tokens": ("tokens",),
    "response_length": ("response_length", "response_lengths"),
    "loss_mask": ("loss_mask", "loss_masks"),
    "reward": ("reward", "rewards"),  # a train dump's ``rewards`` are group-normalised
    "raw_reward": ("raw_reward",),
    "logprobs": ("log_probs", "rollout_log_probs"),  # a rollout dump has only the engine's
    "rollout_logprobs": ("rollout_log_probs",),
    "ref_logprobs": ("ref_log_probs", "ref_log_prob"),
    "entropy": ("entropy", "entropys"),
    "values": ("values",),
    "advantages": ("advantages",),
    "group": ("group_index",),
}

# NeMo-RL's ``train_data_step{N}.jsonl`` records.
NEMO_RL: Keys = {
    "token_ids": ("token_ids",),
    "loss_mask": ("token_loss_mask",),
    "length": ("input_lengths",),
    "reward": ("rewards", "reward"),
    "logprobs": ("prev_logprobs",),  # the training policy's
    "rollout_logprobs": ("generation_logprobs",),  # the generation engine's
    "ref_logprobs": ("reference_policy_logprobs",),
    "advantages": ("advantages",),
    "values": ("values",),
    "group": ("group", "idx"),
}

# TRL's ``GRPOTrainer._generate_and_score_completions`` output.
TRL: Keys = {
    "prompt_ids": ("prompt_ids",),
    "prompt_mask": ("prompt_mask",),
    "completion_ids": ("completion_ids",),
    "completion_mask": ("completion_mask",),
    "tool_mask": ("tool_mask",),  # 1 = the model's token, 0 = tool output
    "advantages": ("advantages",),  # [B]: one per sequence
    "logprobs": ("old_per_token_logps",),
    "ref_logprobs": ("ref_per_token_logps",),
    "rollout_logprobs": ("sampling_per_token_logps",),
}


def first_key(table: Keys, field: str, present: Mapping[str, Any]) -> str | None:
    """The first of ``table[field]``'s keys that ``present`` holds with a value other than None,
    or None."""
    return next((k for k in table.get(field, ()) if present.get(k) is not None), None)
