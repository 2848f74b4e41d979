"""Build the worker's model client from tooltrail's ``Settings``.

The endpoints and keys are ``Settings`` fields (``TOOLTRAIL_OPENAI_BASE_URL``,
``TOOLTRAIL_OPENAI_API_KEY``, ``TOOLTRAIL_ANTHROPIC_BASE_URL``,
``TOOLTRAIL_ANTHROPIC_API_KEY``, ``TOOLTRAIL_MODEL``); which provider to use is the caller's
choice, because one deployment may hold keys for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from tooltrail.errors import ConfigurationError
from tooltrail.settings import Settings

if TYPE_CHECKING:
    from tooltrail.llm.anthropic import AnthropicMessagesClient
    from tooltrail.llm.openai import OpenAIChatClient

__all__ = ["Provider", "build_model_client"]

Provider = Literal["openai", "anthropic"]
"""``openai`` (any Chat Completions server) or ``anthropic`` (the Messages API)."""


def build_model_client(
    provider: Provider,
    settings: Settings | None = None,
    *,
    model: str | None = None,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> OpenAIChatClient | AnthropicMessagesClient:
    """Return the client of ``provider``, with the base URL and key from ``settings``.

    The caller owns the client: close it with ``await client.aclose()`` (or ``async with``).
    Only the chosen provider's SDK is imported, so one extra is enough
    (``tooltrail[openai]`` or ``tooltrail[anthropic]``).

    Args:
        provider: which API to speak.
        settings: tooltrail's settings (default: read from the environment).
        model: the default model name (default: ``settings.model``).
        timeout_s: the timeout of one request (default: the SDK's, 600 s).
        headers: more headers for every request.

    Raises:
        ConfigurationError: no model name was given and ``TOOLTRAIL_MODEL`` is not set.
        ImportError: the provider's SDK is not installed (the message names the extra).
    """
    settings = settings or Settings()
    name = model or settings.model
    if not name:
        raise ConfigurationError(
            "no model name: set TOOLTRAIL_MODEL or pass model=... to build_model_client"
        )
    if provider == "anthropic":
        from tooltrail.llm.anthropic import AnthropicMessagesClient

        key = settings.anthropic_api_key
        return AnthropicMessagesClient(
            api_key=key.get_secret_value() if key else None,
            model=name,
            base_url=settings.anthropic_base_url,
            timeout_s=timeout_s,
            headers=headers,
        )
    from tooltrail.llm.openai import OpenAIChatClient

    key = settings.openai_api_key
    return OpenAIChatClient(
        settings.openai_base_url,
        api_key=key.get_secret_value() if key else None,
        model=name,
        timeout_s=timeout_s,
        headers=headers,
    )
