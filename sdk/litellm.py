"""LiteLLM: the ``talaria/<model>`` provider, and the plain ``openai/<model>`` route.

The provider (a LiteLLM ``CustomLLM``, :class:`~talaria.sdk.litellm_provider.TalariaLLM`)
sends each call through :class:`talaria.sdk.OpenAI` / ``AsyncOpenAI``, so it carries the
session of the active :func:`~talaria.sdk.session` scope, with tool-gap learning, or else the
session named by the call (``X-Talaria-*`` headers given or forwarded, ``litellm_session_id``,
``metadata["talaria_session_id"]`` / ``metadata["session_id"]``)::

    import litellm
    from talaria.sdk import session
    from talaria.sdk.litellm import register

    register()  # litellm.custom_provider_map += talaria
    with session():
        litellm.completion(model="talaria/glm-4.5-fp8", messages=[...],
                           api_base="http://127.0.0.1:8000/v1")

The LiteLLM proxy's config.yaml names the same handler (see docs/sdk.md)::

    litellm_settings:
      custom_provider_map:
        - {"provider": "talaria", "custom_handler": talaria.sdk.litellm.talaria_llm}

LiteLLM itself is imported only when the provider is first used (``register()``, or the
attributes ``TalariaLLM`` / ``talaria_llm``): :func:`route` and the rest of ``talaria.sdk``
do not need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from talaria.sdk.headers import base_url_from_env
from talaria.sdk.sessions import Session, current_session

if TYPE_CHECKING:
    from talaria.sdk.litellm_provider import TalariaLLM

PROVIDER = "talaria"
_handler: TalariaLLM | None = None


def route(
    base_url: str | None = None, session: Session | None = None, *, api_key: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for LiteLLM's plain ``openai/<model>`` provider pointed at Talaria:
    ``api_base`` and ``extra_headers`` (the session's headers: ``session``, else the active
    scope's, else none), plus ``api_key`` when given::

        litellm.completion(model="openai/glm-4.5-fp8", messages=..., **route(url, s))

    The session is attached to ``api_base`` (:meth:`Session.attach`), so its hints and its
    end go there. This route sends the session's id and parent, but it does not see replies:
    the session does not learn its tool gaps (prefer the ``talaria/`` provider).
    """
    active = session or current_session()
    api_base = base_url or base_url_from_env()
    kwargs: dict[str, Any] = {
        "api_base": api_base,
        "extra_headers": active.headers() if active is not None else {},
    }
    if active is not None:
        active.attach(api_base, api_key=api_key)
    if api_key is not None:
        kwargs["api_key"] = api_key
    return kwargs


def handler() -> TalariaLLM:
    """The shared provider instance (imports LiteLLM on first use)."""
    global _handler
    if _handler is None:
        from talaria.sdk.litellm_provider import TalariaLLM

        _handler = TalariaLLM()
    return _handler


def register(provider: str = PROVIDER) -> TalariaLLM:
    """Add the provider to ``litellm.custom_provider_map`` as ``provider`` (``talaria/``),
    replacing an entry of that name; returns the handler."""
    import litellm

    llm = handler()
    current = [e for e in litellm.custom_provider_map if e.get("provider") != provider]
    litellm.custom_provider_map = [*current, {"provider": provider, "custom_handler": llm}]
    return llm


def __getattr__(name: str) -> Any:
    """``TalariaLLM`` and ``talaria_llm`` (the instance LiteLLM proxy configs name), lazily."""
    if name == "talaria_llm":
        return handler()
    if name == "TalariaLLM":
        from talaria.sdk.litellm_provider import TalariaLLM

        return TalariaLLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
