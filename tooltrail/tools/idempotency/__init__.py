"""Idempotency of tool calls: policies, keys, the leased claim store and the resolution loop.

Spec: ``guardrails-idempotency-access.md`` §5. A call of an idempotent tool is identified by a
key derived from the tool name, the scope (the principal, or nothing) and the effective
snapshot of its arguments. Before the body runs, the caller *claims* the key in a shared
store. The claim is a lease, renewed while the body runs, so a crashed owner is taken over
once its lease lapses, while a live one (even a zombie attempt Temporal already retried) is
waited for. When the body finishes, its outcome is committed under the key for
``ttl_seconds``. Every later call with the same key gets that outcome and the body does not
run again.

This package is the logic and the store's contract, with an in-memory store for one process;
it imports no SQL. The shared store is ``tooltrail.db.idempotency.SqlIdempotencyStore``, in the
database layer: it compares times only with the database's clock, so workers with skewed
clocks still agree on who holds a lease and when an outcome expires, and it holds no
transaction while a body runs.

The names live in private modules: ``_errors`` (the exceptions below), ``_policy``
(``Idempotency`` and its declaration), ``_keys`` (``derive_key``), ``_store`` (the store's
contract), ``_memory`` (``InMemoryIdempotencyStore``) and ``_resolution`` (``run_idempotent``).

Exceptions raised here::

    TooltrailError
    ├── IdempotencyKeyError           an explicit key function failed (not retryable)
    ├── CachedToolError               a cached failure was hit (not retryable)
    └── IdempotencyStoreUnavailable   the store could not be reached (retryable)
"""

from tooltrail.tools.idempotency._errors import (
    CachedToolError,
    IdempotencyKeyError,
    IdempotencyStoreUnavailable,
)
from tooltrail.tools.idempotency._keys import KEY_VERSION, canonical_snapshot_text, derive_key
from tooltrail.tools.idempotency._memory import InMemoryIdempotencyStore
from tooltrail.tools.idempotency._policy import (
    Idempotency,
    IdempotencyDeclaration,
    resolve_idempotency,
)
from tooltrail.tools.idempotency._resolution import (
    IdempotentResult,
    OutcomeHook,
    busy_text,
    owner_of,
    run_idempotent,
)
from tooltrail.tools.idempotency._store import (
    Acquired,
    Busy,
    Claim,
    Completed,
    CompleteHook,
    IdempotencyRecord,
    IdempotencyStore,
    StoredOutcome,
    outcome_state,
    put_owner,
)

__all__ = [
    "KEY_VERSION",
    "Acquired",
    "Busy",
    "CachedToolError",
    "Claim",
    "CompleteHook",
    "Completed",
    "Idempotency",
    "IdempotencyDeclaration",
    "IdempotencyKeyError",
    "IdempotencyRecord",
    "IdempotencyStore",
    "IdempotencyStoreUnavailable",
    "IdempotentResult",
    "InMemoryIdempotencyStore",
    "OutcomeHook",
    "StoredOutcome",
    "busy_text",
    "canonical_snapshot_text",
    "derive_key",
    "outcome_state",
    "owner_of",
    "put_owner",
    "resolve_idempotency",
    "run_idempotent",
]
