"""How a computation refuses work: 413 when it exceeds the work budget (saying what to reduce), 422
when an estimator cannot run on the input it was given (naming the scheme)."""

from __future__ import annotations

from typing import Any

from app.core.errors import ApiError
from estimators import EstimatorInput, EstimatorOutput
from estimators import compute as _compute


class WorkBudgetError(ApiError):
    """A request whose work exceeds the configured budget: 413 saying what to reduce."""

    def __init__(self, message: str) -> None:
        super().__init__(413, "work_budget", message)


def check_budget(cells: int, budget: int, what: str, reduce: str) -> None:
    """WorkBudgetError (413) when ``cells`` (the numbers the request would hold at once) exceeds
    ``budget``; the message says what the work was, the budget's setting and what to reduce."""
    if budget > 0 and cells > budget:
        raise WorkBudgetError(
            f"{what} needs {cells:,} numbers in memory at once; the budget is {budget:,} "
            f"(setting CREDITLENS_MAX_COMPUTE_CELLS). {reduce}"
        )


def run_estimator(name: str, inp: EstimatorInput, **params: Any) -> EstimatorOutput:
    """The registry call; an estimator's refusal of this input (ValueError/TypeError, e.g. a group
    of one for pass@k) becomes a 422 naming the scheme instead of a 500."""
    try:
        return _compute(name, inp, **params)
    except (ValueError, TypeError) as e:
        raise ApiError(
            422, "scheme_not_applicable", f"scheme {name!r} cannot run on this episode: {e}.", field="scheme"
        ) from None
