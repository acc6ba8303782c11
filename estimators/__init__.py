"""Per-token advantage estimators: pure math on torch tensors ([B, T] with a policy-token mask).

Conventions (seed 000, sections 7.1-7.3): a reward lives on the policy token that earned it; time
advances only on policy tokens; every recursion carries its state unchanged across mask-0
positions; outputs are 0 off-mask.
"""

from .registry import EstimatorInput, EstimatorOutput, EstimatorSpec, available, compute, get, register

__all__ = ["EstimatorInput", "EstimatorOutput", "EstimatorSpec", "available", "compute", "get", "register"]
