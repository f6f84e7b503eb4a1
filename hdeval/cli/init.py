"""``hdeval init``: a task file written from a data file's columns, so a first custom task takes a
minute: the fields, the aspects (numeric columns, with their observed range) and ``data_file``
with the column mapping, read by ``train`` and ``apply`` as the file is."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import click

from hdeval.cli.boundary import guarded
from hdeval.core.errors import ConfigError, DataError

#: a column named like a field (or a usual synonym) is that field unless an option says otherwise
_FIELD_NAMES = {
    "source": ("source", "question", "prompt", "input", "instruction", "query"),
    "context": ("context", "fact", "document"),
    "output": ("output", "answer", "response", "completion", "summary"),
    "reference": ("reference", "gold", "target"),
}
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


@click.command()
@click.argument("data", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The task file to write (.toml).",
)
@click.option("--name", default=None, help="Task name. Default: the data file's name.")
@click.option("--description", default=None, help="What is generated, in one sentence (the prompts show it).")
@click.option(
    "--source-col", default=None, help="Column with the source/input text. Default: 'source', 'question', ..."
)
@click.option(
    "--context-col", default=None, help="Column with extra context. Default: 'context', if present."
)
@click.option(
    "--output-col",
    default=None,
    help="Column with the text under evaluation. Default: 'output', 'answer', ...",
)
@click.option(
    "--reference-col", default=None, help="Column with a reference text. Default: 'reference', if present."
)
@click.option(
    "--id-col",
    default=None,
    help="Column with unique ids. Default: 'id' if present, else ids from the texts.",
)
@click.option(
    "--doc-col",
    default=None,
    help="Column grouping outputs of one input. Default: 'doc_id', else the source.",
)
@click.option(
    "--system-col", default=None, help="Column naming the system that wrote the output. Default: 'system'."
)
@click.option(
    "--score-col",
    "score_cols",
    multiple=True,
    metavar="[ASPECT=]COLUMN",
    help="A column of human scores (an aspect); repeatable. Default: every other numeric column.",
)
@click.option("--force", is_flag=True, help="Replace an existing -o file.")
@guarded
def init(
    data: Path,
    out: Path,
    name: str | None,
    description: str | None,
    source_col: str | None,
    context_col: str | None,
    output_col: str | None,
    reference_col: str | None,
    id_col: str | None,
    doc_col: str | None,
    system_col: str | None,
    score_cols: tuple[str, ...],
    force: bool,
) -> None:
    """Write a task file for DATA (CSV, TSV, JSON list, JSONL or Parquet) from its columns.

    The text columns become the fields the prompts show, the numeric ones the aspects (with
    the range observed), and the task's data_file points at DATA with the column mapping, so
    `hdeval train --task TASK.toml` reads DATA as it is. On a terminal it asks for what it
    cannot tell (the description, each aspect's definition); in a script the options say it
    and the rest gets a default that names the column (edit the definitions for real work:
    the LLM reads them).

    \b
    Example:
      hdeval init examples/ratings.csv -o artifacts/task.toml --source-col question --output-col answer
      hdeval train --task artifacts/task.toml --llm fake
    """
    from hdeval.data.samples import data_rows, row_unit
    from hdeval.run.output import check_output

    check_output(out, [data], replace=force)
    if out.suffix != ".toml":
        raise ConfigError(f"-o {out}: a task file's name ends in .toml")
    if not data.is_file():
        raise DataError(f"data file not found: {data}")
    ask = _on_a_terminal()
    numbered = list(data_rows(data))
    rows = [values for _, values in numbered]
    if not rows:
        raise DataError(f"{data}: no rows")
    for row in rows:  # a file already in hdeval's sample format: its 'scores' object's keys are the columns
        nested = row.get("scores")
        if isinstance(nested, dict):
            del row["scores"]
            row.update({k: v for k, v in nested.items() if isinstance(k, str) and k not in row})
    columns = list(dict.fromkeys(k for r in rows for k in r))
    numeric = {c: r for c in columns if (r := _numeric_range(rows, c)) is not None}
    # a column no row fills (hdeval's own files carry "context": null) is no field to show
    filled = {c for c in columns if any(r.get(c) not in (None, "") for r in rows)}
    hint = f"columns: {', '.join(columns)}"

    def pick(option: str, given: str | None, field: str, required: bool) -> str | None:
        if given is not None:
            if given not in columns:
                raise ConfigError(f"{data}: no column {given!r} (given by {option}); {hint}")
            return given
        found = next(
            (
                c
                for n in _FIELD_NAMES.get(field, (field,))
                for c in columns
                if c.lower() == n and c not in numeric and c in filled
            ),
            None,
        )
        if ask and field in ("source", "output"):
            found = (
                click.prompt(
                    f"column with the {'text under evaluation' if field == 'output' else 'input'} "
                    f"({', '.join(c for c in columns if c not in numeric)})",
                    default=found or "",
                    show_default=bool(found),
                    err=True,
                ).strip()
                or None
            )
            if found is not None and found not in columns:
                raise ConfigError(f"{data}: no column {found!r}; {hint}")
        if found is None and required:
            raise ConfigError(
                f"{data}: which column holds the text under evaluation? pass --output-col COLUMN; {hint}"
            )
        return found

    fields = {
        key: pick(f"--{key}-col", given, key, key == "output")
        for key, given in (
            ("source", source_col),
            ("context", context_col),
            ("output", output_col),
            ("reference", reference_col),
        )
    }
    others = {
        key: pick(f"--{option}-col", given, key, False)
        for key, option, given in (
            ("id", "id", id_col),
            ("doc_id", "doc", doc_col),
            ("system", "system", system_col),
        )
    }
    used = {c for c in (*fields.values(), *others.values()) if c}
    for c in columns:  # a score column with one 'n/a' would otherwise vanish from the task unsaid
        bad = None if c in numeric or c in used else _mostly_numbers(numbered, c)
        named = any(item.partition("=")[2 if "=" in item else 0].strip() == c for item in score_cols)
        if bad and (named or not score_cols):
            (line, value), n, unit = bad[0], len(bad), row_unit(data)
            raise DataError(
                f"{data}: {unit} {line}: column {c!r} holds {str(value)[:40]!r}, not a number "
                f"({n} {unit}{'s' if n > 1 else ''}); fix {'it' if n == 1 else 'them'}"
                + ("" if named else ", or leave the column out by naming the others with --score-col")
            )
    aspects = _aspects(score_cols, columns, numeric, used, data, hint)
    # train reads only rows with every aspect's score
    unscored = {
        col: [n for n, r in numbered if r.get(col) is None or str(r[col]).strip() == ""]
        for col, _, _ in aspects.values()
    }
    for col, where in unscored.items():
        if where:
            unit = row_unit(data)
            whole = [c for c, w in unscored.items() if not w]  # the columns every row has
            raise DataError(
                f"{data}: {unit} {where[0]}: no score in column {col!r} ({len(where)} {unit}(s) lack "
                "one): fill them in"
                + (
                    f", or keep only the columns every {unit} has: {' '.join(f'--score-col {c}' for c in whole)}"
                    if whole
                    else ""
                )
            )
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", data.stem).strip("._-") or "task"
    name = name or (click.prompt("task name", default=stem, err=True) if ask else stem)
    shown = {key: col.replace("_", " ").strip().capitalize() for key, col in fields.items() if col}
    description = description or (
        click.prompt("what is generated, in one sentence", err=True)
        if ask
        else f"A system wrote the {shown['output'].lower()}; people rated it ({data.name})."
    )
    definitions = {}
    for key, (col, low, high) in aspects.items():
        default = (
            f"How good the {shown['output'].lower()} is on '{col}', as the human raters scored it "
            f"({low:g} worst, {high:g} best)."
        )
        definitions[key] = (
            click.prompt(f"what raters judged in '{col}'", default=default, err=True) if ask else default
        )
    text = _task_toml(name, description, shown, fields, others, aspects, definitions, _data_file(data, out))
    _write(out, text)
    from hdeval.data.samples import read_task_samples
    from hdeval.data.tasks import load_task

    try:  # the file must train as written: read DATA through it now, not at the first train
        task = load_task(out)
        n = len(read_task_samples(data, task))
    except Exception:
        out.unlink(missing_ok=True)
        raise
    click.echo(
        f"wrote {out}: task {task.name}, fields {', '.join(f'{k} ({c})' for k, c in fields.items() if c)}; "
        f"aspects {', '.join(f'{k} [{lo:g}, {hi:g}]' for k, (_, lo, hi) in aspects.items())}; "
        f"{n} rated rows in {data}"
    )
    if not ask:
        click.echo(
            "note: each aspect's definition names its column: say in the task file what raters judged, "
            "the LLM reads it",
            err=True,
        )
    click.echo(f"next: hdeval train --task {out} --llm fake  (then a real LLM: see `hdeval train --help`)")


def _on_a_terminal() -> bool:
    return sys.stdin.isatty()


def _number(v: Any) -> float | None:
    """A cell as a finite number (text that reads as one counts), else None."""
    if isinstance(v, bool):
        return None
    try:
        x = float(v.strip()) if isinstance(v, str) else float(v) if isinstance(v, (int, float)) else math.nan
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _numeric_range(rows: list[dict], column: str) -> tuple[float, float] | None:
    """(min, max) of a column whose every value is a finite number (text that reads as one counts)."""
    values = []
    for r in rows:
        v = r.get(column)
        if v is None:
            continue
        x = _number(v)
        if x is None:
            return None
        values.append(x)
    return (min(values), max(values)) if values else None


def _mostly_numbers(numbered: list[tuple[int, dict]], column: str) -> list[tuple[int, Any]] | None:
    """The (line, value) cells that are not numbers in a column most of whose filled cells are (a
    score column with a typo or an 'n/a'); None for a column of text. Blank cells are neither."""
    bad, good = [], 0
    for line, r in numbered:
        v = r.get(column)
        if v is None or (isinstance(v, str) and not v.strip()):
            continue
        if _number(v) is None:
            bad.append((line, v))
        else:
            good += 1
    return bad if bad and good > len(bad) else None


def _aspects(
    score_cols: tuple[str, ...], columns: list[str], numeric: dict, used: set, data: Path, hint: str
) -> dict[str, tuple[str, float, float]]:
    """aspect key -> (column, low, high): the columns named, else every numeric column left."""
    chosen: list[tuple[str, str]] = []
    for item in score_cols:
        aspect, sep, column = item.partition("=")
        column, aspect = (column if sep else aspect).strip(), aspect.strip()
        if column not in columns:
            raise ConfigError(f"{data}: no column {column!r} (given by --score-col {item}); {hint}")
        chosen.append((aspect, column))
    if not score_cols:
        chosen = [(c, c) for c in columns if c in numeric and c not in used]
    out: dict[str, tuple[str, float, float]] = {}
    for aspect, column in chosen:
        if column not in numeric:
            raise ConfigError(f"{data}: column {column!r} (--score-col) holds values that are not numbers")
        low, high = numeric[column]
        if low == high:
            raise ConfigError(
                f"{data}: every score in column {column!r} is {low:g}: nothing to learn from; "
                "leave it out with --score-col for the other columns"
            )
        key = (
            aspect if _KEY.fullmatch(aspect) else re.sub(r"[^A-Za-z0-9_]+", "_", aspect).strip("_") or "score"
        )
        if key in out:
            raise ConfigError(f"--score-col: aspect {key!r} named twice")
        out[key] = (column, low, high)
    if not out:
        raise ConfigError(
            f"{data}: no numeric column left for human scores; name one with --score-col COLUMN; {hint}"
        )
    return out


def _data_file(data: Path, out: Path) -> str:
    """``data_file``: DATA's path from the task file's folder, with '/' (the task format's)."""
    rel = os.path.relpath(os.path.abspath(data), os.path.dirname(os.path.abspath(out)))
    return rel.replace(os.sep, "/")


def _s(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text, ensure_ascii=False)


def _task_toml(
    name: str,
    description: str,
    shown: dict,
    fields: dict,
    others: dict,
    aspects: dict,
    definitions: dict,
    data_file: str,
) -> str:
    lines = [
        "# Written by `hdeval init`: check the description and each aspect's definition (the LLM reads",
        "# them), and each range (the scores observed; widen it to the scale raters used).",
        f"name = {_s(name)}",
        f"description = {_s(description)}",
        f"output_label = {_s(shown['output'])}",
        f"data_file = {_s(data_file)}  # from this file's folder",
        "",
    ]
    for key, col in fields.items():
        if col:
            lines += ["[[fields]]", f"key = {_s(key)}", f"label = {_s(shown[key])}", ""]
    for key, (col, low, high) in aspects.items():
        lines += [
            "[[aspects]]",
            f"key = {_s(key)}",
            f"name = {_s(col.replace('_', ' ').strip().capitalize())}",
            f"definition = {_s(definitions[key])}",
            f"range = [{_exact(low)}, {_exact(high)}]",
            "",
        ]
    lines += [
        "# which column of data_file feeds each field, as `hdeval data import`'s --*-col options",
        "[columns]",
    ]
    lines += [f"{key} = {_s(col)}" for key, col in (*fields.items(), *others.items()) if col and col != key]
    scores = [(key, col) for key, (col, _, _) in aspects.items() if col != key]
    if scores:
        lines += ["", "[columns.scores]", *(f"{_s(key)} = {_s(col)}" for key, col in scores)]
    return "\n".join(lines) + "\n"


def _exact(x: float) -> str:
    """``x`` as TOML writes it back to the same float: 5 as 5, but 1.6666666666666667 whole (':g'
    rounds it to 1.66667, which leaves the observed minimum outside the range)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def _write(out: Path, text: str) -> None:
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
