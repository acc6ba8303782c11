"""HTTP: the JSON API, the pages, error handlers, access control and templating. The top layer; imports
any layer below it."""
