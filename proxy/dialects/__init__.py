"""API dialects. Each is a folder: ``models.py`` (pydantic request models: its validation and
its OpenAPI schema), ``parse.py`` (request → the normalized ``Call``, core/calls.py),
``render.py`` (the engine's output in its wire format: JSON and SSE), ``routes.py`` (its
FastAPI routes and its ``DIALECT``: routes, request models, error envelope), and one line in
registry.py's ``DIALECTS``. Routing, sessions and scheduling never see a dialect.

- chat/: OpenAI chat completions; completions/: OpenAI text completions;
- anthropic/: Anthropic Messages (and count_tokens), with Anthropic's error envelope;
- responses/: OpenAI Responses (with stored responses, proxy/dialects/responses/store.py);
- base.py: what a dialect is to the app; common.py: validation, the event stream of a call,
  SSE framing; openai_models.py: the OpenAI dialects' shared fields.
"""
