"""What ``apply`` adds to each row so a user knows how far to trust it: ``in_training``, and for
pointwise scores the prediction interval (``lower``/``upper``) with ``needs_human``."""

from __future__ import annotations

from typing import Any, Sequence

from hdeval.learn.intervals import DEFAULT_MAX_WIDTH, check_max_width, row_intervals

__all__ = ["DEFAULT_MAX_WIDTH", "RowTrust"]


class RowTrust:
    """Built once per apply (before any call: a bad option or stored calibration fails first),
    then ``annotate`` per chunk of rows; ``summary``/``warning`` at the end (apply's on-disk
    summaries keep the training rows' figures apart)."""

    def __init__(self, ev: Any, max_width: float = DEFAULT_MAX_WIDTH):
        self.max_width = check_max_width(max_width)
        self.train = ev.training_ids()
        self.cal = ev.interval_calibration()
        task = ev.task
        self.aspects = list(task.aspect_keys)
        self.ranges = [task.aspect(a).range for a in self.aspects] if self.cal is not None else []
        self.rows = self.in_training = self.needs_human = 0

    def annotate(self, rows: list[dict], samples: Sequence[Any], res: Any) -> None:
        pos = {sid: i for i, sid in enumerate(res.sample_ids)}
        pointwise = not hasattr(res, "agreement") and list(getattr(res, "aspects", [])) == self.aspects
        crit = getattr(res, "criteria", None)
        criteria = (crit.values, crit.criterion_keys) if crit is not None else None
        ints = (
            row_intervals(self.cal, res.predictions, self.aspects, self.ranges, self.max_width, criteria)
            if self.cal is not None and pointwise
            else None
        )
        for row, s in zip(rows, samples):
            seen = s.id in self.train
            row["in_training"] = seen
            self.rows += 1
            self.in_training += seen
            if ints is not None:
                iv = ints[pos[s.id]]
                row["lower"], row["upper"] = iv["lower"], iv["upper"]
                # a failed LLM score was imputed: the interval was calibrated on read scores
                row["needs_human"] = iv["needs_human"] or bool(row.get("failures"))
                self.needs_human += row["needs_human"]

    def warning(self) -> str | None:
        if not self.in_training:
            return None
        return (
            f"warning: {self.in_training} of {self.rows} rows were in the artifact's training split (matched "
            "by id; flagged in_training): figures on them are not held-out and are reported apart"
        )

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "in_training": self.in_training}
        if self.cal is not None:
            out.update(
                interval_level=self.cal.level, max_interval_width=self.max_width, needs_human=self.needs_human
            )
        return out
