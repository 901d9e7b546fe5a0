"""The prompt ids of a ``VLLMEngine``'s calls, as its tokenizer renders them: computed once for
the estimates and the admission and kept until the call runs (generate.py)."""

from __future__ import annotations

from collections import OrderedDict

from talaria.core.types import CallRequest
from talaria.runtime.engines.tokenizer import Tokenizer
from talaria.runtime.engines.vllm.kv import SessionMemory

PROMPT_MEMO = 256
"""Tokenized prompts kept between ``estimate_service_s`` / ``try_admit`` and ``run``."""


class PromptIds:
    """The calls' prompt ids, memoised per request (the ``PROMPT_MEMO`` most recent)."""

    def __init__(self, tokenizer: Tokenizer, memory: SessionMemory) -> None:
        self._tok = tokenizer
        self._memory = memory
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()

    def get(self, request: CallRequest) -> list[int]:
        """The call's prompt ids: ``messages`` through the chat template, else its text
        ``prompt``, else synthetic ids of length ``prompt_tokens``."""
        ids = self._prompts.get(request.request_id)
        if ids is not None:
            return ids
        call = request.call
        if call is not None and call.messages is not None:
            tools = [t.to_openai() for t in call.tools] or None
            ids = self._tok.encode_chat(call.messages, tools, call.template_kwargs)
        elif call is not None and call.prompt is not None:
            ids = self._tok.encode(call.prompt)
        else:
            ids = self._memory.synthetic_ids(request)
        self._prompts[request.request_id] = ids
        while len(self._prompts) > PROMPT_MEMO:
            self._prompts.popitem(last=False)
        return ids

    def forget(self, request_id: str) -> None:
        """The call runs now: its ids are no longer needed here."""
        self._prompts.pop(request_id, None)
