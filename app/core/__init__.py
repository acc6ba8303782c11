"""Pure definitions: the domain rules, schemas, schemes, settings, URLs and view state, array codecs and
validation. Nothing here touches the database or FastAPI; every other layer imports from here."""
