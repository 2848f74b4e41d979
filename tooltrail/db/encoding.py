r"""Lossless storage of text the database would refuse (column types of the audit schema).

Tool arguments, tool outputs, call ids and tool names are chosen by a model or read from
the world (a binary file), and PostgreSQL refuses some of what SQLite takes: a NUL byte in
a ``text`` or ``varchar`` value or as ``\u0000`` in ``jsonb``, and a string longer than a
``varchar(n)``. A refused write would cost a turn its whole trail, so every such value is
encoded on the way in and decoded on the way out, on both databases alike:

* JSON values (``SafeJson``): a string holding NUL becomes ``{"$tt:nul": [parts]}`` (the
  string split at each NUL); an object with a key holding NUL becomes
  ``{"$tt:items": [[key, value], ...]}``; an object whose only key starts with ``$tt:``
  (a look-alike of those markers) is wrapped as ``{"$tt:esc": object}``. Everything else is
  stored as it is, so operators' JSON queries keep working.
* Free text (``SafeText``): a string holding NUL, or starting with ``$tt:json:``, is stored
  as ``$tt:json:`` followed by its JSON text (which spells NUL as ``\u0000``).
* Bounded names (``SafeString``): a value over the column's length or holding NUL is stored
  as ``$tt:h:<digest>:<readable prefix>``, which fits and names it uniquely. That form is
  not reversible by itself: where the original matters (the audit trail's call ids and tool
  names) the writer keeps the original in the row's JSON and the reader puts it back
  (``tooltrail.db.store``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import JSON, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

__all__ = [
    "SafeJson",
    "SafeString",
    "SafeText",
    "decode_json",
    "decode_text",
    "encode_json",
    "encode_text",
    "fit_name",
    "fits",
]

_NUL = "\x00"
_MARK = "$tt:"
_NUL_KEY = "$tt:nul"
_ITEMS_KEY = "$tt:items"
_ESCAPE_KEY = "$tt:esc"
_TEXT_MARK = "$tt:json:"
_NAME_MARK = "$tt:h:"


def encode_json(value: Any) -> Any:
    """Return ``value`` with every NUL-bearing string and key in storable form."""
    if isinstance(value, str):
        return {_NUL_KEY: value.split(_NUL)} if _NUL in value else value
    if isinstance(value, dict):
        if any(_NUL in key for key in value):
            return {_ITEMS_KEY: [[encode_json(k), encode_json(v)] for k, v in value.items()]}
        encoded = {key: encode_json(item) for key, item in value.items()}
        if len(value) == 1 and next(iter(value)).startswith(_MARK):
            return {_ESCAPE_KEY: encoded}
        return encoded
    if isinstance(value, list | tuple):
        return [encode_json(item) for item in value]
    return value


def decode_json(value: Any) -> Any:
    """Return the value ``encode_json`` was given."""
    if isinstance(value, dict):
        if len(value) == 1:
            key, inner = next(iter(value.items()))
            if key == _NUL_KEY and isinstance(inner, list):
                return _NUL.join(inner)
            if key == _ITEMS_KEY and isinstance(inner, list):
                return {decode_json(k): decode_json(v) for k, v in inner}
            if key == _ESCAPE_KEY and isinstance(inner, dict):
                return {k: decode_json(v) for k, v in inner.items()}
        return {key: decode_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode_json(item) for item in value]
    return value


def encode_text(value: str) -> str:
    """Return free text in a form every database stores (NUL spelled out, reversibly)."""
    if _NUL in value or value.startswith(_TEXT_MARK):
        return _TEXT_MARK + json.dumps(value)
    return value


def decode_text(value: str) -> str:
    """Return the text ``encode_text`` was given."""
    if value.startswith(_TEXT_MARK):
        decoded = json.loads(value[len(_TEXT_MARK) :])
        if isinstance(decoded, str):
            return decoded
    return value


def fits(value: str, length: int) -> bool:
    """Whether ``value`` can be stored as it is in a ``varchar(length)`` column."""
    return len(value) <= length and _NUL not in value and not value.startswith(_NAME_MARK)


def fit_name(value: str, length: int) -> str:
    """Return ``value``, or a unique stand-in of at most ``length`` characters.

    The stand-in replaces a value that does not fit: too long, holding NUL, or looking like
    a stand-in itself.
    """
    if fits(value, length):
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    head = f"{_NAME_MARK}{digest}:"
    return head + value.replace(_NUL, "\N{SYMBOL FOR NULL}")[: max(0, length - len(head))]


class SafeJson(TypeDecorator[Any]):
    """JSON (JSONB on PostgreSQL) that stores NUL-bearing strings and keys losslessly."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        """JSONB on PostgreSQL (indexable, compact); plain JSON text elsewhere."""
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())

    def process_bind_param(self, value: Any, _dialect: Dialect) -> Any:
        """Encode on the way in."""
        return None if value is None else encode_json(value)

    def process_result_value(self, value: Any, _dialect: Dialect) -> Any:
        """Decode on the way out."""
        return None if value is None else decode_json(value)

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        """Compare JSON paths (``payload["is_error"]``) as the plain JSON type does."""
        return self.impl_instance.coerce_compared_value(op, value)


class SafeText(TypeDecorator[str]):
    """Unbounded text that stores NUL bytes losslessly."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, _dialect: Dialect) -> str | None:
        """Encode on the way in."""
        return None if value is None else encode_text(value)

    def process_result_value(self, value: str | None, _dialect: Dialect) -> str | None:
        """Decode on the way out."""
        return None if value is None else decode_text(value)


class SafeString(TypeDecorator[str]):
    """A bounded name column that never refuses a value: see ``fit_name``."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, _dialect: Dialect) -> str | None:
        """Store a value that does not fit as its stand-in."""
        if value is None:
            return None
        length = getattr(self.impl_instance, "length", None)
        return value if length is None else fit_name(value, length)
