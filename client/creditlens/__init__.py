"""creditlens client: log a training run into a creditlens server, one batch per step.

    from creditlens import Client

    with Client("http://127.0.0.1:8000") as client:
        run = client.run("grpo-qwen-0.5b", config={"lr": 1e-6})
        for step, batch in enumerate(loader):
            ...
            run.log_tensors(step, token_ids=ids, attention_mask=attn, policy_mask=mask,
                            reward=scores, advantages=adv, tokenizer=tokenizer)

Importing this package needs only httpx and numpy; torch tensors are accepted when given.
"""

from .client import Client, Run
from .tokens import display_pieces

__all__ = ["Client", "Run", "display_pieces"]
