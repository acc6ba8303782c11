"""Persistence: the engine and sessions, tables, row codecs, the episode and run stores, jobs,
migrations and the caches of computed results. Imports app.core, app.ingest and app.compute."""
