"""The model activity: one completion of the worker's model client.

Model calls are I/O with provider-specific failure modes, so they run here, never in the
workflow. The client never retries; a failure leaves this activity as an ``ApplicationError``
that says whether Temporal should try again and, when the provider asked for one, after what
delay (``to_application_error``). Schedule it with ``MODEL_RETRY_POLICY``.
"""

from __future__ import annotations

import logging

import httpx
from temporalio import activity

from tooltrail.activities.tool_execution import heartbeating
from tooltrail.llm.errors import ModelError, ModelHTTPError, to_application_error
from tooltrail.llm.messages import MODEL_COMPLETE, ModelClient, ModelRequest, ModelResponse
from tooltrail.telemetry import chat_span

__all__ = ["ModelActivities"]

log = logging.getLogger("tooltrail.model")


class ModelActivities:
    """Runs the worker's model client."""

    def __init__(self, client: ModelClient) -> None:
        """Wire the model client (``OpenAIChatClient``, ``AnthropicMessagesClient``, ...)."""
        self.client = client

    @activity.defn(name=MODEL_COMPLETE)
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the model's reply to ``request``.

        Heartbeats while the call is in flight, so a lost worker and a cancelled turn are
        noticed during long generations.

        Raises:
            ApplicationError: the call failed; ``ModelUnavailable`` is retryable (with
                ``next_retry_delay`` when the provider sent ``Retry-After``),
                ``ModelRequestRejected``, ``ModelResponseInvalid`` and
                ``ModelScriptExhausted`` are not.
        """
        try:
            with chat_span(
                self.client,
                model=request.model,
                temperature=request.temperature,
                max_tokens=request.max_tokens,
            ) as span:
                async with heartbeating(at_once=False):
                    response = await self.client.complete(request)
                span.finish(
                    input_tokens=response.usage.input_tokens,
                    output_tokens=response.usage.output_tokens,
                    finish_reason=response.stop_reason,
                    response_id=response.raw_id,
                )
                return response
        except (ModelError, httpx.TransportError) as exc:
            error = to_application_error(exc)
            status = exc.status if isinstance(exc, ModelHTTPError) else None
            log.warning(
                "model call failed (attempt %d, status %s, %s): %s",
                activity.info().attempt,
                status,
                "final" if error.non_retryable else "retryable",
                exc,
            )
            raise error from exc
