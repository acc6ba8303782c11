"""Trainers' dialects: ``"<trainer>:<name>"`` estimators that compute what a trainer computes, its
quirks included, on our [B, T] layout (the policy mask, a row's response ending at its last policy
token). Importing this package registers them; each trainer has a module of its own (add a new
trainer's module to this import)."""

from . import (  # noqa: F401
    areal,
    nemo_rl,
    openrlhf,
    prime_rl,
    skyrl,
    slime,
    trl,
    verl,
)
