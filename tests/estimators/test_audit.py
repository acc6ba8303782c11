"""The audit engine (estimators/audit/).

1. The corpus in fixtures/audit/ (made by verl 0.9.1's own functions, right and wrong): each case
   gives exactly the manifest's best match, codes, severities and token positions; the clean
   batches give no finding at all; the generator reruns byte-identically.
2. Small hand-made batches, one per finding code, with the positions written out.
3. The search covers the registry: each estimator's own output is matched back to it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from estimators import compute
from estimators import groups as G
from estimators import token as TK
from estimators.audit import (
    CAP,
    KIND_CODES,
    KIND_PAD,
    KIND_POLICY,
    audit,
    audit_episodes,
    returns_reset_at_gaps,
)
from estimators.registry import EstimatorInput
from estimators.stats import whiten

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fixtures" / "audit"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())


def load(path: Path):
    """A small native-JSONL reader: per-episode lists straight into :func:`audit_episodes`."""
    eps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return audit_episodes(
        kinds=[e["kinds"] for e in eps],
        advantages=[e["advantages"] for e in eps],
        rewards=[e["rewards"] for e in eps],
        values=[e["values"] for e in eps] if all("values" in e for e in eps) else None,
        groups=[e["group"] for e in eps] if all("group" in e for e in eps) else None,
        truncated=[e.get("truncated", False) for e in eps],
        bootstrap_value=[e.get("bootstrap_value") for e in eps],
    )


# ---- 1. the corpus --------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(MANIFEST))
def test_corpus_case(case):
    spec = MANIFEST[case]
    res = load(CORPUS / spec["file"])
    out = json.loads(json.dumps(res.as_dict()))  # JSON-ready, as the API will send it
    bm = out["best_match"]
    assert (bm["scheme"], bm["params"]) == (spec["best_match"]["scheme"], spec["best_match"]["params"])
    assert bm["max_abs_diff"] < 1e-9 and bm["share_within_1e-5"] == 1.0
    assert out["searched"] > 50
    got = [(f["code"], f["severity"]) for f in out["findings"]]
    assert got == [(f["code"], f["severity"]) for f in spec["findings"]]
    for f, want in zip(out["findings"], spec["findings"], strict=True):
        assert f["token_count"] == want["token_count"] > 0
        assert f["tokens"] == want["tokens"][:CAP]
        assert f["episodes"] == want["episodes"]
        assert f["message"]


def test_corpus_clean_batches_have_no_finding():
    clean = [c for c in MANIFEST if c.startswith("clean_")]
    assert len(clean) == 2
    for case in clean:
        assert load(CORPUS / MANIFEST[case]["file"]).findings == []


def test_corpus_covers_every_bug():
    codes = {f["code"] for spec in MANIFEST.values() for f in spec["findings"]}
    assert {
        "credit_on_non_policy_tokens",
        "gae_through_tool_spans",
        "reward_on_non_policy_token",
        "reward_dropped_before_tool_span",
        "std_eps_spike",
        "truncated_as_terminated",
        "convention_differs",
    } <= codes


@pytest.mark.verl
def test_corpus_regenerates_byte_identically(tmp_path):
    pytest.importorskip("verl.trainer.ppo.core_algos")
    subprocess.run(
        [sys.executable, str(CORPUS / "make_corpus.py"), str(tmp_path)], check=True, cwd=ROOT, timeout=600
    )
    names = sorted(p.name for p in CORPUS.iterdir() if p.suffix in (".jsonl", ".json"))
    assert names == sorted(p.name for p in tmp_path.iterdir())
    for name in names:
        assert (tmp_path / name).read_bytes() == (CORPUS / name).read_bytes(), name


# ---- 2. hand-made batches -------------------------------------------------------------------

P, T_, Q = "policy", "tool", "prompt"
# Three episodes: prompt, turn, tool span, turn (episode 2 ends with a tool observation).
KINDS = [
    [Q, P, P, T_, T_, P, P],
    [Q, Q, P, P, P, T_, P],
    [Q, P, P, T_, P, P, T_, T_],
]
VALUES = [
    [0.0, 0.3, 0.5, -0.2, 0.9, 0.4, 0.7],
    [0.0, 0.0, 0.1, 0.6, 0.2, 0.8, 0.5],
    [0.0, 0.2, 0.4, 0.1, 0.3, 0.6, -0.4, 0.7],
]
SCORES = [1.0, 0.0, 1.0]


def _rewards(scores=SCORES, kinds=KINDS):
    out = []
    for ks, s in zip(kinds, scores, strict=True):
        r = [0.0] * len(ks)
        r[max(i for i, k in enumerate(ks) if k == P)] = s
        out.append(r)
    return out


def _pad(rows, T=8, dtype=torch.float64):
    out = torch.zeros(len(rows), T, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def _kinds_mask(kinds=KINDS, T=8):
    pol = torch.zeros(len(kinds), T, dtype=torch.bool)
    resp = torch.zeros(len(kinds), T, dtype=torch.bool)
    for i, ks in enumerate(kinds):
        first = ks.index(P)
        for t, k in enumerate(ks):
            pol[i, t] = k == P
            resp[i, t] = t >= first
    return pol, resp


def _kind_codes(kinds=KINDS, T=8):
    """[B, T] uint8 kind codes of ``kinds`` (the service's numbering), KIND_PAD past each row's end."""
    kt = torch.full((len(kinds), T), KIND_PAD, dtype=torch.uint8)
    for i, ks in enumerate(kinds):
        kt[i, : len(ks)] = torch.tensor([KIND_CODES[k] for k in ks])
    return kt


def _rows(x: torch.Tensor, kinds=KINDS):
    return [x[i, : len(ks)].tolist() for i, ks in enumerate(kinds)]


def _codes(res):
    return [f["code"] for f in res.findings]


def _one(res, code):
    (f,) = [f for f in res.findings if f["code"] == code]
    return f


def test_gae_through_tool_spans_hand_made():
    pol, resp = _kinds_mask()
    r, v = _pad(_rewards()), _pad(VALUES)
    raw, _ = TK.gae(r, v, resp, 1.0, 0.95)  # the mask covers tool output: steps through it
    adv = raw * resp  # what the loss sees, tool tokens included
    res = audit_episodes(KINDS, _rows(adv), _rewards(), values=VALUES)
    assert res.best_match["scheme"] == "token_gae"
    assert res.best_match["params"] | {} == {
        "gamma": 1.0,
        "lam": 0.95,
        "mask": "response",
        "reward_at": "last_policy",
        "bootstrap": False,
        "whiten": "none",
    }
    assert _codes(res) == ["credit_on_non_policy_tokens", "gae_through_tool_spans"]
    # Tool tokens (and nothing else off-policy) carry credit.
    assert _one(res, "credit_on_non_policy_tokens")["tokens"] == [
        [0, 3],
        [0, 4],
        [1, 5],
        [2, 3],
        [2, 6],
        [2, 7],
    ]
    # Only the turns left of a tool span change: the last turn never sees the tool values...
    # except episode 2, whose trailing tool span now sits inside the mask too.
    f = _one(res, "gae_through_tool_spans")
    assert f["tokens"] == [[0, 1], [0, 2], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [2, 4], [2, 5]]
    assert f["severity"] == "error" and f["episodes"] == [0, 1, 2]


def test_reward_on_non_policy_token_hand_made():
    pol, _ = _kinds_mask()
    r, v = _pad(_rewards()), _pad(VALUES)
    moved = r.clone()
    moved[2, 5], moved[2, 7] = 0.0, 1.0  # episode 2's outcome on its last (tool) token: dropped
    raw, _ = TK.gae(moved, v, pol, 0.99, 0.95)
    adv = whiten(raw, pol) * pol
    res = audit_episodes(KINDS, _rows(adv), _rewards(), values=VALUES)
    assert (res.best_match["scheme"], res.best_match["params"]["reward_at"]) == ("verl_gae", "row_end")
    assert res.best_match["params"]["gamma"] == 0.99 and res.best_match["params"]["lam"] == 0.95
    f = _one(res, "reward_on_non_policy_token")
    assert _codes(res) == ["reward_on_non_policy_token"]
    assert f["tokens"] == [[2, 1], [2, 2], [2, 4], [2, 5]]  # every policy token of episode 2
    assert f["evidence"]["reward_tokens"] == [[2, 7]]


def test_reward_dropped_before_tool_span_hand_made():
    pol, _ = _kinds_mask()
    rew = _rewards()
    rew[0][2] = 0.1  # a format bonus at the end of episode 0's first turn
    r = _pad(rew)
    # Hand arithmetic (gamma 1, reset at each gap): episode 0 first turn sees only its 0.1;
    # episodes 1 and 2: first turns see 0.
    ret = returns_reset_at_gaps(r, pol, 1.0)
    assert _rows(ret)[0] == pytest.approx([0.0, 0.1, 0.1, 0.0, 0.0, 1.0, 1.0], abs=1e-15)
    adv = whiten(ret, pol) * pol
    res = audit_episodes(KINDS, _rows(adv), rew)
    assert res.best_match["scheme"] == "reinforce_plus_plus"
    assert res.best_match["params"]["reset_at_gaps"] is True
    f = _one(res, "reward_dropped_before_tool_span")
    assert _codes(res) == ["reward_dropped_before_tool_span"]
    # Episode 1's outcome is 0, so its first turn loses nothing.
    assert f["tokens"] == [[0, 1], [0, 2], [2, 1], [2, 2]]


def test_truncated_as_terminated_hand_made():
    kinds = [[Q, P, P, T_, P, P], [Q, P, P, P], [Q, P, T_, P, P]]
    vals = [[0.0, 0.3, 0.5, 0.1, 0.2, 0.4], [0.0, 0.6, 0.2, 0.1], [0.0, 0.5, 0.3, 0.2, 0.9]]
    rew = _rewards([0.0, 1.0, 0.0], kinds)
    pol, _ = _kinds_mask(kinds, 6)
    raw, _ = TK.gae(_pad(rew, 6), _pad(vals, 6), pol, 0.99, 0.95)  # no bootstrap anywhere
    adv = whiten(raw, pol) * pol
    res = audit_episodes(
        kinds,
        _rows(adv, kinds),
        rew,
        values=vals,
        truncated=[True, False, False],
        bootstrap_value=[0.8, None, None],
    )
    assert res.best_match["params"]["bootstrap"] is False
    f = _one(res, "truncated_as_terminated")
    assert _codes(res) == ["truncated_as_terminated"]
    assert f["tokens"] == [[0, 1], [0, 2], [0, 4], [0, 5]] and f["evidence"]["truncated_episodes"] == [0]


def test_bootstrapped_truncation_is_not_a_finding():
    kinds = [[Q, P, P, T_, P, P], [Q, P, P, P], [Q, P, T_, P, P]]
    vals = [[0.0, 0.3, 0.5, 0.1, 0.2, 0.4], [0.0, 0.6, 0.2, 0.1], [0.0, 0.5, 0.3, 0.2, 0.9]]
    rew = _rewards([0.0, 1.0, 0.0], kinds)
    pol, _ = _kinds_mask(kinds, 6)
    lv = torch.tensor([0.8, math.nan, math.nan], dtype=torch.float64)
    raw, _ = TK.gae(_pad(rew, 6), _pad(vals, 6), pol, 0.99, 0.95, lv)
    res = audit_episodes(
        kinds,
        _rows(raw * pol, kinds),
        rew,
        values=vals,
        truncated=[True, False, False],
        bootstrap_value=[0.8, None, None],
    )
    assert res.best_match["scheme"] == "token_gae" and res.best_match["params"]["bootstrap"] is True
    assert res.findings == []


def _grpo_batch(scores):
    kinds = [[Q, P, P, T_, P] for _ in scores]
    return kinds, _rewards(scores, kinds)


def test_zero_variance_group_nonzero_advantage_hand_made():
    scores = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    groups = ["a"] * 4 + ["b"] * 4
    kinds, rew = _grpo_batch(scores)
    a = G.grpo(torch.tensor(scores, dtype=torch.float64), groups)
    a[4:] = 0.25  # a trainer that centres on the batch mean: the solved group gets credit
    adv = [[0.0, x, x, 0.0, x] for x in a.tolist()]
    res = audit_episodes(kinds, adv, rew, groups=groups)
    assert res.best_match["scheme"] is None
    assert res.best_match["closest"]["scheme"] == "grpo"
    assert "no configuration explains" in res.best_match["message"]
    assert _codes(res) == ["zero_variance_group_nonzero_advantage"]  # not also "unexplained"
    f = _one(res, "zero_variance_group_nonzero_advantage")
    assert f["severity"] == "error" and f["episodes"] == [4, 5, 6, 7]
    assert f["tokens"] == [[e, t] for e in range(4, 8) for t in (1, 2, 4)]


def test_std_eps_spike_hand_made():
    # Group a: scores differ by 1e-6 (noise). sample std = 5e-7; GRPO (eps 1e-6) turns the odd
    # one out into (1 - 0.25) * 1e-6 / (5e-7 + 1e-6) = 0.5 and the others into -0.1667.
    scores = [0.5, 0.5, 0.5, 0.500001, 0.0, 1.0, 0.0, 1.0]
    groups = ["a"] * 4 + ["b"] * 4
    kinds, rew = _grpo_batch(scores)
    a = G.grpo(torch.tensor(scores, dtype=torch.float64), groups)
    assert a[3].item() == pytest.approx(0.5, rel=1e-6) and a[0].item() == pytest.approx(-1 / 6, rel=1e-6)
    adv = [[0.0, x, x, 0.0, x] for x in a.tolist()]
    res = audit_episodes(kinds, adv, rew, groups=groups)
    assert res.best_match["scheme"] == "grpo" and res.best_match["params"]["eps"] == 1e-6
    assert _codes(res) == ["std_eps_spike"]
    f = _one(res, "std_eps_spike")
    assert f["severity"] == "warning" and f["episodes"] == [0, 1, 2, 3]
    assert f["token_count"] == 12


def test_convention_differs_population_std_hand_made():
    scores = [1.0, 0.0, 0.0, 0.3, 0.9, 0.1]
    groups = ["a", "a", "a", "b", "b", "b"]
    kinds, rew = _grpo_batch(scores)
    a = G.grpo(torch.tensor(scores, dtype=torch.float64), groups, std="population")
    adv = [[0.0, x, x, 0.0, x] for x in a.tolist()]
    res = audit_episodes(kinds, adv, rew, groups=groups)
    assert res.best_match["params"]["std"] == "population"
    assert _codes(res) == ["convention_differs"]
    f = _one(res, "convention_differs")
    assert f["severity"] == "info" and f["evidence"] == {
        "found": {"std": "population"},
        "default": {"std": "sample"},
    }
    assert f["token_count"] == 18  # sqrt(3/2) changes every nonzero advantage


def test_advantage_not_constant_per_turn_hand_made():
    scores = [1.0, 0.0, 0.0, 1.0]
    groups = ["a", "a", "b", "b"]
    kinds, rew = _grpo_batch(scores)
    a = G.grpo(torch.tensor(scores, dtype=torch.float64), groups).tolist()
    adv = [[0.0, x, x, 0.0, x] for x in a]
    adv[1][4] += 0.3  # one token of episode 1 drifts off the episode's advantage
    res = audit_episodes(kinds, adv, rew, groups=groups)
    assert res.best_match["scheme"] is None and res.best_match["closest"]["scheme"] == "grpo"
    assert _codes(res) == ["advantage_not_constant_per_turn"]
    f = _one(res, "advantage_not_constant_per_turn")
    assert f["tokens"] == [[1, 4]] and f["severity"] == "error"


def test_mismatch_unexplained_hand_made():
    pol, _ = _kinds_mask()
    raw, _ = TK.gae(_pad(_rewards()), _pad(VALUES), pol, 0.99, 0.95)
    adv = whiten(raw, pol) * pol
    adv[1, 3] += 0.01
    res = audit_episodes(KINDS, _rows(adv), _rewards(), values=VALUES)
    assert res.best_match["scheme"] is None
    assert res.best_match["closest"]["scheme"] == "verl_gae"
    assert res.best_match["closest"]["max_abs_diff"] == pytest.approx(0.01, rel=1e-6)
    # The whitening factor is read off the tokens that agree, not the one that is 0.01 off.
    assert res.best_match["closest"]["params"]["whiten_factor"] == "float64"
    assert _codes(res) == ["mismatch_unexplained"]
    assert _one(res, "mismatch_unexplained")["tokens"] == [[1, 3]]


def test_credit_on_non_policy_tokens_hand_made():
    scores = [1.0, 0.0, 0.0, 1.0]
    groups = ["a", "a", "b", "b"]
    kinds, rew = _grpo_batch(scores)
    a = G.grpo(torch.tensor(scores, dtype=torch.float64), groups).tolist()
    adv = [[0.0, x, x, x, x] for x in a]  # the tool token (position 3) trained too
    res = audit_episodes(kinds, adv, rew, groups=groups)
    assert res.best_match["scheme"] == "grpo"
    assert _codes(res) == ["credit_on_non_policy_tokens"]
    assert _one(res, "credit_on_non_policy_tokens")["tokens"] == [[0, 3], [1, 3], [2, 3], [3, 3]]


def test_tokens_are_capped_with_a_total():
    n = 60
    kinds = [[Q] + [P] * 5 + [T_] * 5 for _ in range(n)]
    scores = [float(i % 2) for i in range(n)]
    rew = _rewards(scores, kinds)
    groups = [str(i // 4) for i in range(n)]
    a = G.grpo(torch.tensor(scores, dtype=torch.float64), groups).tolist()
    adv = [[0.0] + [x] * 10 for x in a]
    res = audit_episodes(kinds, adv, rew, groups=groups)
    f = _one(res, "credit_on_non_policy_tokens")
    assert f["token_count"] == 300 and len(f["tokens"]) == CAP == 200
    assert f["tokens"][:6] == [[0, 6], [0, 7], [0, 8], [0, 9], [0, 10], [1, 6]]


def test_nan_upload_never_matches():
    scores = [1.0, 0.0, 0.0, 1.0]
    groups = ["a", "a", "b", "b"]
    kinds, rew = _grpo_batch(scores)
    a = G.grpo(torch.tensor(scores, dtype=torch.float64), groups).tolist()
    adv = [[0.0, x, x, 0.0, x] for x in a]
    adv[2][1] = float("nan")
    res = audit_episodes(kinds, adv, rew, groups=groups)
    assert res.best_match["scheme"] is None
    assert [2, 1] in _one(res, "mismatch_unexplained")["tokens"]
    json.dumps(res.as_dict(), allow_nan=False)  # still valid JSON


def test_shapes_are_checked():
    r = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="must be"):
        audit(EstimatorInput(rewards=r, mask=r != 0), torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.int8))


# ---- 3. the registry, matched back to itself -----------------------------------------------

OUTCOME = ["grpo", "dr_grpo", "rloo", "opo", "gpg", "batch_whiten", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("name", OUTCOME)
def test_every_outcome_estimator_is_found(name):
    scores = [1.0, 0.0, 0.0, 0.4, 0.9, 0.1, 0.0, 0.0, 0.7]  # last one: a singleton group
    groups = ["a", "a", "a", "b", "b", "b", "c", "c", "d"]
    kinds = [[Q] + [P] * (2 + i % 3) + [T_, P] for i in range(len(scores))]
    rew = _rewards(scores, kinds)
    T = max(map(len, kinds))
    kt = _kind_codes(kinds, T)
    inp = EstimatorInput(rewards=_pad(rew, T), mask=kt == KIND_POLICY, groups=groups)
    adv = compute(name, inp).advantages
    res = audit(inp, adv, kt)
    assert res.best_match["scheme"] == name
    assert res.best_match["max_abs_diff"] < 1e-9
    assert res.findings == []
    if name == "reinforce_plus_plus_baseline":  # our whitening: float64 count and N/(N-1)
        assert res.best_match["params"]["whiten_factor"] == "float64"


WHITENED = ("verl_gae", "reinforce_plus_plus")


@pytest.mark.parametrize("name", ["token_gae", "verl_gae", "turn_gae", "returns", "reinforce_plus_plus"])
def test_every_token_estimator_is_found(name):
    pol, _ = _kinds_mask()
    kt = _kind_codes()
    rew = _rewards()
    rew[0][2] = 0.2  # a mid-episode reward so gamma shows in returns
    inp = EstimatorInput(rewards=_pad(rew), mask=pol, values=_pad(VALUES), gamma=0.95, lam=0.9)
    adv = compute(name, inp).advantages
    res = audit(inp, adv, kt)
    assert res.best_match["scheme"] == name
    assert res.best_match["max_abs_diff"] < 1e-9
    assert res.best_match["params"]["gamma"] == 0.95
    assert res.best_match["params"].get("whiten_factor") == ("float64" if name in WHITENED else None)
    if "gae" in name:
        assert res.best_match["params"]["lam"] == 0.9
    assert res.findings == []


@pytest.mark.verl
@pytest.mark.parametrize(
    ("estimator", "mask_dtype"),
    [
        ("gae", torch.int64),  # (verl's GAE computes 1 - mask: no bool masks)
        ("gae", torch.float64),
        ("reinforce_plus_plus_baseline", torch.int64),
        ("reinforce_plus_plus_baseline", torch.bool),
        ("reinforce_plus_plus_baseline", torch.float64),
    ],
)
def test_verl_whitening_factor_follows_its_mask_dtype(estimator, mask_dtype):
    # verl's masked_whiten counts tokens with mask.sum(): from an integer or bool mask the count is
    # an integer tensor and N/(N-1) a float32 division, from a float64 mask everything is float64.
    # Both are found to the bit, and named.
    ca = pytest.importorskip("verl.trainer.ppo.core_algos")
    pol, _ = _kinds_mask()
    kt = _kind_codes()
    r, v, m = _pad(_rewards()), _pad(VALUES), pol.to(mask_dtype)
    if estimator == "gae":
        adv, _ = ca.compute_gae_advantage_return(r, v, m, 0.99, 0.95)
        inp = EstimatorInput(rewards=r, mask=pol, values=v)
        scheme = "verl_gae"
    else:
        adv, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(
            r, m, np.array(["a", "a", "b"], dtype=object)
        )
        inp = EstimatorInput(rewards=r, mask=pol, groups=["a", "a", "b"])
        scheme = "reinforce_plus_plus_baseline"
    res = audit(inp, adv * pol, kt)
    assert res.best_match["scheme"] == scheme
    assert res.best_match["params"]["whiten_factor"] == (
        "float64" if mask_dtype == torch.float64 else "float32"
    )
    assert res.best_match["max_abs_diff"] < 1e-9
    assert res.findings == []


def test_verl_unmasked_gae_output_is_a_warning_not_an_error():
    # verl's GAE leaves the carried advantage on masked positions and whitens every position;
    # an upload straight from verl (before the loss masks it) shows that pattern on tool tokens.
    pol, _ = _kinds_mask()
    raw, _ = TK.gae(_pad(_rewards()), _pad(VALUES), pol, 1.0, 0.95)
    carried = raw.clone()
    for i, ks in enumerate(KINDS):  # a plain reversed loop, as verl's
        last = 0.0
        for t in reversed(range(len(ks))):
            if ks[t] == P:
                last = raw[i, t].item()
            carried[i, t] = last
    lengths = torch.tensor([len(k) for k in KINDS])
    real = torch.arange(8)[None, :] < lengths[:, None]
    adv = torch.where(real, whiten(carried, pol), 0.0)  # (the prompt before the first turn too)
    res = audit_episodes(KINDS, _rows(adv), _rewards(), values=VALUES)
    assert res.best_match["scheme"] == "verl_gae" and res.best_match["params"]["mask"] == "policy"
    f = _one(res, "credit_on_non_policy_tokens")
    assert f["severity"] == "warning" and f["evidence"]["verl_carry_pattern"] is True
    assert not res.has_error


def test_float32_upload_still_matches():
    spec = MANIFEST["clean_gae"]
    eps = [json.loads(line) for line in (CORPUS / spec["file"]).read_text().splitlines()]
    res = audit_episodes(
        kinds=[e["kinds"] for e in eps],
        advantages=[torch.tensor(e["advantages"], dtype=torch.float32) for e in eps],
        rewards=[e["rewards"] for e in eps],
        values=[e["values"] for e in eps],
    )
    assert res.best_match["scheme"] == "verl_gae" and res.best_match["params"] == spec["best_match"]["params"]
    assert 0 < res.best_match["max_abs_diff"] < 1e-6
    assert res.findings == []


def test_batch_without_policy_tokens():
    res = audit_episodes([[Q, T_]], [[0.0, 0.0]], [[0.0, 0.0]])
    assert res.best_match["scheme"] is None and res.findings == [] and res.searched == 0


def test_outcome_reward_on_row_end_with_a_policy_sum():
    # A GRPO trainer that sums rewards over policy tokens but scored episode 1 on its final tool
    # token: that episode's score becomes 0, and its whole group's advantages change.
    kinds = [[Q, P, P, T_, P], [Q, P, P, T_, P, T_], [Q, P, T_, P], [Q, P, P, T_, P, T_]]
    scores = [0.0, 1.0, 1.0, 0.0]
    groups = ["a", "a", "b", "b"]
    rew = _rewards(scores, kinds)
    wrong = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)  # episode 1 lost its 1.0
    a = G.grpo(wrong, groups).tolist()
    adv = [[x if k == P else 0.0 for k in ks] for ks, x in zip(kinds, a, strict=True)]
    res = audit_episodes(kinds, adv, rew, groups=groups)
    assert res.best_match["scheme"] == "grpo" and res.best_match["params"]["reward_at"] == "row_end"
    assert _codes(res) == ["reward_on_non_policy_token"]
    f = _one(res, "reward_on_non_policy_token")
    assert f["tokens"] == [[0, 1], [0, 2], [0, 4], [1, 1], [1, 2], [1, 4]]  # group a only
    assert f["evidence"]["reward_tokens"] == [[1, 5]]
