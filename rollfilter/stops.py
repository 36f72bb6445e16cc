"""Why a run stops before its rows run out (`StopCause`), and what stops it (`StopControl`): a
signal, a closed stdout, a limit, a target, an agent that never answered. The engine stops on it,
the run puts its reason in the summary, and the command line maps its cause to an exit status.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import trio


class StopCause(enum.Enum):
    """Why a run was stopped before its rows ran out; the value is how the summary says it."""

    LIMIT_REACHED = "limit reached"  # the failure limit, or the budget
    INTERRUPTED = "interrupted"  # the signals the command line stops on
    TERMINATED = "terminated"
    HUNG_UP = "hung up"
    READER_GONE = "broken pipe"  # the reader of the results went away
    TARGET_REACHED = "target reached"  # as many groups written as Config.groups.target asks
    OUTPUT_FAILED = "output failed"  # an output could not be written
    UNHEALTHY = "unhealthy"  # too many rollouts unhealthy or masked: an outage behind the agents, likely
    AGENT_UNREACHABLE = "agent unreachable"  # an agent refused or dropped every connection since the start


class StopControl:
    """Stops a run from anywhere (a signal, a closed stdout, the failure limit).

    The first stop wins: its cause is the run's, and its reason is reported. A reason given as
    a function is asked when it is reported, so that counts it quotes include the rows that
    ended while the stop took effect.
    `scope` bounds the engine; `stoppable()` gives more scopes that a stop cancels too.
    """

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self._scopes = [self.scope]
        self.cause: StopCause | None = None
        self._reason: str | Callable[[], str] | None = None
        # Whether `cancel` was called: unlike its scopes' cancel_called, read in any thread, as a
        # run's snapshot is taken.
        self._cancelled = False

    @property
    def reason(self) -> str | None:
        return self._reason() if callable(self._reason) else self._reason

    def stop(self, cause: StopCause, reason: str | Callable[[], str] | None = None) -> None:
        # A target reached ends the engine only: what follows a finished run (the aggregate) runs,
        # and a stop after it (a signal during the aggregate) is the run's.
        if self.cause is None or (self.cause is StopCause.TARGET_REACHED and cause is not StopCause.TARGET_REACHED):
            self.cause = cause
            self._reason = reason
        if cause is StopCause.TARGET_REACHED:
            self.scope.cancel()
        else:
            self.cancel()

    @property
    def stopped_early(self) -> bool:
        """Whether the run was stopped before its end (a target reached is an end)."""
        if self.cause is StopCause.TARGET_REACHED:
            return False
        return self.cause is not None or self._cancelled

    @property
    def why_stopped(self) -> str | None:
        """Why the run stopped, as its summary and its callers say it: the reason the stop gave,
        else its cause's own words, else that the caller left early; None when it was not stopped."""
        reason = self.reason
        if reason:
            return reason
        if self.cause is not None:
            return self.cause.value
        return "stopped early by the caller" if self._cancelled else None

    def refuse(self, reason: str) -> None:
        """The run cannot go on: a service it needs before sending refused it, for `reason`, which
        the run's summary gives as why it stopped (it has no cause: the refusal's error has its
        own exit status)."""
        if self.cause is None:
            self._reason = reason
        self.cancel()

    def cancel(self) -> None:
        """Cancel the engine and what runs after it, without a stop status (the caller left)."""
        self._cancelled = True
        for scope in self._scopes:
            scope.cancel()

    def stoppable(self) -> trio.CancelScope:
        """A cancel scope for work after the engine (the aggregate calls) that a stop cancels."""
        scope = trio.CancelScope()
        if self.stopped_early:
            scope.cancel()
        self._scopes.append(scope)
        return scope
