"""Builders for the trainer tests (imported by name: tests/client is on sys.path): a byte-level
BPE tokenizer trained here by the `tokenizers` library, a verl 0.9.1 ``DataProto`` made by verl's
own code (advantages from its GRPO estimator), and a TRL ``GRPOTrainer`` on a tiny randomly
initialised Llama built from a config. Nothing is downloaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = ["the cat sat on the mat\n", "what is 2 + 2? it is 4\n", "call the tool: search(x)\n"] * 40
TRL_PROMPTS = ["the cat sat", "what is 2 + 2?", "call the tool"]


def byte_level_tokenizer(corpus: list[str] = CORPUS, vocab_size: int = 300) -> Tokenizer:
    """A byte-level BPE tokenizer trained here on ``corpus`` (special tokens <pad>, <eos>)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<pad>", "<eos>"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def tiny_llama(tok: Tokenizer, hidden: int = 16) -> tuple[Any, Any]:
    """(a fast transformers tokenizer over ``tok``, a randomly initialised 1-layer Llama of its
    vocabulary, seeded 0): the model TRL's GRPOTrainer runs on CPU in the tests."""
    import torch
    import transformers

    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    config = transformers.LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=hf_tok.pad_token_id,
        eos_token_id=hf_tok.eos_token_id,
    )
    torch.manual_seed(0)
    return hf_tok, transformers.AutoModelForCausalLM.from_config(config)


@dataclass
class VerlBatch:
    """A DataProto and what went into it (rows of ids per prompt, scores, verl's advantages)."""

    data: Any
    prompt_rows: list[list[int]]
    resp_rows: list[list[int]]
    scores: Any
    advantages: Any
    uid: np.ndarray


def verl_dataproto(tok: Tokenizer) -> VerlBatch:
    """4 samples (2 prompts × 2), left-padded prompts, right-padded responses, a tool span inside
    the last response, GRPO advantages from ``verl.trainer.ppo.core_algos``."""
    import torch
    from verl import protocol
    from verl.trainer.ppo import core_algos

    pad = tok.token_to_id("<pad>")
    P, R = 5, 6
    prompt_rows = [tok.encode("what is 2 + 2?").ids[-P:], tok.encode("the cat").ids]
    resp_rows = [tok.encode(" it is 4").ids, tok.encode(" sat on the mat").ids[:R]]
    B = 4  # each prompt sampled twice (verl repeats n samples consecutively with one uid)
    prompts = torch.full((B, P), pad)
    responses = torch.full((B, R), pad)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    rmask = torch.zeros(B, R, dtype=torch.long)
    for b in range(B):
        p, r = prompt_rows[b // 2], resp_rows[b // 2]
        prompts[b, P - len(p) :] = torch.tensor(p)  # verl left-pads prompts
        responses[b, : len(r)] = torch.tensor(r)
        attn[b, P - len(p) : P + len(r)] = 1
        rmask[b, : len(r)] = 1
    rmask[3, 1:3] = 0  # a tool observation inside the last response
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    lengths = attn[:, P:].sum(1)
    token_level_rewards = torch.zeros(B, R)
    token_level_rewards[torch.arange(B), lengths - 1] = scores
    uid = np.array(["u-a", "u-a", "u-b", "u-b"], dtype=object)
    adv, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards, rmask, uid)
    data = protocol.DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": rmask,
            "attention_mask": attn,
            "input_ids": torch.cat([prompts, responses], 1),
            "token_level_rewards": token_level_rewards,
            "advantages": adv,
            "old_log_probs": -torch.rand(B, R),
            "ref_log_prob": -torch.rand(B, R),
            "entropys": torch.rand(B, R),
        },
        non_tensors={"uid": uid},
    )
    return VerlBatch(data, prompt_rows, resp_rows, scores, adv, uid)


def trl_trainer(output_dir: str, max_steps: int = 2) -> Any:
    """A TRL ``GRPOTrainer`` on CPU: a 1-layer random Llama, the tokenizer above, groups of 2 and
    a reward that differs within every group (0 then 1)."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    hf_tok, model = tiny_llama(byte_level_tokenizer(), hidden=32)
    dataset = datasets.Dataset.from_dict({"prompt": TRL_PROMPTS * 4})

    def reward(completions, **_kwargs):  # varies within every group of 2
        return [float(i % 2) for i in range(len(completions))]

    args = GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        num_generations=2,
        max_completion_length=8,
        per_device_train_batch_size=2,
        max_steps=max_steps,
        save_strategy="no",
        logging_steps=1,
    )
    return GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=hf_tok
    )
