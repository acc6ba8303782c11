"""Token-level BugFix-style agent simulator.

tasks.py (20 buggy functions with real tests), policy.py (latent dynamics + stochastic policy),
truth.py (exact and Monte Carlo values), env.py (token-level episodes), critic.py (small learned
critic + diagnostics), diagnostics.py (`sim_diagnostics`), service.py (`run_sample`), routes.py
(POST /api/samples, GET /sample), make_fixtures.py (`make fixtures`).
"""

from app.sim.diagnostics import sim_diagnostics
from app.sim.env import sample_batch

__all__ = ["sample_batch", "sim_diagnostics"]
