"""A message, not a traceback: broken data files, task files and options each end
in one ``error: ...`` line naming what is wrong and where, with a non-zero exit, before any
LLM call; SIGTERM ends a run like Ctrl-C; odd characters in names do not break the report.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TOY_TASK, cache_entries, toy_rows, write_jsonl
from llm_server import FaultServer

from hdeval.cli import cli
from hdeval.core.errors import ConfigError, DataError
from hdeval.data.samples import read_samples
from hdeval.data.tasks import load_task

TRAIN = ["--llm", "fake", "--layers", "1", "-q"]  # --aggregator auto unless given: lr keeps it quick


def run(*args: str, cwd: Path | None = None):
    """The CLI in-process; an uncaught exception is returned as a failed result, not raised."""
    if cwd is not None:
        old = os.getcwd()
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args))
    finally:
        if cwd is not None:
            os.chdir(old)


def one_error_line(res, exit_code: int = 2) -> str:
    """The run failed with exactly one ``error:`` line on stderr (no traceback) and no LLM call
    (callers also check ``fake_calls``); returns that line."""
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == exit_code, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    p = tmp_path / "toy_task.toml"
    p.write_text(TOY_TASK, encoding="utf-8")
    return p


def jsonl_lines(rows) -> list[bytes]:
    return [json.dumps(r).encode() for r in rows]


def train_on(task: Path, data: Path, *extra: str, cwd: Path | None = None):
    agg = () if "--aggregator" in extra else ("--aggregator", "lr")
    return run("train", "--task", str(task), "--data", str(data), "--cache-dir", str(data.parent / "cache"),
               *TRAIN, *agg, *extra, cwd=cwd)


# --------------------------------------------------------------------------- data files
def test_invalid_utf8_names_line_and_byte_offset(tmp_path: Path, task_file: Path, fake_calls: list[int]) -> None:
    lines = jsonl_lines(toy_rows())
    lines[2] = lines[2].replace(b"plants use", b"plants \xff\xfeuse")
    data = tmp_path / "bad.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    col = lines[2].index(b"\xff")
    offset = sum(len(ln) + 1 for ln in lines[:2]) + col
    msg = one_error_line(train_on(task_file, data))
    assert "bad.jsonl" in msg and "line 3:" in msg and "not UTF-8" in msg
    assert "0xff" in msg and f"byte {col + 1} of the line" in msg and f"offset {offset}" in msg
    assert fake_calls == []


def test_lone_surrogate_is_rejected_with_its_line(tmp_path: Path, task_file: Path, fake_calls: list[int]) -> None:
    lines = [ln.decode() for ln in jsonl_lines(toy_rows())]
    lines[4] = lines[4].replace("plants use", "plants \\ud800 use")
    lines[6] = lines[6].replace("plants use", "emoji \\ud83d\\ude00 is fine")  # a valid pair
    data = tmp_path / "surrogate.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    msg = one_error_line(train_on(task_file, data))
    assert "1 bad line(s): line 5:" in msg and "surrogate" in msg and "'output'" in msg
    assert fake_calls == []
    # the valid surrogate pair alone loads, and its text round-trips as UTF-8
    good = [ln for i, ln in enumerate(lines) if i != 4]
    data.write_text("\n".join(good) + "\n", encoding="utf-8")
    samples = read_samples(data, load_task(str(task_file)))
    assert "emoji \U0001f600 is fine" in samples[5].fields["output"]


def test_deeply_nested_line_is_a_data_error(tmp_path: Path, task_file: Path, fake_calls: list[int]) -> None:
    lines = jsonl_lines(toy_rows())
    lines[1] = b"[" * 100_000 + b"]" * 100_000
    lines[3] = b'{"id": ' + b"1" * 5000 + b"}"  # more digits than Python turns into an int
    data = tmp_path / "nested.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    msg = one_error_line(train_on(task_file, data))
    assert "2 bad line(s): line 2:" in msg and "nested too deeply" in msg and "line 4:" in msg
    assert fake_calls == []


def test_utf8_bom_is_accepted_in_data_and_task_files(tmp_path: Path, fake_calls: list[int]) -> None:
    task = tmp_path / "bom_task.toml"
    task.write_bytes(b"\xef\xbb\xbf" + TOY_TASK.encode())
    data = tmp_path / "bom.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + b"\n".join(jsonl_lines(toy_rows())) + b"\n")
    assert load_task(str(task)).name == "toy_qa"
    samples = read_samples(data, load_task(str(task)))
    assert len(samples) == 36 and samples[0].id == "toy-00-0"
    res = train_on(task, data, "-o", str(tmp_path / "art"))
    assert res.exit_code == 0, res.output
    # a BOM anywhere but at the start is still an error, with its line
    data.write_bytes(b"\n".join(jsonl_lines(toy_rows())) + b"\n\xef\xbb\xbf" + jsonl_lines(toy_rows(1))[0])
    with pytest.raises(DataError, match="line 37"):
        read_samples(data, load_task(str(task)))


# --------------------------------------------------------------------------- too few samples
@pytest.mark.parametrize("n_docs,extra", [(2, ()), (3, ()), (12, ("--limit", "3")), (12, ("--train-frac", "0.02"))])
def test_too_few_training_samples_fail_before_any_call(
    n_docs: int, extra: tuple[str, ...], tmp_path: Path, task_file: Path, fake_calls: list[int]
) -> None:
    data = write_jsonl(tmp_path / "few.jsonl", toy_rows(n_docs, per_doc=1))
    for agg in ("lr", "auto"):
        msg = one_error_line(train_on(task_file, data, "--aggregator", agg, "--layers", "2", *extra))
        assert "few.jsonl: " in msg and "training sample" in msg and "at least 2" in msg, msg
    assert fake_calls == []


def test_one_document_says_how_many_are_needed(tmp_path: Path, task_file: Path, fake_calls: list[int]) -> None:
    data = write_jsonl(tmp_path / "one.jsonl", toy_rows(1, per_doc=3))
    msg = one_error_line(train_on(task_file, data))
    assert "one.jsonl: " in msg and "at least 2 source documents" in msg and "found 1" in msg
    assert fake_calls == []


def test_smallest_trainable_file_trains(tmp_path: Path, task_file: Path) -> None:
    data = write_jsonl(tmp_path / "four.jsonl", toy_rows(4, per_doc=1))
    res = train_on(task_file, data, "--layers", "2", "--aggregator", "auto", "-o", str(tmp_path / "art"))
    assert res.exit_code == 0, res.output


# --------------------------------------------------------------------------- options
@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**70)])
def test_out_of_range_seed(seed: str, tmp_path: Path, task_file: Path, fake_calls: list[int]) -> None:
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    msg = one_error_line(train_on(task_file, data, "--seed", seed, "--aggregator", "dt"))
    assert "--seed" in msg and "4294967295" in msg
    assert fake_calls == []


def test_largest_seed_works(tmp_path: Path, task_file: Path) -> None:
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    res = train_on(task_file, data, "--seed", str(2**32 - 1), "--aggregator", "dt", "-o", str(tmp_path / "a"))
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="module")
def toy_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(artifact, its data): a small evaluator trained once for this module."""
    d = tmp_path_factory.mktemp("toy-artifact")
    task = d / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(d / "toy.jsonl", toy_rows())
    res = train_on(task, data, "-o", str(d / "art"))
    assert res.exit_code == 0, res.output
    return d / "art", data


@pytest.mark.parametrize("opt,value", [("--concurrency", "0"), ("--concurrency", "-3"), ("--timeout", "0"),
                                       ("--max-retries", "-1"), ("--max-calls", "-1")])
def test_apply_rejects_bad_llm_options(opt: str, value: str, tmp_path: Path, toy_artifact: tuple[Path, Path],
                                       fake_calls: list[int]) -> None:
    art, data = toy_artifact
    out = tmp_path / "scored.jsonl"
    msg = one_error_line(run("apply", str(art), str(data), "-o", str(out), "--cache-dir", str(tmp_path / "c2"),
                             opt, value))
    assert opt in msg
    assert fake_calls == [] and not out.exists()


def test_train_rejects_negative_retries(tmp_path: Path, task_file: Path, fake_calls: list[int]) -> None:
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    for opt, value in (("--concurrency", "0"), ("--max-retries", "-1")):
        assert opt in one_error_line(train_on(task_file, data, opt, value))
    assert fake_calls == []


# --------------------------------------------------------------------------- task files
OUTPUT_FIELD = '[[fields]]\nkey = "output"\nlabel = "Answer"\n'


def _task_variant(old: str, new: str, count: int = 1) -> str:
    assert old in TOY_TASK
    return TOY_TASK.replace(old, new, count)


WRONG_TASKS = {
    "fields not tables": (_task_variant('[[fields]]\nkey = "source"\nlabel = "Question"\n\n' + OUTPUT_FIELD, "")
                          .replace('output_label = "Answer"', 'output_label = "Answer"\nfields = [1, 2]'),
                          "fields #1"),
    "fields a string": (_task_variant('[[fields]]\nkey = "source"\nlabel = "Question"\n\n' + OUTPUT_FIELD, "")
                        .replace('output_label = "Answer"', 'output_label = "Answer"\nfields = "output"'),
                        "'fields' must be a list of tables"),
    "aspects a table": (TOY_TASK.split("[[aspects]]")[0] + '[aspects]\nkey = "clarity"\n', "'aspects'"),
    "key not text": (_task_variant('key = "clarity"', "key = 7"), "aspects #1"),
    "field key not text": (_task_variant('key = "source"', "key = 1.5"), "fields #1"),
    "label not text": (_task_variant('label = "Question"', "label = [1]"), "fields #1"),
    "definition not text": (_task_variant('definition = "How clear the answer is."', "definition = 3"),
                            "'definition'"),
    "name not text": (_task_variant('name = "toy_qa"', "name = 5"), "'name'"),
    "description a table": (_task_variant('description = "Question answering: a system answered a question."',
                                          "description = {a = 1}"), "'description'"),
    "range of strings": (_task_variant("range = [1, 5]", 'range = ["1", "5"]'), "range"),
    "range of three": (_task_variant("range = [1, 5]", "range = [1, 3, 5]"), "range"),
    "range a number": (_task_variant("range = [1, 5]", "range = 5"), "range"),
    "range of booleans": (_task_variant("range = [1, 5]", "range = [false, true]"), "range"),
    "range with nan": (_task_variant("range = [1, 5]", "range = [1, nan]"), "range"),
    "range with inf": (_task_variant("range = [1, 5]", "range = [-inf, 5]"), "range"),
    "range reversed": (_task_variant("range = [1, 5]", "range = [5, 1]"), "range"),
    "range empty": (_task_variant("range = [1, 5]", "range = [3, 3]"), "range"),
    "field twice": (_task_variant('key = "source"\nlabel = "Question"', 'key = "output"\nlabel = "Question"'),
                    "'output' is listed twice"),
    "unknown aspect key": (_task_variant('name = "Clarity"', 'name = "Clarity"\nweight = 2'), "weight"),
    "name a path": (_task_variant('name = "toy_qa"', 'name = "../../x"'), "task name"),
    "name absolute": (_task_variant('name = "toy_qa"', 'name = "/tmp/x"'), "task name"),
    "name hidden": (_task_variant('name = "toy_qa"', 'name = ".x"'), "task name"),
    "name with backslash": (_task_variant('name = "toy_qa"', 'name = "a\\\\b"'), "task name"),
    "name too long": (_task_variant('name = "toy_qa"', f'name = "{"n" * 200}"'), "task name"),
    # a relative path from the task file's folder is allowed (`hdeval init` writes one); not an absolute one
    "data_file an absolute path": (_task_variant('output_label = "Answer"',
                                                 'output_label = "Answer"\ndata_file = "/tmp/x.jsonl"'), "data_file"),
    "data_file a backslash path": (_task_variant('output_label = "Answer"',
                                                 'output_label = "Answer"\ndata_file = "..\\\\x.jsonl"'),
                                   "data_file"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TASKS))
def test_wrong_task_file_names_file_and_field(case: str, tmp_path: Path, fake_calls: list[int]) -> None:
    text, needle = WRONG_TASKS[case]
    task = tmp_path / "wrong_task.toml"
    task.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_task(str(task))
    assert str(info.value).startswith(f"{task}: ") and needle in str(info.value), str(info.value)
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    out = tmp_path / "artifacts"
    msg = one_error_line(train_on(task, data, cwd=tmp_path))
    assert needle in msg
    assert fake_calls == [] and not out.exists() and not (tmp_path.parent / "x").exists()


def test_unusual_but_valid_task_names_load(tmp_path: Path) -> None:
    for name in ("qa", "my-task.v2", "_private", "Task_01"):
        p = tmp_path / "t.toml"
        p.write_text(TOY_TASK.replace('name = "toy_qa"', f'name = "{name}"'), encoding="utf-8")
        task = load_task(str(p))
        assert task.name == name and task.data_file == f"{name}.jsonl"


# --------------------------------------------------------------------------- SIGTERM
def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "HDEVAL_LLM", "HDEVAL_BASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    return env


def _ok_bodies(answers) -> Counter[bytes]:
    return Counter(a.body for a in answers if a.outcome == "ok")


# real CLI processes against a server (apply trains first, then runs twice): CI runs them; the
# default run checks the one line and exit 143 in-process (test_sigterm_during_a_command_
# exits_143_with_one_line) and the resume in test_cache.py (test_interrupted_run_resumes_...)
@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "apply"])
def test_sigterm_ends_the_run_with_one_line_and_a_rerun_repeats_no_call(command: str, tmp_path: Path) -> None:
    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    cache = tmp_path / "cache"
    with FaultServer(delay=0.01, lifetime=300) as server:
        llm = ["--llm", "test-model", "--base-url", server.url, "--cache-dir", str(cache), "--concurrency", "4",
               "--max-retries", "0"]
        if command == "train":
            args = ["train", "--task", str(task), "--data", str(data), "--layers", "2", "--aggregator", "lr",
                    "-o", str(tmp_path / "art"), *llm]
        else:
            art = tmp_path / "art"
            res = subprocess.run([sys.executable, "-m", "hdeval.cli", "train", "--task", str(task), "--data",
                                  str(data), "--layers", "2", "--aggregator", "lr", "-o", str(art), *llm],
                                 env=_child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, res.stderr
            other = write_jsonl(tmp_path / "new.jsonl", [{**r, "output": r["output"] + " new"} for r in toy_rows()])
            args = ["apply", str(art), str(other), "-o", str(tmp_path / "scored.jsonl"), *llm]
        cmd = [sys.executable, "-m", "hdeval.cli", *args]
        base, start = server.calls, len(server.log)
        sent = threading.Event()
        proc: subprocess.Popen[str] | None = None

        def at_request(n: int) -> None:
            if n - base == 20 and not sent.is_set():
                assert proc is not None
                os.kill(proc.pid, signal.SIGTERM)
                sent.set()

        server.on_request = at_request
        try:
            proc = subprocess.Popen(cmd, env=_child_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            _, err = proc.communicate(timeout=120)
        finally:
            server.on_request = None
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        assert sent.is_set()
        assert proc.returncode == 143, err
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1]
        assert re.fullmatch(r"terminated \(SIGTERM\): every finished LLM call is cached; rerun .*", last), err
        assert not (tmp_path / "scored.jsonl").exists()
        first = server.log[start:]
        assert len(cache_entries(cache)) >= len(_ok_bodies(first)) > 0
        again = len(server.log)
        done = subprocess.run(cmd, env=_child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        second = server.log[again:]
        assert second, "the rerun had work left"
        repeated = sum(n - 1 for n in _ok_bodies(first + second).values())
        assert repeated == 0, f"{repeated} completions were paid for twice"


def test_sigterm_during_a_command_exits_143_with_one_line(capsys) -> None:
    from hdeval.cli import run_command

    def work() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises before this ends

    def unhandled(signum, frame) -> None:
        raise AssertionError("run_command did not install its SIGTERM handler")

    # the signal goes to pytest's own process: without run_command's handler it must fail this
    # test, not end the whole run
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        with pytest.raises(SystemExit) as info:
            run_command(work)
        assert info.value.code == 143
        err = capsys.readouterr().err
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1]
        assert re.fullmatch(r"terminated \(SIGTERM\): every finished LLM call is cached; rerun .*", last), err
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_run_command_restores_the_sigterm_handler() -> None:
    from hdeval.cli import run_command

    before = signal.getsignal(signal.SIGTERM)
    assert run_command(lambda: 42) == 42
    assert signal.getsignal(signal.SIGTERM) is before


# --------------------------------------------------------------------------- report labels
def test_report_with_dollar_signs_in_names(tmp_path: Path) -> None:
    text = (TOY_TASK.replace('name = "Clarity"', 'name = "price $x^$"')
            .replace('key = "accuracy"', 'key = "cost $a_b$ ^"'))
    task = tmp_path / "dollar_task.toml"
    task.write_text(text, encoding="utf-8")
    rows = toy_rows(aspects=("clarity", "cost $a_b$ ^"))
    data = write_jsonl(tmp_path / "dollar.jsonl", rows)
    art = tmp_path / "art"
    res = run("train", "--task", str(task), "--data", str(data), "--cache-dir", str(tmp_path / "cache"),
              "--llm", "fake", "--layers", "2", "--aggregator", "rf", "-q", "-o", str(art))
    assert res.exit_code == 0, res.output
    res = run("report", str(art), "-q", "--max-samples", "10", "--curve-points", "3")
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 0, res.output
    html = (art / "report" / "report.html").read_text(encoding="utf-8")
    assert "price $x^$" in html and "cost $a_b$ ^" in html and "\\$" not in html
