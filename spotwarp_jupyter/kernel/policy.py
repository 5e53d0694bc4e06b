"""The automatic-snapshot policy of one kernel and how it is printed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..engine.units import format_duration, format_size


@dataclass
class Policy:
    """When to snapshot automatically, and what to leave out."""

    enabled: bool = True
    every_s: float = 300.0
    after_cell: bool = True
    include: frozenset[str] | None = None
    exclude: frozenset[str] = field(default_factory=frozenset)
    max_var_size: int | None = 8 * 10**9
    keep: int | None = None
    resume: bool = True  # a new host re-runs a cell interrupted inside a resumable loop (docs/resume.md)

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> "Policy":
        """The policy of resolved settings (`engine.settings.POLICY`: every, after_cell, autosnapshot, ...)."""
        return cls(enabled=values["autosnapshot"], every_s=values["every"], after_cell=values["after_cell"],
                   max_var_size=values["max_var_size"], keep=values["keep"] or None)

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any], current: "Policy") -> "Policy":
        """The policy a snapshot recorded (`as_dict`); a field it lacks or garbles keeps `current`'s value."""
        def pick(name: str, kinds: tuple[type, ...], fallback: Any) -> Any:
            value = saved.get(name, fallback)
            return value if value is None or isinstance(value, kinds) else fallback

        include = pick("include", (list,), None if current.include is None else sorted(current.include))
        every = pick("every_s", (int, float), current.every_s)
        return cls(enabled=bool(pick("enabled", (bool,), current.enabled)),
                   every_s=float(every) if every and every > 0 else current.every_s,
                   after_cell=bool(pick("after_cell", (bool,), current.after_cell)),
                   include=None if include is None else frozenset(map(str, include)),
                   exclude=frozenset(map(str, pick("exclude", (list,), sorted(current.exclude)) or ())),
                   max_var_size=pick("max_var_size", (int,), current.max_var_size),
                   keep=pick("keep", (int,), current.keep),
                   resume=bool(pick("resume", (bool,), current.resume)))

    def describe(self) -> str:
        parts = [
            "on" if self.enabled else "off",
            f"every {format_duration(self.every_s)}",
            "after cells" if self.after_cell else "not after cells",
        ]
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
        }
