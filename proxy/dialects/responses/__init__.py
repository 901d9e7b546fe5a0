"""OpenAI Responses: models.py (the request body), items.py (what of an input item is kept),
parse.py (→ ``Call``), render.py (the response and its stream events), routes.py (with the
stored responses' ``GET`` / ``DELETE``)."""
