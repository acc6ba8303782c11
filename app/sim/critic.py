"""A small learned critic over token ids, and how well it explains the returns.

The critic reads the whole token sequence (prompt, calls and tool output) through a hashed
vocabulary, an embedding and one causal transformer block, and predicts at column j the value of the prefix *before*
token j (its input is shifted right by one BOS), i.e. the context in which token j was chosen.
It is fitted by masked MSE on policy positions to Monte Carlo return targets (gamma = 1; a
truncated episode's return includes its bootstrap value).

Diagnostics: explained variance on the training episodes and on fresh episodes of the same
policy, the explained variance the *true* turn values reach on those fresh episodes (the ceiling:
a 0/1 outcome is random given any prefix), and the critic's value at the first token of each turn
of one episode next to the true turn values.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from app.core.arrays import arrays_from_native
from app.core.domain import passed, policy_mask, turn_spans
from app.core.schemas import EpisodeIn
from estimators import explained_variance, returns_to_go

VOCAB = 4096


def token_id(tok: str) -> int:
    """Stable hashed id in [1, VOCAB) (0 is BOS/padding); crc32 so it is the same in every process."""
    return 1 + zlib.crc32(tok.encode("utf-8")) % (VOCAB - 1)


class TinyCritic(nn.Module):
    """A one-layer causal transformer: ids [B, T] -> values [B, T].

    Embedding(VOCAB, d) + learned positions -> one pre-norm causal self-attention block -> Linear(1).
    Chosen over a GRU because it is parallel over T: a fit takes seconds on one CPU thread.
    """

    def __init__(self, d: int = 32, heads: int = 2, ff: int = 64, max_len: int = 2048):
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(VOCAB, d, padding_idx=0)
        self.pos = nn.Embedding(max_len, d)
        self.block = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, ids: Tensor) -> Tensor:
        T = ids.shape[1]
        # Shift right: the output at column j has seen tokens 0..j-1 only (column 0 sees BOS).
        x = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], dim=1)
        pos = torch.arange(T).clamp(max=self.max_len - 1)
        h = self.embed(x) + self.pos(pos)[None]
        causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        h = self.block(h, src_mask=causal)
        out: Tensor = self.head(self.norm(h)).squeeze(-1)  # nn.Module.__call__ is untyped
        return out


@dataclass
class Batch:
    """Padded tensors of a list of episodes. ids, mask, rewards, returns: [B, T]; lengths: [B]."""

    ids: Tensor
    mask: Tensor
    rewards: Tensor
    returns: Tensor
    lengths: list[int] = field(default_factory=list)


def to_batch(episodes: list[EpisodeIn]) -> Batch:
    """Pad episodes into [B, T] tensors; returns are Monte Carlo returns-to-go on policy positions."""
    B, T = len(episodes), max(len(e.tokens) for e in episodes)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    rewards = torch.zeros(B, T, dtype=torch.float64)
    boot = torch.zeros(B, dtype=torch.float64)
    for i, e in enumerate(episodes):
        n = len(e.tokens)
        a = arrays_from_native(e)
        ids[i, :n] = torch.tensor([token_id(t) for t in e.tokens])
        mask[i, :n] = torch.from_numpy(a.policy)
        rewards[i, :n] = torch.from_numpy(a.rewards)  # the outcome on the last policy token
        if e.truncated and e.bootstrap_value is not None:
            boot[i] = e.bootstrap_value
    # gamma = 1: a truncated episode's bootstrap value adds to every return of that episode.
    returns = returns_to_go(rewards, mask, gamma=1.0) + boot[:, None] * mask
    return Batch(ids, mask, rewards, returns, [len(e.tokens) for e in episodes])


@contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """Seeded, single-threaded torch for the duration (same seed -> same critic, bit for bit)."""
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def fit_critic(
    episodes: list[EpisodeIn],
    *,
    steps: int = 80,
    lr: float = 1e-2,
    batch_size: int = 32,
    seed: int = 0,
    warm_start: TinyCritic | None = None,
    progress: Callable[[float], None] | None = None,
) -> tuple[TinyCritic, list[float]]:
    """Fit a TinyCritic by masked MSE to MC returns; returns (model, loss per step).

    warm_start: start from a copy of this critic's weights instead of a fresh initialisation.
    """
    data = to_batch(episodes)
    target = data.returns.float()
    with _deterministic(seed):
        model = TinyCritic()
        if warm_start is not None:
            model.load_state_dict(warm_start.state_dict())
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        g = torch.Generator().manual_seed(seed)
        losses = []
        B = len(episodes)
        for step in range(steps):
            idx = torch.randperm(B, generator=g)[: min(batch_size, B)]
            T = max(data.lengths[i] for i in idx.tolist())
            pred = model(data.ids[idx, :T])
            m = data.mask[idx, :T]
            loss = ((pred - target[idx, :T]) ** 2)[m].mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            if progress and (step % 10 == 9 or step == steps - 1):
                progress((step + 1) / steps)
    return model, losses


@torch.no_grad()
def critic_values(model: TinyCritic, episodes: list[EpisodeIn]) -> list[list[float]]:
    """The critic's value at every token of every episode (meaningful on policy tokens only)."""
    data = to_batch(episodes)
    out = []
    for i in range(0, len(episodes), 64):
        v = model(data.ids[i : i + 64])
        for j in range(v.shape[0]):
            out.append(v[j, : data.lengths[i + j]].tolist())
    return out


def _ev(values: list[list[float]], episodes: list[EpisodeIn]) -> float:
    data = to_batch(episodes)
    pred = torch.zeros_like(data.returns)
    for i, v in enumerate(values):
        pred[i, : len(v)] = torch.tensor(v, dtype=torch.float64)
    return float(explained_variance(pred, data.returns, data.mask))


def _turn_start_pairs(
    values: list[list[float]], episodes: list[EpisodeIn]
) -> list[tuple[float, float, float]]:
    """(critic value, true value, MC return) at the first token of every turn."""
    data = to_batch(episodes)
    rows: list[tuple[float, float, float]] = []
    for i, (v, e) in enumerate(zip(values, episodes, strict=True)):
        tv = e.meta.get("turn_values")
        spans = turn_spans(policy_mask(e.kinds))
        if tv is None or len(tv) != len(spans):
            continue
        for k, (a, _) in enumerate(spans):
            rows.append((v[a], tv[k], float(data.returns[i, a])))
    return rows


def value_trace(values: list[float], episode: EpisodeIn) -> list[dict[str, Any]]:
    """Per turn of one episode: the call, its effect, the critic's value at the turn's first token
    and the true value of the turn-start state."""
    tv = episode.meta.get("turn_values") or []
    calls = episode.meta.get("calls") or []
    out = []
    for k, (a, _) in enumerate(turn_spans(policy_mask(episode.kinds))):
        c = calls[k] if k < len(calls) else {}
        out.append(
            {
                "turn": k,
                "action": c.get("action"),
                "effect": c.get("effect"),
                "critic": round(values[a], 4),
                "true": round(tv[k], 4) if k < len(tv) else None,
            }
        )
    return out


def pick_trace_episode(episodes: list[EpisodeIn]) -> int:
    """Index of a successful episode with the most turns (ties: the first), for the value trace."""
    best, best_len = 0, -1
    for i, e in enumerate(episodes):
        n = len(e.meta.get("calls") or [])
        a = arrays_from_native(e)
        if passed(a.reward, a.score) and n > best_len:
            best, best_len = i, n
    return best


def critic_report(
    model: TinyCritic,
    train: list[EpisodeIn],
    fresh: list[EpisodeIn],
    losses: list[float] | None = None,
) -> dict[str, Any]:
    """Explained variance of the critic on train and fresh episodes, the true-value ceiling on the
    fresh ones, and the value trace along one successful training episode."""
    v_train = critic_values(model, train)
    v_fresh = critic_values(model, fresh)
    pairs = _turn_start_pairs(v_fresh, fresh)
    report: dict[str, Any] = {
        "explained_variance_train": round(_ev(v_train, train), 4),
        "explained_variance_fresh": round(_ev(v_fresh, fresh), 4),
        "n_train": len(train),
        "n_fresh": len(fresh),
    }
    if pairs:
        c, t, g = (torch.tensor(x, dtype=torch.float64) for x in zip(*pairs, strict=True))
        report["turn_start_explained_variance_fresh"] = {
            "critic": round(float(explained_variance(c, g)), 4),
            "true_values": round(float(explained_variance(t, g)), 4),
        }
        report["turn_start_rmse_vs_true_fresh"] = round(float(((c - t) ** 2).mean().sqrt()), 4)
    if losses:
        report["final_loss"] = round(sum(losses[-20:]) / len(losses[-20:]), 5)
    i = pick_trace_episode(train)
    report["trace"] = {
        "episode": i,
        "task": train[i].meta.get("task"),
        "turns": value_trace(v_train[i], train[i]),
    }
    return report
