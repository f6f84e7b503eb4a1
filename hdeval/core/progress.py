"""Progress reporting hook. The library reports; only the CLI draws on a terminal."""

from __future__ import annotations


class Progress:
    """No-op base. Subclass to show progress; only :meth:`advance` may be called from other threads."""

    def stage(self, label: str, total: int) -> None:
        """A stage of ``total`` units of work starts (e.g. scoring layer 2: 640 calls)."""

    def expect(self, units: int) -> None:
        """At most ``units`` units of work are left, the stages about to start included."""

    def advance(self, n: int = 1, cached: bool = False) -> None:
        """``n`` units finished; ``cached`` when they were answered from the cache."""

    def end_stage(self) -> None:
        """The current stage is done."""

    def message(self, text: str) -> None:
        """A line of information (per-layer summary, warnings)."""
