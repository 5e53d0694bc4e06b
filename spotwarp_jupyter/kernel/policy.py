"""The automatic-snapshot policy of one kernel, the cadence of snapshots at a loop's steps, and how both print.

With no `--every`, a `resumable` loop is protected from its first seconds (FIRST_STEP_S), then snapshots at
its steps as often as their measured cost allows: the training time they take stays under MAX_OVERHEAD and
the training a loss redoes under `max_redo_s`. When a loop's snapshots cost too much for both, the overhead
bound wins and the status says how much a loss would redo. `--every` fixes the period instead.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..engine.settings import AUTO
from ..engine.units import format_duration, format_size

DEFAULT_EVERY_S = 300.0  # between cells and for idle kernels, when no `--every` is set
DEFAULT_MAX_REDO_S = 60.0  # the most training a loss redoes, by default
FIRST_STEP_S = 1.0  # a loop's first step snapshot, from its first step: committed within 10 s with the write of a full one
MAX_OVERHEAD = 0.02  # the share of training time snapshots at steps may take


@dataclass
class Policy:
    """When to snapshot automatically, and what to leave out. `every_s` None: the adaptive cadence at steps."""

    enabled: bool = True
    every_s: float | None = None
    after_cell: bool = True
    include: frozenset[str] | None = None
    exclude: frozenset[str] = field(default_factory=frozenset)
    max_var_size: int | None = 8 * 10**9
    keep: int | None = None
    resume: bool = True  # a new host re-runs a cell interrupted inside a resumable loop (docs/resume.md)
    max_redo_s: float = DEFAULT_MAX_REDO_S

    @property
    def cell_every_s(self) -> float:
        """The interval between snapshots at cell ends and of idle kernels."""
        return self.every_s or DEFAULT_EVERY_S

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> "Policy":
        """The policy of resolved settings (`engine.settings.POLICY`: every, max_redo, after_cell, autosnapshot, ...)."""
        every_s = None if values["every"] == AUTO else values["every"]
        return cls(enabled=values["autosnapshot"], every_s=every_s, after_cell=values["after_cell"],
                   max_var_size=values["max_var_size"], keep=values["keep"] or None,
                   max_redo_s=values.get("max_redo") or DEFAULT_MAX_REDO_S)

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any], current: "Policy") -> "Policy":
        """The policy a snapshot recorded (`as_dict`); a field it lacks or garbles keeps `current`'s value."""
        def pick(name: str, kinds: tuple[type, ...], fallback: Any) -> Any:
            value = saved.get(name, fallback)
            return value if value is None or isinstance(value, kinds) else fallback

        include = pick("include", (list,), None if current.include is None else sorted(current.include))
        every = saved.get("every_s", current.every_s)
        if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float)) or every <= 0):
            every = current.every_s
        if "max_redo_s" not in saved and every == DEFAULT_EVERY_S:
            every = None  # a record without `max_redo_s` names the fixed default of its format, not a choice
        redo = pick("max_redo_s", (int, float), current.max_redo_s)
        return cls(enabled=bool(pick("enabled", (bool,), current.enabled)),
                   every_s=None if every is None else float(every),
                   after_cell=bool(pick("after_cell", (bool,), current.after_cell)),
                   include=None if include is None else frozenset(map(str, include)),
                   exclude=frozenset(map(str, pick("exclude", (list,), sorted(current.exclude)) or ())),
                   max_var_size=pick("max_var_size", (int,), current.max_var_size),
                   keep=pick("keep", (int,), current.keep),
                   resume=bool(pick("resume", (bool,), current.resume)),
                   max_redo_s=float(redo) if redo and redo > 0 else current.max_redo_s)

    def describe(self) -> str:
        """One line: `%spotwarp policy`, the status and the widget print it."""
        parts = ["on" if self.enabled else "off", f"every {format_duration(self.cell_every_s)}"]
        if self.every_s is None:
            parts.append(f"at a loop's steps after {format_duration(FIRST_STEP_S)}, then adapted (at most "
                         f"{format_duration(self.max_redo_s)} redone, {MAX_OVERHEAD:.0%} overhead)")
        parts.append("after cells" if self.after_cell else "not after cells")
        if self.max_var_size:
            parts.append(f"max-var-size {format_size(self.max_var_size)}")
        if self.include is not None:
            parts.append("include " + ",".join(sorted(self.include)))
        if self.exclude:
            parts.append("exclude " + ",".join(sorted(self.exclude)))
        if self.keep:
            parts.append(f"keep {self.keep}")
        if not self.resume:
            parts.append("no resume")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        return {
            "enabled": self.enabled,
            "every_s": self.every_s,
            "after_cell": self.after_cell,
            "include": sorted(self.include) if self.include is not None else None,
            "exclude": sorted(self.exclude),
            "max_var_size": self.max_var_size,
            "keep": self.keep,
            "resume": self.resume,
            "max_redo_s": self.max_redo_s,
        }


# -- the cadence at a loop's steps -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cadence:
    """How often a loop snapshots at its steps, and what that means for a loss and for training time.

    `redo_window_s`: the most training a loss redoes (an interval, the write of the next snapshot and a step).
    `bounded_by`: `every` (a fixed period), `redo` (the redo bound sets it: snapshots are cheap), `overhead`
    (their cost sets it), `unmeasured` (no snapshot at a step measured yet).
    """

    interval_s: float
    redo_window_s: float
    overhead_pct: float | None
    bounded_by: str
    max_redo_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"interval_s": round(self.interval_s, 2), "redo_window_s": round(self.redo_window_s, 2),
                "overhead_pct": None if self.overhead_pct is None else round(self.overhead_pct, 2),
                "bounded_by": self.bounded_by, "max_redo_s": self.max_redo_s, "text": self.text()}

    def text(self) -> str:
        """One line a user can act on: how often, how much a loss redoes, what it costs."""
        if self.bounded_by == "unmeasured":
            return (f"a loop's first step snapshot {format_duration(FIRST_STEP_S)} after it starts, then adapted to "
                    f"their cost: at most {format_duration(self.max_redo_s)} of training redone, "
                    f"at most {MAX_OVERHEAD:.0%} overhead")
        line = (f"snapshots every {format_duration(self.interval_s)} at steps: at most "
                f"{format_duration(self.redo_window_s)} of training redone")
        if self.overhead_pct is not None:
            line += f", ~{self.overhead_pct:.1f}% overhead"
        if self.bounded_by == "overhead" and self.redo_window_s > self.max_redo_s:
            line += (f" (over the {format_duration(self.max_redo_s)} redo bound: each snapshot costs the loop too much "
                     f"to take them more often within {MAX_OVERHEAD:.0%} overhead)")
        return line


def cadence(cost_s: float | None, write_s: float, step_s: float, max_redo_s: float = DEFAULT_MAX_REDO_S,
            every_s: float | None = None, max_overhead: float = MAX_OVERHEAD, first_only: bool = False) -> Cadence:
    """The interval between snapshots at a loop's steps, from what the last ones cost.

    `cost_s`: training time one snapshot takes from the loop (None: none measured); `write_s`: from its start to
    its commit (a loss meanwhile redoes from the one before); `step_s`: one step. The interval aims at half the
    redo bound, so that a write slower than the last ones still keeps it; never shorter than the overhead
    bound allows, which wins when the two cannot both hold. `first_only`: the cost is the session's first
    snapshot at a step, a full write, which carries one-time costs (the full write, the staging memory's first
    touch) and says little about the next: the interval aims at half the redo bound until a later one is measured.
    """
    lag = max(0.0, write_s) + max(0.0, step_s)
    if every_s is not None:
        overhead = None if cost_s is None else 100 * cost_s / every_s
        return Cadence(every_s, every_s + lag, overhead, "every", max_redo_s)
    cap = max(max_redo_s - lag, 0.0)
    if cost_s is None:
        interval = max(cap / 2, FIRST_STEP_S)
        return Cadence(interval, interval + lag, None, "unmeasured", max_redo_s)
    floor = cost_s / max_overhead
    target = cap / 2
    interval, bound = (target, "redo") if floor <= target else (floor, "overhead")
    if first_only:
        interval, bound = target, "redo"
    interval = max(interval, FIRST_STEP_S)
    return Cadence(interval, interval + lag, 100 * cost_s / interval, bound, max_redo_s)


class LoopMeter:
    """What snapshots taken at a loop's steps cost it, measured from the steps themselves.

    A snapshot's cost is the time the steps it overlaps took (from the one it started at to the first after its
    writer is done, its pause included) beyond the same number of steps at the pace of the steps just before it
    and of those the loop returns to after it (a machine whose load drifts moves both), plus what the steps
    right after it took beyond the slower of those paces: what a snapshot leaves behind (memory handed back,
    caches to refill) slows them too, and a pace taken from them would hide it. Fed at each step with one clock
    read: cheap enough for every step.
    """

    KEEP = 3  # snapshots whose costs set the cadence
    AFTER = 16  # steps after a snapshot: the first half are charged to it, the second give the pace it returns to

    def __init__(self) -> None:
        self.last_step: float | None = None
        self.paces: deque[float] = deque(maxlen=32)  # seconds per step with no snapshot in flight
        self.costs: deque[float] = deque(maxlen=self.KEEP)
        self.first_cost: float | None = None  # the session's first snapshot at a step, a full write: one-time costs
        self.writes: deque[float] = deque(maxlen=self.KEEP)
        # [started, pace before, seconds of the steps it overlaps, steps, pause, 1 if a full write]
        self._flight: list[float] | None = None
        self._written: float | None = None
        self._measured: list[float] | None = None  # a flight over, waiting for the pace after it
        self._after: list[float] = []
        self.measured = 0  # snapshots measured so far: a cadence computed since stays valid until the next
        self.log: deque[dict[str, float]] = deque(maxlen=64)  # each measured flight: what it was charged, and why

    def new_cell(self) -> None:
        """The time between two cells is no step: a snapshot measured until the loop ended counts as it stands."""
        self.last_step = None
        self._settle()
        flight, self._flight = self._flight, None
        if flight is not None and self._written is not None:
            self.writes.append(max(0.0, self._written - flight[0]))
            self._measured = flight
            self._settle()
        self._written = None

    def step(self, now: float, writing: bool) -> None:
        """A step's safe point at `now` (perf_counter); `writing`: a snapshot writer is running."""
        last, self.last_step = self.last_step, now
        if last is None:
            return
        dt = now - last
        flight = self._flight
        if flight is None:
            if not writing:  # a writer started outside a step (a cell's end) slows steps too: not the pace
                self.paces.append(dt)
                if self._measured is not None:
                    self._after.append(dt)
                    if len(self._after) >= self.AFTER:
                        self._settle()
            return
        flight[2] += dt
        flight[3] += 1
        if not writing:
            if self._written is not None:
                self.writes.append(max(0.0, self._written - flight[0]))
            self._flight, self._written, self._measured, self._after = None, None, flight, []

    def _settle(self) -> None:
        """The cost of the flight measured last, against the pace before it and the steps seen after it (a loop
        that ended sooner: those it took)."""
        flight, self._measured = self._measured, None
        if flight is None:
            return
        after, self._after = self._after, []
        settling, later = after[:len(after) // 2], after[len(after) // 2:]
        pace_after = statistics.median(later) if later else None
        pace = flight[1] if pace_after is None else (flight[1] + pace_after) / 2
        # steps slower than both paces: a load moving between them leaves the steps between them too
        aftermath = 0.0 if pace_after is None else max(0.0, sum(settling) - len(settling) * max(flight[1], pace_after))
        cost = max(flight[4], flight[2] - flight[3] * pace + aftermath)
        self.log.append({"started": flight[0], "seconds": flight[2], "steps": flight[3], "pause": flight[4],
                         "pace_before": flight[1], "pace_after": pace_after, "aftermath": aftermath, "cost": cost})
        if flight[5] and self.first_cost is None and not self.costs:
            self.first_cost = cost
        else:
            self.costs.append(cost)
        self.measured += 1

    @property
    def measuring(self) -> bool:
        """Whether a snapshot at a step is in flight or waits for the steps after it that measure its cost."""
        return self._flight is not None or self._measured is not None

    def started(self, now: float, pause_s: float, full: bool = True) -> None:
        """A snapshot started at the step whose safe point was the last one; `full`: it writes every variable (no
        earlier snapshot of this kernel to reuse), whose one-time costs keep the session's first one apart."""
        self._settle()
        self._flight = [now, self.pace(), 0.0, 0, max(0.0, pause_s), float(full)]
        self._written = None

    def written(self, now: float) -> None:
        """The snapshot started at a step is committed (or failed)."""
        if self._flight is not None:
            self._written = now

    def pace(self) -> float:
        """Seconds per step (median of the recent steps no snapshot overlapped; 0 before any)."""
        return statistics.median(self.paces) if self.paces else 0.0

    def cadence(self, max_redo_s: float, every_s: float | None = None) -> Cadence:
        """The cadence the last snapshots' costs allow (the mean cost: overhead is an average; the longest write);
        the first snapshot's cost only until a later one is measured."""
        if self.costs:
            return cadence(statistics.fmean(self.costs), max(self.writes, default=0.0), self.pace(), max_redo_s, every_s)
        return cadence(self.first_cost, max(self.writes, default=0.0), self.pace(), max_redo_s, every_s,
                       first_only=self.first_cost is not None)
