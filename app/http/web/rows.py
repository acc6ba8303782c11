"""The episode page's "Rows shown" panel: every row the page can draw, in groups a reader scans
(outcome, token, turn, trainer, audit, signals), each with a one-line explanation."""

from __future__ import annotations

from typing import Any

from app.core import schemes

# The service and audit rows by name; every other row goes by its kind (estimators/registry.py).
TRAINER = ("uploaded",)
AUDIT = ("audit_reference", "audit_diff", "loss_weights")

GROUPS: tuple[tuple[str, str, str], ...] = (
    (
        "trainer",
        "The trainer's",
        "Your advantages, as uploaded; below, each trainer's own estimator (trainer:name), computed here.",
    ),
    (
        "audit",
        "Audit",
        "The configuration that best explains the uploaded advantages, where the upload differs from it, "
        "and what the loss does with them.",
    ),
    (
        "outcome",
        "Outcome",
        "One number per episode from its group's rewards, on every policy token (γ, λ do not apply).",
    ),
    (
        "token",
        "Token",
        "A number per policy token from the rewards and the critic; γ once per policy token, tool spans skipped.",
    ),
    ("turn", "Turn", "One step per call: the call's tokens share its advantage."),
)


def is_trainer_dialect(name: str) -> bool:
    """A trainer's own estimator, named "<trainer>:<name>" (estimators/registry.py)."""
    return ":" in name


def group_of(row: dict[str, Any]) -> str:
    """The group of one catalog row (schemes.catalog())."""
    name = row["name"]
    if name in TRAINER or is_trainer_dialect(name):
        return "trainer"
    if name in AUDIT:
        return "audit"
    return row["kind"] if row["kind"] in ("outcome", "token", "turn") else "token"


def row_groups(shown: list[str]) -> list[dict[str, Any]]:
    """[{id, title, note, rows, dialects, dialects_open}] in display order; ``dialects``: the
    trainer group's "<trainer>:<name>" rows (a long list, collapsed unless one is ``shown``)."""
    out: list[dict[str, Any]] = [
        {"id": g, "title": t, "note": n, "rows": [], "dialects": []} for g, t, n in GROUPS
    ]
    by_id = {g["id"]: g for g in out}
    for row in schemes.catalog():
        g = by_id[group_of(row)]
        (g["dialects"] if is_trainer_dialect(row["name"]) else g["rows"]).append(row)
    for g in out:
        g["dialects_open"] = any(r["name"] in shown for r in g["dialects"])
    return out
