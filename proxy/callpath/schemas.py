"""The proxy's edge check of the JSON schemas a call carries (tool parameters, a response
format): ``core.schema_instance.check_schemas``, all of them within one budget per request,
refused with a 400 before a session is found or anything runs.

Agents resend the same tools on every call of a session (Claude Code's dozen tools: 0.1–0.3 ms
to check), so a tool set that passed is remembered by its digest (the one the session book
computes anyway, proxy/sessions/conversation.py ``tools_fingerprint``) with what of the budget
its build left, up to ``REMEMBERED_TOOL_SETS`` of them, least recently used out. A response
format's schema is checked on every call (it is rare, and usually small), within what the
tools left: a request is refused or not whether its tools were remembered or not.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from talaria.core.calls import Call
from talaria.core.schema_instance import InstanceBudget, SchemaTooLarge, check_schemas
from talaria.proxy.contract.errors import bad_request

REMEMBERED_TOOL_SETS = 4096


class SchemaCheck:
    """The edge check of a call's schemas, remembering up to ``remember`` tool sets that
    passed, by digest, with the budget their build left (least recently used out)."""

    def __init__(self, remember: int = REMEMBERED_TOOL_SETS) -> None:
        self._remember = remember
        self._passed: OrderedDict[bytes, InstanceBudget] = OrderedDict()

    def __len__(self) -> int:
        return len(self._passed)

    def check(self, call: Call, tools_digest: bytes, format_param: str) -> None:
        """Raise a 400 ``ApiError`` (code ``schema_too_large``) for a call whose schemas
        cannot all be built within one budget of core/schema_instance.py."""
        left = self._passed.get(tools_digest) if call.tools else None
        tools = () if left is not None else call.tools
        budget = InstanceBudget() if left is None else replace(left)
        try:
            after_tools = check_schemas(tools, None, "tools", budget)
            if left is None and tools:
                self._passed[tools_digest] = replace(after_tools)
                while len(self._passed) > self._remember:
                    self._passed.popitem(last=False)
            elif left is not None:
                self._passed.move_to_end(tools_digest)
            check_schemas((), call.sampling.response_format, format_param, after_tools)
        except SchemaTooLarge as exc:
            raise bad_request(str(exc), param=exc.param, code=exc.code) from None
