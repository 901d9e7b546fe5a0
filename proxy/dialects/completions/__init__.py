"""OpenAI text completions: models.py (the request body), parse.py (→ ``Call``), render.py
(the completion and its chunks), routes.py."""
