"""``AuthorizeToolWorkflow``: ask a worker of the queue whether its access gate lets a call in.

The preflight (``Tooltrail.authorize_tool``) must answer with the gate the workers run, which
a client's own ``Host`` may not have (a ``connect()`` deployment wires identity on the
workers). One activity, on whichever worker takes it: the workers of a queue share one
configuration.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from tooltrail.core.wire import ACCESS_AUTHORIZE, AuthorizeInput, AuthorizeOutcome

__all__ = ["AuthorizeToolWorkflow"]


@workflow.defn(name="AuthorizeToolWorkflow")
class AuthorizeToolWorkflow:
    """Returns the access decision of whichever worker of the task queue takes the activity."""

    @workflow.run
    async def run(self, inp: AuthorizeInput) -> AuthorizeOutcome:
        """Run the preflight activity."""
        outcome: AuthorizeOutcome = await workflow.execute_activity(
            ACCESS_AUTHORIZE,
            inp,
            result_type=AuthorizeOutcome,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        return outcome
