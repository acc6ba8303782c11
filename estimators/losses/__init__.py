"""Policy losses as a registry: what the gradient sees of each token under a trainer's own loss.

``loss_weights(advantages, log_prob, old_log_prob, mask, loss=NAME, **params)`` gives each token's
``w = -dL/d log_prob`` in closed form (no autograd) under the registered loss ``NAME``: verl
0.9.1's (``vanilla``, ``gspo``, ... and their ``verl:`` aliases; ``verl.py``) and the other
trainers' (``trl:<loss_type>``, ``openrlhf:<policy_loss_type>``, ``skyrl:<policy_loss_type>``).
:func:`available_losses` lists them with their parameters and defaults; ``core.py`` holds what
they share (:class:`TokenState`, the threshold's reading, the batch an aggregation is taken over).
"""

# The trainers' modules register their losses on import (as estimators/builtin.py does).
from . import openrlhf, skyrl, trl, verl  # noqa: F401
from .core import CLIPPING, ZEROING, BatchShape, LossInput, TokenState, parse_threshold
from .registry import (
    DEFAULT_LOSS,
    LossParam,
    LossSpec,
    available_losses,
    get_loss,
    loss_token_states,
    loss_weights,
    loss_weights_and_states,
    register_loss,
)
from .verl import AGGS, LOSSES, ROLLOUT_IS

__all__ = [
    "AGGS",
    "CLIPPING",
    "DEFAULT_LOSS",
    "LOSSES",
    "ROLLOUT_IS",
    "ZEROING",
    "BatchShape",
    "LossInput",
    "LossParam",
    "LossSpec",
    "TokenState",
    "available_losses",
    "get_loss",
    "loss_token_states",
    "loss_weights",
    "loss_weights_and_states",
    "parse_threshold",
    "register_loss",
]
