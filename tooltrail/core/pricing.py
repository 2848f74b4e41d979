"""The operator's price table, and what one model call is estimated to cost.

Prices come from the settings (``TOOLTRAIL_MODEL_PRICES``), never from the network: a price
list looked up at run time would make the trail's costs depend on when it was read. The
table is a JSON object of model name to USD per million tokens::

    {"gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25},
     "claude-sonnet-4-5": {"input": 3, "output": 15, "cached_input": 0.3, "cache_write": 3.75}}

``input`` prices the prompt tokens that were neither read from nor written to the prompt
cache; ``cached_input`` the cache reads and ``cache_write`` the cache writes (each defaults to
``input``); ``output`` the generated tokens, reasoning included (providers bill it as output).
A model missing from the table has no estimate (``None``), never a guessed one.

Pure module: no I/O.
"""

from __future__ import annotations

import json
import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tooltrail.core.messages import Usage

__all__ = ["ModelPrice", "estimate_cost", "parse_prices"]

_PER = 1_000_000


class ModelPrice(BaseModel):
    """One model's prices, in USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, allow_inf_nan=False)
    """Prompt tokens not read from or written to the prompt cache."""
    output: float = Field(ge=0, allow_inf_nan=False)
    """Generated tokens (thinking and reasoning included)."""
    cached_input: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Prompt tokens read from the cache (default: ``input``)."""
    cache_write: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Prompt tokens written to the cache (default: ``input``)."""


def parse_prices(text: str | None) -> dict[str, ModelPrice]:
    """Read a price table (the JSON of ``TOOLTRAIL_MODEL_PRICES``; empty: no prices).

    Raises:
        ValueError: the text is not a JSON object of model names to prices; the message
            names the model whose entry is wrong and the keys an entry takes.
    """
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"TOOLTRAIL_MODEL_PRICES is not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(
            'TOOLTRAIL_MODEL_PRICES must be a JSON object: {"MODEL": {"input": USD_PER_MTOK, '
            '"output": USD_PER_MTOK}, ...}'
        )
    prices = {}
    for model, entry in data.items():
        try:
            prices[model] = ModelPrice.model_validate(entry)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or 'entry'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ValueError(
                f"TOOLTRAIL_MODEL_PRICES entry {model!r} is not "
                '{"input": N, "output": N[, "cached_input": N][, "cache_write": N]} '
                f"(USD per million tokens): {problems}"
            ) from None
    return prices


def estimate_cost(prices: dict[str, ModelPrice], model: str | None, usage: Usage) -> float | None:
    """Return the estimated cost of one call in USD, or ``None`` when its model has no price."""
    price = prices.get(model) if model is not None else None
    if price is None:
        return None
    cached = usage.cache_read_tokens
    written = usage.cache_write_tokens
    plain = max(0, usage.input_tokens - cached - written)
    cost = (
        plain * price.input
        + cached * (price.input if price.cached_input is None else price.cached_input)
        + written * (price.input if price.cache_write is None else price.cache_write)
        + usage.output_tokens * price.output
    ) / _PER
    return cost if math.isfinite(cost) else None
