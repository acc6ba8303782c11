"""The binary wire format: one batch as a safetensors file (format name ``safetensors``).

Tensors, each named like the native field it carries (B episodes, T positions):

=========================  ===============  ================================================
name                       dtype            meaning
=========================  ===============  ================================================
``kinds``                  uint8 [B, T]     0 prompt, 1 policy, 2 tool, 255 padding (dropped)
``token_ids``              int [B, T]       token ids (shown as ⟨id⟩ when no token strings come)
``rewards``                float [B, T]     per-token rewards
``values``                 float [B, T]     critic values
``logprobs``               float [B, T]     log-probabilities of the chosen tokens (training policy)
``ref_logprobs``           float [B, T]     the same under the reference policy
``rollout_logprobs``       float [B, T]     the same under the rollout engine (vLLM, SGLang)
``entropy``                float [B, T]     the policy's entropy at each position
``advantages``             float [B, T]     the trainer's own per-token advantages
``reward``                 float [B]        outcome reward, placed on the last policy token
``groups``                 int [B]          group id (attempts at one task share it)
``token_signals.<name>``   any [B, T]       a per-token signal of your own (float/int/bool)
=========================  ===============  ================================================

``kinds`` is required, and ``token_ids`` or the ``tokens`` metadata. Floats are float16,
bfloat16, float32 or float64 and must be finite on non-padding positions; ints are any signed
or unsigned integer type.

``token_signals.<name>`` (any number of them; ``<name>`` is any non-empty string, as
safetensors allows any tensor name) carries a per-token number that has no field of its own:
importance ratios, mismatch KL, masks, loss weights. Its dtype is a float (NaN and infinities
allowed: "not scored", read back as null), an integer (within int64) or BOOL. Each episode keeps
its non-padding positions as ``meta.token_signals[<name>]``, beside (never replacing: the same
name in both is refused) the ``token_signals`` its ``meta`` metadata carries.

The file's ``__metadata__`` (string -> string) may hold, each as a JSON string:

* ``tokens``: B lists, each with one display string per non-padding position;
* ``special_tokens``: B lists of positions (in that list) that are special tokens;
* ``groups``: B group labels (strings; used instead of the ``groups`` tensor);
* ``meta``: one JSON object for every episode, or B objects, kept as each episode's ``meta``.

Every file also carries ``creditlens_protocol``: the wire protocol version of the client that
wrote it (:data:`PROTOCOL_VERSION`, also sent as the ``X-Creditlens-Protocol`` header and the
``protocol`` field of ``POST /api/runs``). A server reads every version up to its own (a file or
request without one is version 1) and answers a newer one with a 4xx naming both versions.

Writing uses the ``safetensors`` package (``safetensors.numpy.save``), so torch is not needed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = [
    "FLOAT_FIELDS",
    "KIND_CODES",
    "PADDING",
    "PROTOCOL_HEADER",
    "PROTOCOL_KEY",
    "PROTOCOL_VERSION",
    "SIGNAL_PREFIX",
    "encode",
]

# The version of what the client sends (this table, the run and step endpoints' bodies). Raise it
# when a change would be misread by a server that does not know it; the server accepts up to its own.
# ``token_signals.<name>`` tensors did not raise it: a server without them refuses such a file
# with a 422 naming the tensor (unknown name), it cannot misread it.
PROTOCOL_VERSION = 1
PROTOCOL_HEADER = "X-Creditlens-Protocol"
PROTOCOL_KEY = "creditlens_protocol"  # the safetensors metadata key

KIND_CODES = {"prompt": 0, "policy": 1, "tool": 2}
SIGNAL_PREFIX = "token_signals."  # a tensor ``token_signals.<name>``: meta.token_signals[<name>]
PADDING = 255
FLOAT_FIELDS = (
    "rewards",
    "values",
    "logprobs",
    "ref_logprobs",
    "rollout_logprobs",
    "entropy",
    "advantages",
)


def encode(tensors: dict[str, np.ndarray], metadata: dict[str, Any] | None = None) -> bytes:
    """One safetensors file: ``tensors`` as they are, ``metadata`` values JSON-encoded."""
    from safetensors.numpy import save  # lazy: `import creditlens` needs only httpx and numpy

    meta = {k: json.dumps(v, ensure_ascii=False) for k, v in (metadata or {}).items() if v is not None}
    meta.setdefault(PROTOCOL_KEY, str(PROTOCOL_VERSION))
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    return save(arrays, metadata=meta)
