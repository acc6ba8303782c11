"""Pure definitions: the domain rules, the metrics (app/core/metrics.py), schemas, schemes, settings, URLs and view state, array codecs and
validation. Nothing here touches the database or FastAPI; every other layer imports from here."""
