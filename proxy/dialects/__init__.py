"""API dialects: each module parses its request into the normalized ``Call`` (core/calls.py)
and renders the engine's output back in its own wire format and error envelope.

- chat.py: OpenAI chat completions; completions.py: OpenAI text completions;
- anthropic.py: Anthropic Messages (and count_tokens);
- responses.py: OpenAI Responses (with stored responses, responses_store.py);
- common.py: what they share (validation, the event stream of a call, SSE framing).
"""
