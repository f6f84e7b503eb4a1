"""A jury: several judge LLMs scoring the same criteria, each one more LLM identity in the cache
key. Who the judges are (``--llm`` given more than once, or a ``--jury`` TOML file), their clients
(one cache directory, one ``--max-calls``), their columns ``<judge>:<criterion>``, and how they
relate (agreement, correlated errors, the effective number of independent judges)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hdeval.core.errors import ConfigError

SEP = ":"  # judge and criterion in a column's key; a judge's name holds no colon
MAX_JURY_BYTES = 1 << 20
MAX_JUDGES = 16
_NAME = r"^[A-Za-z0-9_-]{1,40}$"
_ENV = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


def judge_models():
    # pydantic is imported when a jury is read: runs without one never load it
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    class JudgeSpec(BaseModel):
        """One ``[[judge]]`` table: who answers, where, and what it costs (never its key)."""

        model_config = ConfigDict(extra="forbid", frozen=True)
        name: str = Field(pattern=_NAME)
        llm: str = Field(min_length=1, max_length=500)
        base_url: str | None = Field(default=None, max_length=2000)
        # the NAME of the environment variable holding the judge's API key
        api_key_env: str | None = Field(default=None, pattern=_ENV)
        price_in: float | None = Field(default=None, ge=0, allow_inf_nan=False)  # per 1M prompt tokens
        price_out: float | None = Field(default=None, ge=0, allow_inf_nan=False)  # per 1M completion tokens

    class JuryFile(BaseModel):
        model_config = ConfigDict(extra="forbid")
        judge: list[JudgeSpec] = Field(min_length=1, max_length=MAX_JUDGES)

        @field_validator("judge")
        @classmethod
        def _distinct(cls, judges: list[JudgeSpec]) -> list[JudgeSpec]:
            names = [j.name for j in judges]
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise ValueError(f"two judges are named {dup!r}")
            return judges

    return JudgeSpec, JuryFile


@dataclass(frozen=True)
class Judge:
    """A judge as a run and an artifact know it."""

    name: str
    llm: str
    base_url: str | None = None
    api_key_env: str | None = None
    price_in: float | None = None
    price_out: float | None = None

    def record(self) -> dict[str, Any]:
        """What the artifact keeps: the server without credentials or query, the key's variable
        name only."""
        from hdeval.core.urls import public_url

        return {
            "name": self.name,
            "llm": self.llm,
            "base_url": public_url(self.base_url),
            "api_key_env": self.api_key_env,
            "price_in": self.price_in,
            "price_out": self.price_out,
        }


def read_jury(path: str | Path, base_url: str | None = None) -> tuple[Judge, ...]:
    """The judges of a jury TOML file; a one-line ConfigError naming the file and the field.
    ``base_url``: the run's server, a judge's without its own (its model names are the server's)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    from pydantic import ValidationError

    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_JURY_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the jury file ({exc.strerror or exc})") from None
    if len(raw) > MAX_JURY_BYTES:
        raise ConfigError(f"{path}: a jury file is at most {MAX_JURY_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))  # an editor may put a byte-order mark in front
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not a TOML file ({exc})") from None
    _, JuryFile = judge_models()
    try:
        jury = JuryFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(".[", "[")
        raise ConfigError(f"{path}: {where or 'judge'}: {err['msg']}") from None
    from hdeval.llm.config import base_url_problem, llm_problem

    for j in jury.judge:  # as --llm and --base-url are checked: "FAKE" or "" would go to OpenAI
        problem = base_url_problem(j.base_url, "base_url") or llm_problem(
            j.llm, j.base_url or base_url, "llm"
        )
        if problem:
            raise ConfigError(f"{path}: judge {j.name!r}: {problem}")
    return tuple(Judge(**j.model_dump()) for j in jury.judge)


def judges_of_llms(llms: Sequence[str], base_url: str | None) -> tuple[Judge, ...]:
    """``--llm A --llm B``: one judge per model behind the run's one server, named after it."""
    out: list[Judge] = []
    for model in llms:
        base = re.sub(r"[^A-Za-z0-9_-]+", "-", model).strip("-")[:36] or "judge"
        name, n = base, 2
        while any(j.name == name for j in out):
            name, n = f"{base}-{n}", n + 1
        out.append(Judge(name, model, base_url))
    if len({j.llm for j in out}) != len(out):
        raise ConfigError("--llm names the same model twice: a jury's judges must differ")
    return tuple(out)


def column(judge: str, criterion: str) -> str:
    return f"{judge}{SEP}{criterion}"


def split_column(key: str) -> tuple[str, str]:
    judge, _, criterion = key.partition(SEP)
    return judge, criterion


@dataclass
class Jury:
    """The judges of a run and their opened clients (one cache directory, one call budget)."""

    judges: tuple[Judge, ...]
    clients: dict[str, Any]  # name -> CachedBackend
    owned: list[Any] = field(default_factory=list)  # what close() closes
    max_calls: int | None = None

    @property
    def names(self) -> list[str]:
        return [j.name for j in self.judges]

    @property
    def first(self) -> Any:
        return self.clients[self.judges[0].name]

    def close(self) -> None:
        for c in reversed(self.owned):
            c.close()
        self.owned.clear()

    def share_budget(self, active: Any, others: Sequence[Any] = ()) -> None:
        """One --max-calls for every judge (and the decomposing LLM): ``active`` may make what
        the others have not spent."""
        if self.max_calls is None:
            return
        spent = sum(
            c.stats.calls
            for c in {id(c): c for c in [*self.clients.values(), *others]}.values()
            if c is not active
        )
        active.max_calls = max(0, self.max_calls - spent)

    def score(
        self,
        score: Callable,
        template: Any,
        task: Any,
        tree: Any,
        criteria: Sequence[Any],
        samples: Sequence[Any],
        concurrency: int | None,
        progress: Any,
        others: Sequence[Any] = (),
        only: Mapping[str, Sequence[Any]] | None = None,
    ) -> Any:
        """Every criterion scored by every judge (``only``: judge -> its criteria), as one matrix
        of ``<judge>:<criterion>`` columns, judge by judge."""
        from hdeval.core.types import Failure, ScoreMatrix

        ids = [s.id for s in samples]
        out = ScoreMatrix.empty(ids)
        for name in self.names:
            crits = list(criteria) if only is None else list(only.get(name, ()))
            if not crits:
                continue
            llm = self.clients[name]
            self.share_budget(llm, others)
            m = score(llm, template, task, tree, crits, samples, concurrency, progress)
            out = out.hstack(
                ScoreMatrix(
                    m.sample_ids,
                    [column(name, k) for k in m.criterion_keys],
                    m.values,
                    [Failure(f.sample_id, column(name, f.criterion_key), f.reason) for f in m.failures],
                )
            )
        return out

    def usage(self) -> dict[str, dict[str, Any]]:
        """Per judge: calls, cache hits, tokens and, with prices, the cost of the new calls."""
        out = {}
        for j in self.judges:
            s = self.clients[j.name].stats
            cost = None
            if j.price_in is not None or j.price_out is not None:
                cost = round(
                    (s.prompt_tokens * (j.price_in or 0) + s.completion_tokens * (j.price_out or 0)) / 1e6, 6
                )
            out[j.name] = {
                "calls": s.calls,
                "hits": s.hits,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "cost": cost,
            }
        return out


def open_jury(
    judges: Sequence[Judge], base: Any, offline: bool = False, backends: Mapping[str, Any] | None = None
) -> Jury:
    """Each judge's cached client on the run's cache directory and settings (``base``, an
    LLMConfig), its own model, server and key; ``backends`` injects judges by name (tests, the
    Python API). A judge that cannot be opened stops the run before any call, naming it."""
    from hdeval.core.errors import HdevalError
    from hdeval.llm.client import open_llm

    jury = Jury(tuple(judges), {}, max_calls=base.max_calls)
    try:
        for j in judges:
            cfg = base.replace(model=j.llm, base_url=j.base_url if j.base_url is not None else base.base_url)
            given = (backends or {}).get(j.name)
            try:
                if given is None and j.api_key_env and not _builtin(j.llm):
                    given = _keyed_backend(j, cfg, offline)
                    jury.owned.append(given)
                client = open_llm(cfg, given, offline)
            except HdevalError as exc:
                raise ConfigError(f"judge {j.name!r} ({j.llm}): {exc}") from None
            if client is not given:
                jury.owned.append(client)
            jury.clients[j.name] = client
    except BaseException:
        jury.close()
        raise
    return jury


def _builtin(model: str) -> bool:
    return model in ("fake", "local") or model.startswith(("fake:", "llamacpp:"))


def _keyed_backend(j: Judge, cfg: Any, offline: bool) -> Any:
    """An OpenAI-compatible backend with the key the judge's ``api_key_env`` names."""
    from hdeval.llm.backends.openai_compat import OpenAICompatBackend

    key = os.environ.get(j.api_key_env or "")
    if not key and not offline:
        raise ConfigError(
            f"judge {j.name!r}: the environment variable {j.api_key_env} (its api_key_env) is not set"
        )
    return OpenAICompatBackend(
        model=cfg.model,
        base_url=cfg.base_url,
        api_key=key or "dry-run-sends-nothing",
        timeout=cfg.timeout,
        max_retries=cfg.max_retries,
    )


# ---------------------------------------------------------------- how the judges relate
def judge_columns(keys: Sequence[str], judge: str) -> list[int]:
    return [i for i, k in enumerate(keys) if split_column(k)[0] == judge]


def mean_matrix(matrix: Any, names: Sequence[str]) -> Any:
    """Per criterion, the mean of the judges' scores (PoLL's average pooling), NaN ignored:
    columns keyed by criterion, in first-seen order."""
    import warnings

    from hdeval.core.types import ScoreMatrix

    crits = list(dict.fromkeys(split_column(k)[1] for k in matrix.criterion_keys))
    vals = np.full((len(matrix.sample_ids), len(crits)), np.nan)
    for j, c in enumerate(crits):
        cols = [i for i, k in enumerate(matrix.criterion_keys) if split_column(k)[1] == c]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            vals[:, j] = np.nanmean(matrix.values[:, cols], axis=1)
    return ScoreMatrix(list(matrix.sample_ids), crits, vals)


def judge_matrix(matrix: Any, judge: str) -> Any:
    """One judge's columns, keyed by criterion."""
    from hdeval.core.types import ScoreMatrix

    idx = judge_columns(matrix.criterion_keys, judge)
    return ScoreMatrix(
        list(matrix.sample_ids),
        [split_column(matrix.criterion_keys[i])[1] for i in idx],
        matrix.values[:, idx],
    )


def agreement(matrix: Any, names: Sequence[str], rows: Any) -> dict[str, float | None]:
    """Krippendorff's alpha (interval) between the judges, per criterion, on ``rows``."""
    import krippendorff

    crits = list(dict.fromkeys(split_column(k)[1] for k in matrix.criterion_keys))
    out: dict[str, float | None] = {}
    for c in crits:
        data = np.array(
            [
                matrix.values[rows, matrix.criterion_keys.index(column(n, c))]
                for n in names
                if column(n, c) in matrix.criterion_keys
            ]
        )
        try:
            a = float(krippendorff.alpha(reliability_data=data, level_of_measurement="interval"))
        except (ValueError, ZeroDivisionError):  # fewer than two values to compare, or no variance
            a = float("nan")
        out[c] = round(a, 6) if np.isfinite(a) else None
    return out


def error_correlation(
    matrix: Any, names: Sequence[str], Y: Any, aspects: Sequence[str], rows: Any
) -> tuple[dict[str, dict[str, float | None]], float | None]:
    """The correlation of the judges' errors against the humans on ``rows`` (each judge's own
    score of each aspect and the human score, both standardised; the error their difference,
    pooled over aspects), and from it the effective number of independent judges,
    ``n / (1 + (n - 1) * r)`` with ``r`` the mean correlation between two judges' errors
    (clipped to [0, 1]): as many judges with independent errors would average out as much noise."""

    def z(v: Any) -> Any:
        sd = np.nanstd(v)
        return (v - np.nanmean(v)) / sd if sd > 0 else v * np.nan

    errs = {}
    for n in names:
        parts = []
        for j, a in enumerate(aspects):
            key = column(n, a)
            if key in matrix.criterion_keys:
                parts.append(z(matrix.values[rows, matrix.criterion_keys.index(key)]) - z(Y[rows, j]))
        errs[n] = np.concatenate(parts) if parts else np.array([])
    table: dict[str, dict[str, float | None]] = {}
    pairs = []
    for a in names:
        table[a] = {}
        for b in names:
            x, y = errs[a], errs[b]
            ok = np.isfinite(x) & np.isfinite(y) if len(x) == len(y) else np.array([], bool)
            r = float(np.corrcoef(x[ok], y[ok])[0, 1]) if ok.sum() > 2 else float("nan")
            table[a][b] = round(r, 6) if np.isfinite(r) else None
            if a < b and np.isfinite(r):
                pairs.append(r)
    # a judge none of whose errors is defined (one that gave every row one score) is no judge here
    k = sum(1 for n in names if np.isfinite(errs[n]).sum() > 2)
    if k < 2 or not pairs:
        return table, None
    r = min(1.0, max(0.0, float(np.mean(pairs))))
    return table, round(k / (1 + (k - 1) * r), 6)


def jury_scorer(jury: Jury, score: Callable, dec: Any) -> Callable:
    """A scorer with the loop's signature whose columns are every judge's (the loop's ``llm``,
    the first judge, is not read: each judge scores with its own client)."""

    def scorer(
        _llm: Any,
        template: Any,
        task: Any,
        tree: Any,
        criteria: Sequence[Any],
        samples: Sequence[Any],
        concurrency: int | None = None,
        progress: Any = None,
    ) -> Any:
        return jury.score(score, template, task, tree, criteria, samples, concurrency, progress, others=[dec])

    return scorer


def jury_state(jury: Jury, features: Sequence[str]) -> dict[str, Any]:
    """The manifest's record of the jury: every judge's settings (no key) and those the kept
    columns need, which ``apply`` calls."""
    kept = [n for n in jury.names if any(split_column(f)[0] == n for f in features)]
    return {"judges": [j.record() for j in jury.judges], "kept": kept}
