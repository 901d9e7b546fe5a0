"""Anthropic Messages: models.py (the request bodies), parse.py (→ ``Call``), render.py (the
message and its stream events), errors.py (Anthropic's envelope), routes.py."""
