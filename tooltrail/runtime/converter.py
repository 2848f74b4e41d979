"""tooltrail's data converter: Temporal's pydantic converter, with the compact envelopes.

Every client, worker and replayer of a deployment uses it (the codec, when configured, wraps
it: ``tooltrail.runtime.codec.data_converter``). It encodes the envelopes of
``tooltrail.core.envelopes`` without what decoding puts back, and everything else exactly as
Temporal's pydantic converter does; payloads of that converter decode here unchanged.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_json
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
)

from tooltrail.core.envelopes import ENVELOPES, needs_unpacking, pack, unpack

__all__ = ["WireJSONPayloadConverter", "WirePayloadConverter", "wire_data_converter"]

_ENVELOPE_TYPES = frozenset(ENVELOPES)


@functools.cache
def _adapter(type_hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(type_hint)


class WireJSONPayloadConverter(PydanticJSONPlainPayloadConverter):
    """JSON via pydantic, with the envelopes packed on the way out and unpacked on the way in."""

    def to_payload(self, value: Any) -> Payload | None:
        """Encode ``value``; an envelope leaves out what decoding puts back."""
        if isinstance(value, BaseModel) and type(value) in _ENVELOPE_TYPES:
            return Payload(metadata={"encoding": self.encoding.encode()}, data=to_json(pack(value)))
        return super().to_payload(value)

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        """Decode a payload to ``type_hint`` (defaults come back with validation)."""
        if needs_unpacking(type_hint):
            data = unpack(json.loads(payload.data), type_hint)
            return _adapter(type_hint).validate_python(data)
        return super().from_payload(payload, type_hint)


class WirePayloadConverter(CompositePayloadConverter):
    """Temporal's default payload converters, with ``WireJSONPayloadConverter`` for JSON."""

    def __init__(self) -> None:
        """Replace the plain JSON converter of Temporal's defaults."""
        json_converter = WireJSONPayloadConverter()
        super().__init__(
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


wire_data_converter = DataConverter(payload_converter_class=WirePayloadConverter)
"""The data converter of every tooltrail client, worker and replayer (without a codec)."""
