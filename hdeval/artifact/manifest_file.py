"""A format-4 artifact manifest as a pydantic model: the header, the run record and the method's
state (checked by the method's own ``State`` model), nothing else. Formats 1 to 3 are read by
hand in :mod:`hdeval.artifact.directory`, as they always were."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from hdeval.core.errors import ArtifactError

# bounds and names shared with the directory reader, which imports them from here (not the
# other way round: the two would import each other)
MAX_FILES = 1_000  # entries in the manifest's ``files``


def _safe_name(name: Any) -> str:
    """A relative POSIX path inside the artifact: no absolute path, no '..', no backslash."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        raise ArtifactError(f"bad artifact file name {name!r}")
    if any(part in ("", ".", "..") for part in name.split("/")):  # also a leading "/"
        raise ArtifactError(f"artifact file {name!r} is outside the artifact directory")
    return name


def _inside(name: str) -> str:
    try:
        return _safe_name(name)
    except ArtifactError as exc:  # a ValueError, so that pydantic names the field
        raise ValueError(str(exc)) from None


FileName = Annotated[str, StringConstraints(min_length=1, max_length=1024), AfterValidator(_inside)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class Split(BaseModel):
    """The ids a run trained and tested on."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    train: list[str]
    test: list[str]


class RunConfig(BaseModel):
    """The run's settings as recorded. Its keys are the run settings of the hdeval that wrote it
    (they change between versions, and each method checks the options it reads), so other keys
    are kept; ``options``, the method's own, must be an object."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    options: dict[str, Any] = {}


class RunRecord(BaseModel):
    """The run record: the seed, the split and the settings (any of them may be absent)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    seed: Annotated[int, Field(gt=-(2**63), lt=2**63)] | None = None
    split: Split | None = None
    config: RunConfig = RunConfig()


class Manifest(BaseModel):
    """``manifest.json`` of format 4. The contents of ``task``, ``llm`` and ``method_args`` are
    checked by the task reader, the loader and the method, each with its own message."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    format: Literal["hdeval-artifact"]  # directory.FORMAT
    format_version: Literal[4]
    hdeval_version: str
    created: str
    method: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    method_args: dict[str, Any]
    task: dict[str, Any]
    llm: dict[str, Any]
    versions: dict[str, str]
    state: dict[str, Any]  # the method's: validated by its State model when it loads
    run: RunRecord
    files: Annotated[dict[FileName, Sha256], Field(max_length=MAX_FILES)]


# today's wording for an object that is not one, where users (and tests) have read it
_NOT_AN_OBJECT: dict[tuple[str | int, ...], str] = {
    ("state",): "'state' must be a JSON object",
    ("run",): "'run' must be a JSON object",
    ("run", "config"): "'config' is not an object",
    ("run", "config", "options"): "'config.options' is not an object",
    ("files",): f"'files' must map at most {MAX_FILES} file names to checksums",
}


def error_line(exc: ValidationError, version: Any) -> str:
    """The first error of ``exc`` in one line naming the field (repr, cut: a key from the file
    cannot add a line or run on)."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    field = ".".join(str(x) for x in loc)[:80]
    if err["type"] == "extra_forbidden":
        if len(loc) == 1:
            return (
                f"unknown field {field!r} (a format-{version} manifest holds the header, 'run' and "
                "'state' only)"
            )
        return f"unknown field {field!r}"
    if err["type"] in ("dict_type", "model_type", "too_long") and loc in _NOT_AN_OBJECT:
        return _NOT_AN_OBJECT[loc]
    if err["type"] == "string_pattern_mismatch" and loc[:1] == ("files",):
        return f"the checksum of {str(loc[1])[:80]!r} is not a sha256 hex digest (in 'files')"
    msg = err["msg"].removeprefix("Value error, ")
    if loc[:1] == ("files",) and loc[-1] == "[key]":  # a file name outside the artifact
        return f"{msg} (in 'files')"
    return f"{field!r}: {msg}"
