"""One token-kind numbering everywhere: the service's domain, the wire format and the audit engine.

prompt 0, policy 1, tool 2, and padding 255 (``creditlens.wire.PADDING``) past a row's end. The
audit engine in ``estimators/`` cannot import ``app/``, so it restates the codes; this holds them
equal, and the service hands its stored codes to the engine as they are (no translation table).
"""

from __future__ import annotations

import numpy as np
import torch

from app.core import domain
from app.core.arrays import kind_codes
from creditlens import wire
from estimators import audit as engine


def test_the_engine_the_domain_and_the_wire_number_kinds_alike():
    assert (engine.KIND_PROMPT, engine.KIND_POLICY, engine.KIND_TOOL) == (
        domain.PROMPT,
        domain.POLICY,
        domain.TOOL,
    )
    assert {k: v for k, v in engine.KIND_CODES.items() if k != "pad"} == domain.KIND_CODES == wire.KIND_CODES
    assert engine.KIND_PAD == wire.PADDING
    assert engine.KIND_PAD not in domain.KIND_CODES.values()


def test_the_service_codes_go_to_the_engine_untranslated():
    # A one-episode GRPO-style batch in the service's own codes (as stored), padded with KIND_PAD:
    # a prompt token, two policy tokens, one tool token and one policy token, reward 1 at the end.
    names = ["prompt", "policy", "policy", "tool", "policy"]
    codes = kind_codes(names)
    kt = torch.from_numpy(np.concatenate([codes, [engine.KIND_PAD]]).astype(np.uint8))[None]
    rewards = torch.zeros(1, 6, dtype=torch.float64)
    rewards[0, 4] = 1.0
    adv = torch.zeros(1, 6, dtype=torch.float64)
    adv[0, 3] = 0.5  # a nonzero advantage on the tool token (position 3)
    from estimators.registry import EstimatorInput

    res = engine.audit(EstimatorInput(rewards=rewards, mask=kt == domain.POLICY), adv, kt)
    off = [f for f in res.findings if f["code"] == "credit_on_non_policy_tokens"]
    assert off and off[0]["tokens"] == [[0, 3]] and off[0]["evidence"]["tool_tokens"] == 1
