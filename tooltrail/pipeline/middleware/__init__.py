"""The middleware pipeline: layers that wrap the execution of one attempt (spec §12).

A layer is any async callable ``layer(call, next) -> MiddlewareResult``. It may inspect or
replace the call before passing it on (a renamed or re-argued call is a
``dataclasses.replace`` of the one it got), answer without calling ``next`` at all (a
refusal), or rewrite the result on the way back. ``compose`` chains layers around a core,
first registered = outermost, so the observable order is the registration order.

These layers run worker-side, inside the tool activity, around ``ToolCallMiddleware`` (the
registry core: lookup, validation, exception isolation, timing). They keep no state between
calls: session-scoped state such as a memoize cache must not live in worker memory (spec §0
rule 5), which is why ``MemoizingMiddleware`` belongs to workflow code and is not here.

Ids: a layer's results carry ``tool_call_id`` only as a courtesy. The engine overwrites it
with the model-issued id after the pipeline returns (spec §13); ``run_pipeline`` does exactly
that, so no layer can break the call/result pairing.

The names live in private modules: ``_core`` (calls, results, ``compose`` and
``run_pipeline``), ``_tool_call`` (``ToolCallMiddleware``), and one module per built-in layer:
``_timeout``, ``_permission``, ``_output_limit``, ``_verify``, ``_shield``, ``_redacting`` and
``_unknown_tool``.
"""

from tooltrail.pipeline.middleware._core import (
    Middleware,
    MiddlewareCall,
    MiddlewareResult,
    Next,
    compose,
    run_pipeline,
)
from tooltrail.pipeline.middleware._output_limit import TRUNCATION_MARKER, OutputLimitMiddleware
from tooltrail.pipeline.middleware._permission import (
    PermissionAllow,
    PermissionAsk,
    PermissionDecision,
    PermissionDeny,
    PermissionMiddleware,
    PermissionModify,
    PermissionPolicy,
    PermissionResolver,
)
from tooltrail.pipeline.middleware._redacting import RedactingMiddleware
from tooltrail.pipeline.middleware._shield import SHIELD_TEXT, SafetyShieldMiddleware, ShieldCheck
from tooltrail.pipeline.middleware._timeout import TimeoutMiddleware
from tooltrail.pipeline.middleware._tool_call import ToolCallMiddleware
from tooltrail.pipeline.middleware._unknown_tool import UnknownToolMiddleware
from tooltrail.pipeline.middleware._verify import VerifyCheck, VerifyMiddleware

__all__ = [
    "SHIELD_TEXT",
    "TRUNCATION_MARKER",
    "Middleware",
    "MiddlewareCall",
    "MiddlewareResult",
    "Next",
    "OutputLimitMiddleware",
    "PermissionAllow",
    "PermissionAsk",
    "PermissionDecision",
    "PermissionDeny",
    "PermissionMiddleware",
    "PermissionModify",
    "PermissionPolicy",
    "PermissionResolver",
    "RedactingMiddleware",
    "SafetyShieldMiddleware",
    "ShieldCheck",
    "TimeoutMiddleware",
    "ToolCallMiddleware",
    "UnknownToolMiddleware",
    "VerifyCheck",
    "VerifyMiddleware",
    "compose",
    "run_pipeline",
]
