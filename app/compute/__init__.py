"""Computation on decoded episodes: advantages through the estimator registry, batch diagnostics, run
step metrics and the audit. Imports app.core and app.ingest (never the database or HTTP)."""
