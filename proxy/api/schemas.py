"""JSON schemas of the request bodies, for the OpenAPI document only.

The routes read their bodies by hand (``read_json``, then the dialect parsers in
proxy/dialects/), so FastAPI cannot see them; each route declares its body with
``openapi_extra=request_body(SCHEMA)``. Nothing here validates a request: the parsers do, and
they stay the authority. The schemas describe what the parsers accept that a client really
sends (required fields, types, enums, bounds). They are stricter than the parsers only where no
client goes: content parts, blocks and items without a ``type``, a tool call's Responses
``arguments`` that are not text, a ``prompt_cache_key`` the session check refuses anyway.
Extra fields are allowed everywhere, as the parsers allow them.

tests/integration/test_fuzz_openapi.py holds them to that: schemathesis generates bodies from
the live document and sends them to a proxy, and a body valid here must be answered 2xx or
refused only for what no schema states (a tool choice naming a tool the request does not offer,
a thinking budget not below ``max_tokens``, an unknown model, stored response or session);
bodies shaped as the SDKs send them must validate here.
"""

from __future__ import annotations

import copy
from typing import Any

from talaria.proxy.dialects.anthropic import MIN_THINKING_BUDGET
from talaria.proxy.sessions.identity import MAX_SESSION_ID_CHARS

Schema = dict[str, Any]


def request_body(schema: Schema) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is ``schema`` (a copy: FastAPI puts it in
    the document as is, and the parts below are shared)."""
    content = {"application/json": {"schema": copy.deepcopy(schema)}}
    return {"requestBody": {"required": True, "content": content}}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    out: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = list(required)
    return out


def _const(value: str) -> Schema:
    return {"type": "string", "const": value}


STRING: Schema = {"type": "string"}
NAME: Schema = {"type": "string", "minLength": 1}
BOOL: Schema = {"type": "boolean"}
INT: Schema = {"type": "integer"}
OBJECT: Schema = {"type": "object"}
JSON_SCHEMA: Schema = {"type": "object", "description": "a JSON schema"}
POSITIVE: Schema = {"type": "integer", "minimum": 1}
SESSION_ID: Schema = {
    "type": "string",
    "pattern": rf"^[\x20-\x7e]{{1,{MAX_SESSION_ID_CHARS}}}$",
    "description": "a session id: 1 to 200 printable ASCII characters (docs/proxy.md, Sessions)",
}

# -- OpenAI: shared by chat completions, text completions and Responses ----------------------

_FUNCTION_DEF = _obj(
    {
        "name": NAME,
        "description": _nullable(STRING),
        "parameters": _nullable(JSON_SCHEMA),
        "strict": _nullable(BOOL),
    },
    ("name",),
)
_CHAT_TOOL = {
    "anyOf": [
        _obj({"type": _const("function"), "function": _FUNCTION_DEF}, ("type", "function")),
        _obj({"type": _const("custom"), "custom": OBJECT}, ("type", "custom")),
    ]
}
_MODES: Schema = {"type": "string", "enum": ["auto", "none", "required"]}
_CHAT_TOOL_CHOICE = _nullable(
    {
        "anyOf": [
            _MODES,
            _obj(
                {"type": _const("function"), "function": _obj({"name": NAME}, ("name",))},
                ("type", "function"),
            ),
        ]
    }
)
_STOP = _nullable({"anyOf": [STRING, {"type": "array", "items": STRING}]})
_REASONING_EFFORT: Schema = {
    "type": "string",
    "enum": ["none", "minimal", "low", "medium", "high", "xhigh"],
}

OPENAI_COMMON: dict[str, Schema] = {
    "model": NAME,
    "stream": BOOL,
    "stream_options": _nullable(_obj({"include_usage": BOOL})),
    "max_tokens": _nullable(POSITIVE),
    "n": {"type": "integer", "minimum": 1, "maximum": 1, "description": "only n=1 is supported"},
    "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
    "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "top_k": _nullable({"type": "integer", "minimum": -1}),
    "seed": _nullable(INT),
    "stop": _STOP,
    "presence_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "frequency_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "user": _nullable(STRING),
    "prompt_cache_key": _nullable(SESSION_ID),
    "litellm_session_id": _nullable(SESSION_ID),
}

_CONTENT_PART = _obj({"type": STRING, "text": STRING}, ("type",))
_CHAT_TOOL_CALL = _obj(
    {
        "id": _nullable(STRING),
        "type": _const("function"),
        "function": _obj(
            {"name": STRING, "arguments": {"anyOf": [STRING, OBJECT]}},
            ("name",),
        ),
    },
    ("function",),
)
CHAT_MESSAGE = _obj(
    {
        "role": {
            "type": "string",
            "enum": ["system", "developer", "user", "assistant", "tool", "function"],
        },
        "content": _nullable({"anyOf": [STRING, {"type": "array", "items": _CONTENT_PART}]}),
        "tool_calls": _nullable({"type": "array", "items": _CHAT_TOOL_CALL}),
        "tool_call_id": _nullable(STRING),
        "name": _nullable(STRING),
        "reasoning_content": _nullable(STRING),
    },
    ("role",),
)
_CHAT_RESPONSE_FORMAT = _nullable(
    {
        "anyOf": [
            _obj({"type": {"type": "string", "enum": ["text", "json_object"]}}, ("type",)),
            _obj(
                {
                    "type": _const("json_schema"),
                    "json_schema": _obj(
                        {"name": STRING, "schema": JSON_SCHEMA, "strict": _nullable(BOOL)}
                    ),
                },
                ("type", "json_schema"),
            ),
        ]
    }
)

CHAT_COMPLETIONS = _obj(
    {
        **OPENAI_COMMON,
        "messages": {"type": "array", "items": CHAT_MESSAGE, "minItems": 1},
        "max_completion_tokens": _nullable(POSITIVE),
        "tools": _nullable({"type": "array", "items": _CHAT_TOOL}),
        "tool_choice": _CHAT_TOOL_CHOICE,
        "logprobs": BOOL,
        "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 20}),
        "response_format": _CHAT_RESPONSE_FORMAT,
        "reasoning_effort": _nullable(_REASONING_EFFORT),
        "parallel_tool_calls": _nullable(BOOL),
        "chat_template_kwargs": _nullable(OBJECT),
    },
    ("model", "messages"),
    title="ChatCompletionRequest",
)

COMPLETIONS = _obj(
    {
        **OPENAI_COMMON,
        "prompt": {
            "anyOf": [STRING, {"type": "array", "items": STRING, "minItems": 1, "maxItems": 1}],
            "description": "one prompt per request",
        },
        "logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 5}),
    },
    ("model", "prompt"),
    title="CompletionRequest",
)

# -- Anthropic Messages -----------------------------------------------------------------------

_TEXT_BLOCK = _obj({"type": _const("text"), "text": STRING}, ("type", "text"))
_IMAGE_SOURCE = {
    "anyOf": [
        _obj(
            {"type": _const("base64"), "media_type": STRING, "data": STRING},
            ("type", "media_type", "data"),
        ),
        _obj({"type": _const("url"), "url": STRING}, ("type", "url")),
    ]
}
_IMAGE_BLOCK = _obj({"type": _const("image"), "source": _IMAGE_SOURCE}, ("type", "source"))
_DOCUMENT_BLOCK = _obj(
    {
        "type": _const("document"),
        "source": _obj(
            {
                "type": STRING,
                "content": {"anyOf": [STRING, {"type": "array", "items": _TEXT_BLOCK}]},
            },
            ("type",),
        ),
    },
    ("type", "source"),
)
_TOOL_RESULT_BLOCK = _obj(
    {
        "type": _const("tool_result"),
        "tool_use_id": STRING,
        "content": {
            "anyOf": [STRING, {"type": "array", "items": {"anyOf": [_TEXT_BLOCK, _IMAGE_BLOCK]}}]
        },
        "is_error": BOOL,
    },
    ("type", "tool_use_id"),
)
_TOOL_USE_BLOCK = _obj(
    {"type": _const("tool_use"), "id": STRING, "name": STRING, "input": OBJECT},
    ("type", "id", "name", "input"),
)
_THINKING_BLOCK = _obj(
    {"type": _const("thinking"), "thinking": STRING, "signature": STRING}, ("type", "thinking")
)
_REDACTED_BLOCK = _obj({"type": _const("redacted_thinking"), "data": STRING}, ("type", "data"))
_KNOWN_BLOCKS = [
    "text",
    "image",
    "document",
    "tool_result",
    "tool_use",
    "thinking",
    "redacted_thinking",
]
_OTHER_BLOCK = _obj(
    {"type": {"type": "string", "minLength": 1, "not": {"enum": _KNOWN_BLOCKS}}},
    ("type",),
    description="server-tool and other blocks: accepted and left out of the prompt",
)
ANTHROPIC_BLOCK: Schema = {
    "anyOf": [
        _TEXT_BLOCK,
        _IMAGE_BLOCK,
        _DOCUMENT_BLOCK,
        _TOOL_RESULT_BLOCK,
        _TOOL_USE_BLOCK,
        _THINKING_BLOCK,
        _REDACTED_BLOCK,
        _OTHER_BLOCK,
    ]
}
ANTHROPIC_MESSAGE = _obj(
    {
        "role": {"type": "string", "enum": ["user", "assistant", "system"]},
        "content": {"anyOf": [STRING, {"type": "array", "items": ANTHROPIC_BLOCK}]},
    },
    ("role", "content"),
)
_ANTHROPIC_SYSTEM = _nullable({"anyOf": [STRING, {"type": "array", "items": _TEXT_BLOCK}]})
_ANTHROPIC_TOOL = _obj(
    {
        "name": NAME,
        "description": _nullable(STRING),
        "input_schema": _nullable(JSON_SCHEMA),
        "type": _nullable(STRING),
    },
    ("name",),
    description="a custom tool (with input_schema) or a server tool (left out)",
)
_ANTHROPIC_TOOL_CHOICE = _nullable(
    {
        "anyOf": [
            _obj(
                {
                    "type": {"type": "string", "enum": ["auto", "any", "none"]},
                    "disable_parallel_tool_use": BOOL,
                },
                ("type",),
            ),
            _obj(
                {"type": _const("tool"), "name": NAME, "disable_parallel_tool_use": BOOL},
                ("type", "name"),
            ),
        ]
    }
)
_THINKING = _nullable(
    {
        "anyOf": [
            _obj(
                {
                    "type": _const("enabled"),
                    "budget_tokens": {
                        "type": "integer",
                        "minimum": MIN_THINKING_BUDGET,
                        "description": "less than max_tokens (but with interleaved thinking)",
                    },
                },
                ("type", "budget_tokens"),
            ),
            _obj({"type": {"type": "string", "enum": ["disabled", "adaptive"]}}, ("type",)),
        ]
    }
)

MESSAGES = _obj(
    {
        "model": NAME,
        "messages": {"type": "array", "items": ANTHROPIC_MESSAGE, "minItems": 1},
        "max_tokens": POSITIVE,
        "system": _ANTHROPIC_SYSTEM,
        "stop_sequences": _nullable({"type": "array", "items": STRING}),
        "stream": BOOL,
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": _nullable({"type": "integer", "minimum": 0}),
        "tools": _nullable({"type": "array", "items": _ANTHROPIC_TOOL}),
        "tool_choice": _ANTHROPIC_TOOL_CHOICE,
        "thinking": _THINKING,
        "metadata": _nullable(
            _obj(
                {
                    "user_id": _nullable(
                        {
                            "type": "string",
                            "description": "Claude Code puts its session id here (docs/proxy.md)",
                        }
                    )
                }
            )
        ),
    },
    ("model", "messages", "max_tokens"),
    title="MessagesRequest",
)

COUNT_TOKENS = _obj(
    {k: v for k, v in MESSAGES["properties"].items() if k != "max_tokens"},
    ("model", "messages"),
    title="CountTokensRequest",
    description="A Messages request without max_tokens",
)

# -- OpenAI Responses -------------------------------------------------------------------------

_PART = _obj({"type": STRING, "text": STRING}, ("type",))
_PARTS: Schema = {"anyOf": [STRING, {"type": "array", "items": _PART}]}
_MESSAGE_ITEM = _obj(
    {
        "type": _const("message"),
        "id": STRING,
        "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
        "content": _PARTS,
    },
    ("role", "content"),
)
_FUNCTION_CALL_ITEM = _obj(
    {
        "type": _const("function_call"),
        "id": STRING,
        "call_id": STRING,
        "name": STRING,
        "arguments": STRING,
    },
    ("type", "call_id", "name", "arguments"),
)
_FUNCTION_OUTPUT_ITEM = _obj(
    {"type": _const("function_call_output"), "id": STRING, "call_id": STRING, "output": _PARTS},
    ("type", "call_id", "output"),
)
_REASONING_ITEM = _obj(
    {
        "type": _const("reasoning"),
        "id": STRING,
        "summary": {"type": "array", "items": _PART},
        "content": {"type": "array", "items": _PART},
        "encrypted_content": _nullable(STRING),
    },
    ("type",),
)
_OTHER_ITEM = _obj(
    {
        "type": {
            "type": "string",
            "minLength": 1,
            "not": {
                "enum": [
                    "message",
                    "function_call",
                    "function_call_output",
                    "reasoning",
                    "item_reference",
                ]
            },
        }
    },
    ("type",),
    description="built-in tools' items and the like: accepted and skipped "
    "(item_reference is refused)",
)
RESPONSES_ITEM: Schema = {
    "anyOf": [
        _MESSAGE_ITEM,
        _FUNCTION_CALL_ITEM,
        _FUNCTION_OUTPUT_ITEM,
        _REASONING_ITEM,
        _OTHER_ITEM,
    ]
}
_RESPONSES_FUNCTION = _obj(
    {
        "type": _const("function"),
        "name": NAME,
        "description": _nullable(STRING),
        "parameters": _nullable(JSON_SCHEMA),
        "strict": _nullable(BOOL),
    },
    ("type", "name"),
)
_RESPONSES_NAMESPACE = _obj(
    {"type": _const("namespace"), "tools": {"type": "array", "items": _RESPONSES_FUNCTION}},
    ("type", "tools"),
    description="Codex's group of tools: opened",
)
_RESPONSES_BUILTIN = _obj(
    {"type": {"type": "string", "minLength": 1, "not": {"enum": ["function", "namespace"]}}},
    ("type",),
    description="built-in tools (web search, ...): left out",
)
_RESPONSES_TOOL_CHOICE = _nullable(
    {
        "anyOf": [
            _MODES,
            _obj({"type": _const("function"), "name": NAME}, ("type", "name")),
        ]
    }
)
_TEXT_FORMAT = {
    "anyOf": [
        _obj({"type": {"type": "string", "enum": ["text", "json_object"]}}, ("type",)),
        _obj(
            {
                "type": _const("json_schema"),
                "name": STRING,
                "schema": JSON_SCHEMA,
                "strict": _nullable(BOOL),
            },
            ("type", "schema"),
        ),
    ]
}

RESPONSES = _obj(
    {
        "model": NAME,
        "input": {"anyOf": [STRING, {"type": "array", "items": RESPONSES_ITEM}]},
        "instructions": _nullable(STRING),
        "tools": _nullable(
            {
                "type": "array",
                "items": {"anyOf": [_RESPONSES_FUNCTION, _RESPONSES_NAMESPACE, _RESPONSES_BUILTIN]},
            }
        ),
        "tool_choice": _RESPONSES_TOOL_CHOICE,
        "parallel_tool_calls": BOOL,
        "previous_response_id": _nullable(STRING),
        "store": BOOL,
        "stream": BOOL,
        "max_output_tokens": _nullable(POSITIVE),
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 20}),
        "text": _nullable(_obj({"format": _TEXT_FORMAT})),
        "reasoning": _nullable(
            _obj({"effort": _nullable(_REASONING_EFFORT), "summary": _nullable(STRING)})
        ),
        "metadata": _nullable(OBJECT),
        "prompt_cache_key": _nullable(SESSION_ID),
        "user": _nullable(STRING),
    },
    ("model", "input"),
    title="ResponsesRequest",
)
