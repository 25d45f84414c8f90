"""The limiter interface and its no-op implementation."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Admission:
    """Result of `admit`: ids admitted (with their opaque slot) and ids denied."""

    admitted: dict = field(default_factory=dict)  # id -> slot (None when no gate slot)
    denied: list = field(default_factory=list)


class Limiter:
    """Base class; see the package docstring for when each method is called."""

    def gate_names(self) -> list[str]:
        """Configured gate names: their keys bypass K=1 and are admitted by `admit`."""
        return []

    def needs_admission(self, job) -> bool:
        return False

    def admit(self, jobs, queue: str) -> Admission:
        return Admission(admitted={j.id: None for j in jobs})

    def credit(self, slots) -> None:
        return None

    def renew(self, slots) -> None:
        return None

    def reconcile(self) -> dict:
        return {"buckets": 0, "gates": 0}


class NullLimiter(Limiter):
    """Admits everything; used until configured limits are built."""
