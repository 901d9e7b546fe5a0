"""Talaria's client SDK: the OpenAI clients, plus agent sessions.

```python
from talaria.sdk import OpenAI, session

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="local")
with session() as s:  # every call inside is one Talaria session; ended on exit
    client.chat.completions.create(model="glm-4.5-fp8", messages=[...], tools=[...])
```

Thin on purpose: it needs ``openai`` and ``httpx`` only (LiteLLM only for
:mod:`talaria.sdk.litellm`, imported lazily), and works against any OpenAI-compatible server
(where the server is not Talaria the extra headers are ignored). See docs/sdk.md.
"""

from talaria.sdk.client import AsyncOpenAI, OpenAI
from talaria.sdk.headers import (
    DEADLINE_S,
    DEFAULT_GAP_S,
    PARENT_SESSION_ID,
    PRIORITY,
    SESSION_FINAL,
    SESSION_ID,
    TOOL_GAP_MS,
    session_headers,
)
from talaria.sdk.sessions import Session, current_session, session
from talaria.sdk.sidechannel import SideChannel

__all__ = [
    "DEADLINE_S",
    "DEFAULT_GAP_S",
    "PARENT_SESSION_ID",
    "PRIORITY",
    "SESSION_FINAL",
    "SESSION_ID",
    "TOOL_GAP_MS",
    "AsyncOpenAI",
    "OpenAI",
    "Session",
    "SideChannel",
    "current_session",
    "session",
    "session_headers",
]
