"""The proxy's edge check of the JSON schemas a call carries (tool parameters, a response
format): ``core.schema_instance.check_schemas``, refused with a 400 before a session is found
or anything runs.

Agents resend the same tools on every call of a session (Claude Code's dozen tools: 0.1–0.3 ms
to check), so a tool set that passed is remembered by its digest (the one the session book
computes anyway, proxy/sessions/conversation.py ``tools_fingerprint``), up to
``REMEMBERED_TOOL_SETS`` of them, least recently used out. A response format's schema is
checked on every call (it is rare, and usually small).
"""

from __future__ import annotations

from collections import OrderedDict

from talaria.core.calls import Call
from talaria.core.schema_instance import SchemaTooLarge, check_schemas
from talaria.proxy.errors import bad_request

REMEMBERED_TOOL_SETS = 4096

FORMAT_PARAMS = {"responses": "text.format"}
"""Where each API carries the response format, when not at ``response_format``."""


class SchemaCheck:
    """The edge check of a call's schemas, remembering up to ``remember`` tool sets that
    passed, by digest (least recently used out)."""

    def __init__(self, remember: int = REMEMBERED_TOOL_SETS) -> None:
        self._remember = remember
        self._passed: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._passed)

    def check(self, call: Call, tools_digest: bytes, api: str) -> None:
        """Raise a 400 ``ApiError`` (code ``schema_too_large``) for a call whose schemas
        cannot be built within the budget of core/schema_instance.py."""
        tools = () if tools_digest in self._passed else call.tools
        try:
            check_schemas(
                tools, call.sampling.response_format, FORMAT_PARAMS.get(api, "response_format")
            )
        except SchemaTooLarge as exc:
            raise bad_request(str(exc), param=exc.param, code=exc.code) from None
        if tools:
            self._passed[tools_digest] = None
            while len(self._passed) > self._remember:
                self._passed.popitem(last=False)
        elif call.tools:
            self._passed.move_to_end(tools_digest)
