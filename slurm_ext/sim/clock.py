"""The simulator's clock: the simulated time and the queue of what is due
when (a job's start by Slurm's scheduler, the end of its restart stall,
its completion, the end of its checkpoint).

An event is ``(when, seq, kind, job id, epoch)``: events due at one instant
come out in the order they were pushed (`seq`), and the job's `epoch` at the
push lets its owner (slurm_ext.sim.world) tell an event that went stale (the
job started or ended since) from a live one. The clock never goes back.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

#: (when, seq, kind, job id, epoch)
Event = tuple[float, int, str, str, int]


class EventClock:
    """The simulated time (`now`) and the queue of events."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)
        self._events: list[Event] = []
        self._seq = 0

    def push(self, when: float, kind: str, job_id: str = "", epoch: int = 0) -> None:
        """Queue an event of `kind` for `job_id` (in its `epoch`) at `when`."""
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, job_id, epoch))

    def next_time(self, live: Callable[[Event], bool]) -> float:
        """When the next event that is `live` is due (the stale ones before it
        are dropped); inf when none is."""
        while self._events and not live(self._events[0]):
            heapq.heappop(self._events)
        return self._events[0][0] if self._events else math.inf

    def pop(self) -> Event:
        """Take the next event (after `next_time` said when) and move the clock to it."""
        event = heapq.heappop(self._events)
        self.move_to(event[0])
        return event

    def move_to(self, t: float) -> None:
        """The clock at `t`, unless it is past it already."""
        self.now = max(self.now, t)
