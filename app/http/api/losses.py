"""The policy losses: GET /api/losses (every registered loss with its trainer, version, parameters
and defaults), and the loss views' query (GET /api/batches/{id}/loss and the episode's
`loss_weights` row): `loss` (a registered loss, ``estimators.losses``), `bypass`, and the chosen
loss's own parameters by their names (`agg`, `rollout_is`, `rollout_is_threshold`,
`loss_agg_mode`, `loss_reduction`, `importance_sampling_level`, ...). A parameter some other loss
takes but this one does not is a 422 listing the ones it takes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from app.compute import loss_view as lv
from app.core import losses
from estimators.losses import DEFAULT_LOSS, available_losses

router = APIRouter(tags=["losses"])

LOSS_HELP = (
    "the policy loss: verl 0.9.1's "
    + ", ".join(n for n, s in available_losses(aliases=False).items() if s.trainer == "verl")
    + " (also as verl:<name>), or a trainer's <trainer>:<loss>: "
    + ", ".join(n for n, s in available_losses(aliases=False).items() if s.trainer != "verl")
    + ". Its parameters go by their own names (GET /api/losses), e.g. agg, rollout_is, "
    "rollout_is_threshold for verl's; a parameter the loss does not take is a 422."
)
BYPASS_HELP = "old_log_prob = rollout_logprobs (verl's bypass mode: the ratio is training / rollout)"


def loss_params(
    request: Request,
    loss: str = Query(DEFAULT_LOSS, description=LOSS_HELP),
    bypass: bool = Query(False, description=BYPASS_HELP),
) -> lv.LossParams:
    """The query's loss, its parameters and bypass, or a 422 naming the parameter."""
    q = request.query_params
    given = {name: q[name] for name in lv.param_names() if name in q}
    return lv.parse(loss, given, bypass)


@router.get("/api/losses", summary="Policy losses accepted by the loss views (loss=), with their parameters")
def list_losses() -> dict[str, Any]:
    """Every registered loss, trainer by trainer, with its parameters and their defaults."""
    return losses.catalog()
