"""The engine's waiting line: one request computes at a time, a bounded number wait their turn,
and the rest are told when to come back (HTTP 429 with Retry-After) instead of piling up."""
from __future__ import annotations

import asyncio
import math
import time


class QueueFull(Exception):
    """No room in the line; `retry_after` is a fair guess of the seconds until there is."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy; try again in {retry_after} s")
        self.retry_after = retry_after


class Ticket:
    """A turn at the engine, held from enter() until release() (which may be called twice)."""

    def __init__(self, gate: "EngineGate"):
        self._gate = gate
        self._held = True
        self.started = time.monotonic()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._gate._leave(time.monotonic() - self.started)


class EngineGate:
    """One turn at a time, `max_waiting` in line. Used from one event loop (the server's)."""

    def __init__(self, max_waiting: int):
        if max_waiting < 0:
            raise ValueError("max_waiting must be 0 or more")
        self.max_waiting = max_waiting
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._recent_seconds = 5.0          # how long a turn took lately (a moving average)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def enter(self) -> Ticket:
        """Waits for the turn; QueueFull at once when the line is full. A caller cancelled while
        it waits leaves the line."""
        if self._lock.locked() and self._waiting >= self.max_waiting:
            raise QueueFull(max(1, math.ceil(self._recent_seconds * (self._waiting + 1))))
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        return Ticket(self)

    def _leave(self, seconds: float) -> None:
        self._recent_seconds = 0.8 * self._recent_seconds + 0.2 * seconds
        self._lock.release()
