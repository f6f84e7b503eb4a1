"""Reading samples (JSONL, schema of the shared data README), finding data files, splits."""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from hdeval.errors import ConfigError, DataError
from hdeval.paths import user_data_dir
from hdeval.tasks import builtin_tasks
from hdeval.types import Sample, Task

MAX_REPORTED_ERRORS = 20


def data_candidates(task: Task) -> list[Path]:
    """Where a task's file is looked for, in order. A task from a user's .toml carries its
    ``data_file`` resolved against the task file's folder (:func:`hdeval.tasks.load_task`):
    that path comes first, then its file name in the folders below."""
    out = []
    own = Path(task.data_file)
    if own.is_absolute():
        out.append(own)
    name = own.name
    env = os.environ.get("HDEVAL_DATA_DIR")
    if env:
        out.append(Path(env) / name)
    out.append(user_data_dir() / name)
    return out


def find_data(task: Task, explicit: str | Path | None) -> Path:
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise DataError(f"data file not found: {path}")
        return path
    cands = data_candidates(task)
    for c in cands:
        if c.is_file():
            return c
    raise DataError(missing_data_message(task, cands))


def missing_data_message(task: Task, cands: Sequence[Path] | None = None, why: str = "") -> str:
    """One line: where a task's data was looked for, why it is not there, and every way forward."""
    cands = data_candidates(task) if cands is None else cands
    name = Path(task.data_file).name
    ways = f"pass --data FILE.jsonl, or set HDEVAL_DATA_DIR to a folder holding {name}"
    if task.name in builtin_tasks() and not Path(task.data_file).is_absolute():
        ways += (f", or run `hdeval data download {task.name}` (from a local copy: add "
                 "--source-url file:///path/to/reproduce/data/ or set HDEVAL_DATA_SOURCE_URL)")
    return (f"no data for task {task.name}: looked in {', '.join(str(c) for c in cands)}"
            + (f"; {why}" if why else "") + f"; {ways}")


def read_samples(
    path: str | Path, task: Task, require_scores: bool = True, aspects: Sequence[str] | None = None
) -> list[Sample]:
    """Read and validate every line before anything else happens.

    All broken lines (up to a cap) are reported together with their line numbers, so a
    user fixes a file in one pass; nothing is returned unless the whole file is valid.
    ``require_scores``: every sample must carry a human score for each aspect (training).
    """
    path = Path(path)
    aspect_keys = list(aspects) if aspects is not None else list(task.aspect_keys)
    errors: list[str] = []
    n_errors = 0
    samples: list[Sample] = []
    seen: dict[str, int] = {}
    unscored: dict[str, int] = {}  # aspect -> lines without its score (hint for --aspects)

    def bad(lineno: int, msg: str) -> None:
        nonlocal n_errors
        n_errors += 1
        if len(errors) < MAX_REPORTED_ERRORS:
            errors.append(f"line {lineno}: {msg}")

    try:
        fh = path.open("r", encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot open data file {path}: {exc}") from exc
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                bad(lineno, f"not valid JSON ({exc.msg} at column {exc.colno})")
                continue
            except UnicodeDecodeError:
                bad(lineno, "not UTF-8 text")
                continue
            if not isinstance(row, dict):
                bad(lineno, "not a JSON object")
                continue
            if require_scores and isinstance(row.get("scores"), dict):
                for key in aspect_keys:
                    if row["scores"].get(key) is None:
                        unscored[key] = unscored.get(key, 0) + 1
            problem, sample = _sample_from_row(row, lineno, task, aspect_keys, require_scores)
            if problem:
                bad(lineno, problem)
                continue
            assert sample is not None
            if sample.id in seen:
                bad(lineno, f"id {sample.id!r} already used on line {seen[sample.id]}")
                continue
            seen[sample.id] = lineno
            samples.append(sample)
    if n_errors:
        more = f" (and {n_errors - len(errors)} more)" if n_errors > len(errors) else ""
        hint = ""
        have = [a for a in aspect_keys if a not in unscored]
        if unscored and have:
            hint = (f"; lines lack scores for {', '.join(unscored)}: to train on the aspects every "
                    f"line has, pass --aspects {','.join(have)}")
        raise DataError(f"{path}: {n_errors} bad line(s): " + "; ".join(errors) + more + hint)
    if not samples:
        raise DataError(f"{path}: no samples")
    return samples


def _sample_from_row(
    row: dict, lineno: int, task: Task, aspect_keys: Sequence[str], require_scores: bool
) -> tuple[str | None, Sample | None]:
    sid = row.get("id")
    if sid is None or (isinstance(sid, str) and not sid.strip()):
        return "missing field 'id'", None
    fields: dict[str, str] = {}
    for f in task.fields:
        value = row.get(f.key)
        if not isinstance(value, str) or not value.strip():
            what = "missing" if value is None else "empty or not text"
            return f"field {f.key!r} ({f.label}) is {what} (task {task.name} needs it)", None
        fields[f.key] = value
    for extra in ("source", "context", "output", "reference"):
        if extra not in fields and isinstance(row.get(extra), str):
            fields[extra] = row[extra]
    raw_scores = row.get("scores")
    if raw_scores is None:
        raw_scores = {}
    if not isinstance(raw_scores, dict):
        return "field 'scores' must be an object mapping aspect to number", None
    scores: dict[str, float] = {}
    for key in aspect_keys:
        value = raw_scores.get(key)
        if value is None:
            if require_scores:
                return f"scores.{key} is missing (needed to train on aspect {key!r})", None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"scores.{key} is {value!r}, not a finite number", None
        aspect = task.aspect(key)
        if not aspect.low <= float(value) <= aspect.high:
            return (
                f"scores.{key} = {value} is outside the task's range "
                f"[{aspect.low:g}, {aspect.high:g}]"
            ), None
        scores[key] = float(value)
    doc = row.get("doc_id")
    return None, Sample(
        id=str(sid),
        doc_id=str(doc) if doc not in (None, "") else str(sid),
        fields=fields,
        scores=scores,
        system=row.get("system"),
        line=lineno,
    )


@dataclass(frozen=True)
class Split:
    train_ids: tuple[str, ...]
    test_ids: tuple[str, ...]

    def to_dict(self) -> dict[str, list[str]]:
        return {"train": list(self.train_ids), "test": list(self.test_ids)}


def _docs_in_seeded_order(samples: Sequence[Sample], seed: int) -> list[list[Sample]]:
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.doc_id, []).append(s)
    docs = sorted(groups)
    random.Random(seed).shuffle(docs)
    return [groups[d] for d in docs]


def limit_samples(samples: Sequence[Sample], limit: int | None, seed: int) -> list[Sample]:
    """``--limit N``: whole source documents in seeded order until N samples are taken."""
    if limit is None or limit >= len(samples):
        return list(samples)
    if limit < 1:
        raise ConfigError("--limit must be at least 1")
    out: list[Sample] = []
    for group in _docs_in_seeded_order(samples, seed):
        out.extend(group)
        if len(out) >= limit:
            break
    return out[:limit]


def split_samples(samples: Sequence[Sample], test_frac: float, train_frac: float, seed: int) -> Split:
    """Deterministic split grouped by ``doc_id``: no source document is on both sides.

    ``test_frac`` of the samples are held out; ``train_frac`` of all samples are used for
    training (the rest, if any, are left unused, as in the paper's 25% setting).
    """
    if not 0 < test_frac < 1:
        raise ConfigError(f"--test-frac must be between 0 and 1, got {test_frac}")
    if not 0 < train_frac < 1 or train_frac + test_frac > 1 + 1e-9:
        raise ConfigError(
            f"--train-frac must be in (0, 1) and at most 1 - test-frac, got {train_frac} (test {test_frac})"
        )
    docs = _docs_in_seeded_order(samples, seed)
    if len(docs) < 2:
        raise DataError("need samples from at least 2 source documents (doc_id) to split train/test")
    n = len(samples)
    test: list[Sample] = []
    train: list[Sample] = []
    i = 0
    while i < len(docs) - 1 and len(test) < test_frac * n:
        test.extend(docs[i])
        i += 1
    for group in docs[i:]:
        if len(train) >= train_frac * n - 1e-9:
            break
        train.extend(group)
    if not train:
        raise DataError("the split left no training samples; raise --limit or lower --test-frac")
    order = {s.id: k for k, s in enumerate(samples)}
    return Split(
        tuple(sorted((s.id for s in train), key=order.__getitem__)),
        tuple(sorted((s.id for s in test), key=order.__getitem__)),
    )


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Write atomically: a temp file renamed into place, so no half-written output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
