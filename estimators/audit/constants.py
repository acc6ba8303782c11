"""The audit's numbers: token kind codes, the search grids and every tolerance a verdict depends on.

Kind codes are the service's and the wire format's (``app.core.domain``, ``creditlens.wire``):
prompt 0, policy 1, tool 2, and :data:`KIND_PAD` 255 (``creditlens.wire.PADDING``) past a row's end.
"""

from __future__ import annotations

KIND_PROMPT, KIND_POLICY, KIND_TOOL = 0, 1, 2
KIND_PAD = 255  # past the end of a row; any code other than prompt/policy/tool counts as padding
KIND_CODES = {"prompt": KIND_PROMPT, "policy": KIND_POLICY, "tool": KIND_TOOL, "pad": KIND_PAD}

GAMMAS = (1.0, 0.999, 0.99, 0.95, 0.9)
LAMBDAS = (1.0, 0.99, 0.95, 0.9, 0.0)
EPSILONS = (1e-8, 1e-6, 1e-4)
WHITEN_FACTORS = ("float64", "float32")  # whitening's count / Bessel factor arithmetic (whitening.py)
TOKEN_TOL = 1e-5  # a token "agrees" with the reference within this
MATCH_MAX_ABS = 1e-4  # ... and a configuration "matches" when no token is further off than this
MATCH_SHARE = 0.99  # ... and at least this share of policy tokens agree
SPIKE_STD = 1e-4  # a group score spread below this is noise, not signal
SPIKE_ADV = 0.1  # ... and an advantage this large built from it is a phantom
SCREEN_ROWS = 32  # rows the token family is screened on before the survivors run on the whole batch
SURVIVORS = 4  # screened configurations computed on the whole batch
CAP = 200  # positions listed per finding (``token_count`` is the total)
TIE = 1e-6  # matches this close to the best are ranked by their number of deviations
RAW_TOL = 1e-9  # raw advantages that differ by more than this (relative) "change"
LARGE_ADV_QUANTILE = 0.9  # a policy token's |A| at or above this quantile of the batch's is "large"
ZEROED_WARN_SHARE = 0.05  # zeroed large-|A| tokens holding this share of the large-|A| mass: a warning
ICEPOP_WINDOW = "0.5_2"  # token-level IcePop's [lo, hi] (the service's step metrics use the same)
