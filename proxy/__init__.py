"""The OpenAI-compatible session gateway: API, session store, routing, admin."""
