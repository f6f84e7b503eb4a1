"""The README's commands work as written, each run as a user would: a subprocess in a fresh
working directory (with the clone's examples/ copied in), HDEVAL_DATA_DIR absolute.

Each command is restated here and checked to appear verbatim in README.md, so editing one
without the other fails. Also here: what a first run on a fresh machine needs (the built-in
task's data downloaded on first use, a custom task's data beside its task file), and the
output a person follows (progress off a terminal, the end-of-training summary, `--help`).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import REPO, embedded_model_or_skip, shared_data_dir

README = (REPO / "README.md").read_text(encoding="utf-8")
# docs/architecture.md describes the code and holds no commands to run
DOC_PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "architecture.md")
DOCS = README + "".join(p.read_text(encoding="utf-8") for p in DOC_PAGES)
RUN_TIMEOUT = 600

needs_shared = pytest.mark.skipif(
    shared_data_dir() is None, reason="HDEVAL_DATA_DIR is not set to the shared data folder"
)


def in_readme(*lines: str) -> None:
    """The README or a docs page still says each line (the reference moved to docs/)."""
    for line in lines:
        assert line in DOCS, f"neither README.md nor docs/ says any more: {line}"


def child_env(**extra: str | None) -> dict[str, str]:
    """The environment of a user's shell: no key, no LLM chosen; this checkout's code first."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "HDEVAL_LLM", "HDEVAL_BASE_URL", "HDEVAL_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def hdeval(command: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one README line (``hdeval ...``, a ``# comment`` allowed) in ``cwd``."""
    argv = command.split("#")[0].replace("\\\n", " ").split()
    assert argv[0] == "hdeval", command
    return subprocess.run([sys.executable, "-m", "hdeval.cli", *argv[1:]], cwd=cwd,
                          env=env or child_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """A fresh working directory holding what a clone has beside README.md: examples/."""
    work = tmp_path / "work"
    shutil.copytree(REPO / "examples", work / "examples")
    return work


def ok(r: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    return r


# ------------------------------------------------------------------ the test command
INNER = "HDEVAL_README_INNER"


def test_readme_test_command_with_a_relative_data_dir(tmp_path: Path) -> None:
    # The README's `HDEVAL_DATA_DIR=../shared/data python -m pytest`: a relative path. Run a
    # pytest session with a relative HDEVAL_DATA_DIR and check, inside it, that a subprocess
    # started in another directory still finds the data.
    in_readme("HDEVAL_DATA_DIR=../shared/data python -m pytest")
    data = tmp_path / "shared" / "data"
    data.mkdir(parents=True)
    (data / "marker.txt").write_text("here")
    # pytest starts in tests/; the relative path is relative to there.
    env = child_env(HDEVAL_DATA_DIR=os.path.relpath(data, REPO / "tests"), **{INNER: "1"})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{Path(__file__).name}::test_inner_data_dir_is_absolute"],
                       cwd=REPO / "tests", env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


def test_inner_data_dir_is_absolute(tmp_path: Path) -> None:
    if not os.environ.get(INNER):
        pytest.skip("runs inside test_readme_test_command_with_a_relative_data_dir")
    env = os.environ["HDEVAL_DATA_DIR"]
    assert os.path.isabs(env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = "import os, pathlib; print(pathlib.Path(os.environ['HDEVAL_DATA_DIR'], 'marker.txt').read_text())"
    r = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True)
    assert r.stdout.strip() == "here", r.stderr


# ------------------------------------------------------------------ the same commands on the real data sets
# (the documented commands run on examples/, below; these check the built-in tasks end to end)
OFFLINE_DEMO = [
    "hdeval train --task summeval --layers 2 --limit 64 --llm fake -o artifacts/summeval-demo",
    "hdeval apply artifacts/summeval-demo examples/new_summaries.jsonl -o scored.jsonl",
]


@pytest.mark.slow  # a real data set end to end; test_readme_commands_run_as_written covers train, apply
@needs_shared
def test_readme_offline_demo(fresh: Path) -> None:
    env = child_env(HDEVAL_DATA_DIR=str(shared_data_dir().resolve()))
    r = ok(hdeval(OFFLINE_DEMO[0], fresh, env))
    assert (fresh / "artifacts" / "summeval-demo" / "manifest.json").is_file()
    assert "next: hdeval report artifacts/summeval-demo" in r.stdout
    ok(hdeval(OFFLINE_DEMO[1], fresh, env))
    rows = [json.loads(line) for line in (fresh / "scored.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(set(r["scores"]) == {"coherence", "consistency", "fluency", "relevance"}
                                  for r in rows)


DRY_RUN = "hdeval train --task summeval --dry-run --price-in 0.15 --price-out 0.60"


@needs_shared
def test_readme_dry_run_needs_no_llm(fresh: Path) -> None:
    env = child_env(HDEVAL_DATA_DIR=str(shared_data_dir().resolve()))
    r = ok(hdeval(DRY_RUN, fresh, env))
    assert "dry run for task summeval: 1600 samples" in r.stdout
    assert re.search(r"estimated cost: at most \d+\.\d\d \(at 0.15/0.6 per 1M tokens\)", r.stdout)
    if not any(importlib.util.find_spec(m) for m in ("xllamacpp", "llama_cpp")):
        # No key, no local model: the estimate is for the default OpenAI model, and says so.
        assert "LLM openai:gpt-4o-mini" in r.stdout
        assert "no LLM configured; estimating for gpt-4o-mini" in r.stderr
    assert not (fresh / "artifacts").exists()


IMPORT = """hdeval data import ratings.csv --task summeval -o my.jsonl \\
    --source-col article --output-col summary --score-col coherence=coh --score-col relevance=rel"""

RATINGS = "article,summary,coh,rel\n" + "".join(
    f'"Article {d}: the council met on day {d}. It voted.","Summary {k} of article {d}.",{1 + (d + k) % 5},{1 + (d * k) % 5}\n'
    for d in range(12) for k in range(3)
)


def test_readme_data_import_of_a_subset_of_aspects(fresh: Path) -> None:
    (fresh / "ratings.csv").write_text(RATINGS, encoding="utf-8")
    r = ok(hdeval(IMPORT, fresh))
    assert "imported 36 rows (12 doc_ids) for task summeval: my.jsonl" in r.stdout
    assert "no column for consistency, fluency" in r.stderr
    assert "--aspects coherence,relevance" in r.stderr
    row = json.loads((fresh / "my.jsonl").read_text().splitlines()[0])
    assert set(row["scores"]) == {"coherence", "relevance"}  # the others absent, not an error
    # Training on all aspects fails, and says how to train on the ones present.
    train = "hdeval train --task summeval --data my.jsonl --llm fake --layers 1 -o art"
    r = hdeval(train, fresh)
    assert r.returncode == 2 and r.stderr.startswith("error: ")
    assert "scores.consistency is missing" in r.stderr and "--aspects coherence,relevance" in r.stderr
    assert not (fresh / "art").exists()
    ok(hdeval(train + " --aspects coherence,relevance", fresh))
    manifest = json.loads((fresh / "art" / "manifest.json").read_text())
    assert "consistency" not in json.dumps(manifest["task"]["aspects"])


def test_import_without_score_columns_still_needs_every_aspect(fresh: Path) -> None:
    # Naming no --score-col keeps the old contract: every aspect's column must be there.
    (fresh / "ratings.csv").write_text(RATINGS, encoding="utf-8")
    r = hdeval("hdeval data import ratings.csv --task summeval -o my.jsonl --source-col article "
               "--output-col summary", fresh)
    assert r.returncode == 2 and "no column 'coherence'" in r.stderr
    assert not (fresh / "my.jsonl").exists()


def test_readme_data_list(fresh: Path, tmp_path: Path) -> None:
    in_readme("hdeval data list")
    home = tmp_path / "xdg"
    r = ok(hdeval("hdeval data list", fresh, child_env(HDEVAL_DATA_DIR=None, XDG_DATA_HOME=str(home))))
    assert f"{home}/hdeval/data/summeval.jsonl  (missing)" in r.stdout
    assert "(* = the file train uses)" in r.stdout


# ------------------------------------------------------------------ first run on a fresh machine
@needs_shared
def test_builtin_task_downloads_its_data_on_first_use(fresh: Path, tmp_path: Path) -> None:
    from http_files import FileServer, files_under

    from hdeval.data.datasets import DATASETS

    upstream = shared_data_dir() / "upstream-samples"
    layout = {ds.path: Path(ds.path).name for ds in DATASETS.values()}
    home = tmp_path / "xdg"
    with FileServer(files_under(upstream, layout, "/m")) as srv:
        env = child_env(HDEVAL_DATA_DIR=None, HDEVAL_OFFLINE=None, XDG_DATA_HOME=str(home),
                        XDG_CACHE_HOME=str(tmp_path / "cache"), HDEVAL_DATA_SOURCE_URL=srv.url + "/m/",
                        no_proxy="127.0.0.1,localhost")
        # --offline refuses, names every way forward, and fetches nothing.
        r = hdeval("hdeval train --task sfres --llm fake --layers 1 --offline", fresh, env)
        assert r.returncode == 2 and srv.requests == []
        for way in ("--offline", "--data", "HDEVAL_DATA_DIR", "--source-url file://"):
            assert way in r.stderr, way
        # Without it: one notice line, then training on the downloaded file.
        r = ok(hdeval("hdeval train --task sfres --llm fake --layers 1 -o art", fresh, env))
        assert srv.requests == ["/m/data2text/sfres.json"]
        notices = [line for line in r.stderr.splitlines() if "downloading it once" in line]
        assert len(notices) == 1 and "--offline" in notices[0]
        assert (home / "hdeval" / "data" / "sfres.jsonl").is_file() and (fresh / "art").is_dir()
        # Second run: the file is there, nothing is fetched (a dry run fetches a missing file too).
        r = ok(hdeval("hdeval train --task sfres --llm fake --layers 1 --dry-run", fresh, env))
        assert r.stdout.startswith("dry run for task sfres: ") and len(srv.requests) == 1


def test_failed_download_names_the_ways_forward(fresh: Path, tmp_path: Path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    env = child_env(HDEVAL_DATA_DIR=None, HDEVAL_OFFLINE=None, XDG_DATA_HOME=str(tmp_path / "xdg"),
                    HDEVAL_DATA_SOURCE_URL=f"http://127.0.0.1:{port}/m/", no_proxy="127.0.0.1,localhost")
    r = hdeval("hdeval train --task summeval --llm fake", fresh, env)
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 2  # notice + error
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: no data for task summeval") and f"127.0.0.1:{port}" in err
    for way in ("--data", "HDEVAL_DATA_DIR", "--source-url file://"):
        assert way in err, way


def test_custom_task_finds_its_data_file_beside_the_task_file(fresh: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    task = fresh / "examples" / "qa_task.toml"
    r = ok(hdeval(f"hdeval train --task {task} --llm fake --layers 1 -o art", elsewhere,
                  child_env(HDEVAL_DATA_DIR=None)))
    assert str(fresh / "examples" / "qa.jsonl") in r.stderr  # "task qa: 24 samples from ..."
    # Relative task path, other working directory: still found (a dry run reads it as training does).
    r = ok(hdeval("hdeval train --task ../work/examples/qa_task.toml --llm fake --layers 1 --dry-run",
                  elsewhere, child_env(HDEVAL_DATA_DIR=None)))
    assert "dry run for task qa: 24 samples" in r.stdout


# ------------------------------------------------------------------ output a person can follow
def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys\n"
        "import hdeval.cli\n"
        "try:\n"
        "    hdeval.cli.cli(['--help'], prog_name='hdeval')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('LOADED', sorted(m for m in ('sklearn', 'shap', 'matplotlib', 'pandas', 'numpy', 'scipy')"
        " if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT)
    assert "Commands:" in r.stdout and "train" in r.stdout
    assert "LOADED []" in r.stdout, r.stdout[-500:]


@pytest.mark.parametrize("args, message", [
    (["-o", "notart"], "error: refusing to write the artifact to notart: it is a non-empty directory"),
    (["--task", "missing_task.toml"], "error: task file not found: missing_task.toml"),  # the last --task wins
])
def test_a_mistyped_path_is_reported_before_the_heavy_libraries_load(tmp_path: Path, args, message) -> None:
    (tmp_path / "notart").mkdir()
    (tmp_path / "notart" / "mine.txt").write_text("keep")
    argv = ["train", "--task", str(REPO / "examples" / "qa_task.toml"), "--llm", "fake", *args]
    code = (
        "import sys\n"
        "import hdeval.cli\n"
        "try:\n"
        f"    hdeval.cli.cli({argv!r}, prog_name='hdeval')\n"
        "except SystemExit as e:\n"
        "    print('EXIT', e.code)\n"
        "print('LOADED', sorted(m for m in ('sklearn', 'shap', 'matplotlib', 'pandas') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT)
    assert r.stderr.startswith(message), r.stderr
    assert "EXIT 2" in r.stdout and "LOADED []" in r.stdout, r.stdout
    assert (tmp_path / "notart" / "mine.txt").read_text() == "keep" and not (tmp_path / "new").exists()


def test_public_api_names_still_load() -> None:
    code = ("import hdeval.run.train\nfrom hdeval import train, TrainConfig, Evaluator\n"
            "print(callable(train), TrainConfig.__name__, Evaluator.__name__)")
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT)
    assert r.stdout.split() == ["True", "TrainConfig", "Evaluator"], r.stderr


def test_progress_off_a_terminal_prints_intermediate_lines(toy, tmp_path: Path) -> None:
    task, data = toy
    env = child_env(HDEVAL_PROGRESS_INTERVAL="0", HDEVAL_DATA_DIR=None)
    r = ok(hdeval(f"hdeval train --task {task} --data {data} --llm fake --layers 1 --concurrency 1 "
                  f"--cache-dir {tmp_path / 'c'} -o {tmp_path / 'art'}", tmp_path, env))
    lines = [line for line in r.stderr.splitlines() if line.startswith("layer 1: scoring")]
    done = [int(m.group(1)) for line in lines if (m := re.search(r": (\d+)/72 done", line))]
    assert done[0] == 0 and done[-1] == 72
    assert any(0 < d < 72 for d in done), lines  # not only 0/N and N/N
    assert any(re.search(r"calls/s, ETA \d+m\d\ds$", line) for line in lines), lines
    assert "\r" not in r.stderr and "\033[K" not in r.stderr  # no terminal redraws in a log


def test_progress_interval_limits_lines_off_a_terminal(monkeypatch) -> None:
    from hdeval.cli import TerminalProgress

    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    p = TerminalProgress(interval=3600)
    p.stage("scoring", 100)
    for _ in range(100):
        p.advance()
    p.end_stage()
    assert [line.split(":")[1].split()[0] for line in buf.getvalue().splitlines()] == ["0/100", "100/100"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_error_starts_on_a_fresh_line_after_a_redrawn_progress_line(monkeypatch) -> None:
    from hdeval import cli
    from hdeval.core.errors import DataError

    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    p = cli.TerminalProgress()
    p.stage("layer 1: scoring", 10)
    p.advance()

    def fail() -> None:
        raise DataError("broken")

    with pytest.raises(SystemExit):
        cli.run_command(fail)
    out = tty.getvalue()
    assert "\nerror: broken\n" in out and out.rstrip("\n").splitlines()[-1] == "error: broken"


def test_library_warnings_become_one_summarised_line(capsys) -> None:
    from hdeval.cli import run_command

    def noisy() -> int:
        for _ in range(5):
            warnings.warn("lbfgs failed to converge (status=1):\nSTOP: TOTAL NO. of ITERATIONS", RuntimeWarning)
        warnings.warn("something else", UserWarning)
        return 7

    assert run_command(noisy) == 7
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: lbfgs failed to converge (status=1): (RuntimeWarning, 5 times)",
                   "warning: something else (UserWarning)"]


def test_train_summary_names_final_evaluator_baseline_and_next_step(toy, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from hdeval.cli import cli

    task, data = toy
    art = tmp_path / "art"
    r = CliRunner().invoke(cli, ["train", "--task", str(task), "--data", str(data), "--llm", "fake",
                                 "--layers", "2", "--aggregator", "lr", "-q", "--cache-dir",
                                 str(tmp_path / "c"), "-o", str(art)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    metrics = json.loads((art / "metrics.json").read_text())
    kept = metrics["selection"]["kept_layer"]  # the layer chosen on training data, not the deepest
    shown = re.search(rf"final evaluator: layer {kept} of 2 built, aggregator lr, (\d+) criteria \(", r.stdout)
    assert shown
    assert "90% prediction intervals: clarity ±" in r.stdout
    direct = metrics["direct_layer1"]["average"]["spearman"]
    final = metrics["final"]["average"]["spearman"]
    assert f"held-out Spearman: trained {final:.3f} vs direct layer-1 score {direct:.3f} (difference {final - direct:+.3f})" \
        in r.stdout
    assert r.stdout.rstrip().splitlines()[-2:] == [
        f"next: hdeval report {art}", "then: train with a real LLM (--llm): the fake LLM's numbers only show the "
        "pipeline runs"]
    # 18 training rows, 18 held out: the held-out set is too small and said so; the rows are too
    # few for the kept layer's criteria (fewer than two rows a criterion) exactly when warned so.
    overfit = "warning: 18 training samples for" in r.stderr and "may overfit" in r.stderr
    assert overfit == (18 < 2 * int(shown.group(1)))
    assert "warning: only 18 held-out samples" in r.stderr


def test_download_error_starts_on_a_fresh_line_after_the_byte_counter(monkeypatch) -> None:
    from hdeval.cli import data as cli_data
    from hdeval.core.errors import DownloadError
    from hdeval.data.datasets import DownloadEvent

    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    cli_data._Reporter()(DownloadEvent("bytes", "sfres", done_bytes=2_000_000))

    @cli_data._errors_to_exit
    def fail() -> None:
        raise DownloadError("connection closed")

    with pytest.raises(SystemExit):
        fail()
    assert tty.getvalue().endswith(" MB\nerror: connection closed\n")


def test_progress_off_a_terminal_ticks_while_a_call_is_running(monkeypatch) -> None:
    # One slow call (a local model) must not silence the log: a line comes every interval.
    import threading

    from hdeval.cli import TerminalProgress

    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    p = TerminalProgress(interval=0.01)
    p.stage("layer 2: decomposing 4 criteria", 4)
    p.advance()
    seen = threading.Event()
    for _ in range(3000):  # waits for the ticker, up to 30 s; asserts no duration
        if buf.getvalue().count("1/4 done") >= 2:
            seen.set()
            break
        threading.Event().wait(0.01)
    p.end_stage()
    assert seen.is_set(), buf.getvalue()
    assert buf.getvalue().splitlines()[-1].startswith("layer 2: decomposing 4 criteria: 1/4 done")
    n = len(buf.getvalue().splitlines())
    threading.Event().wait(0.1)
    assert len(buf.getvalue().splitlines()) == n  # the ticker stopped with the stage


DIRECT = "hdeval train --task summeval --method direct --llm fake --limit 64 -o artifacts/summeval-direct"


@needs_shared
def test_readme_direct_baseline_and_methods_list(fresh: Path) -> None:
    env = child_env(HDEVAL_DATA_DIR=str(shared_data_dir().resolve()))
    r = ok(hdeval(DIRECT, fresh, env))
    assert "held-out average: pearson" in r.stdout
    manifest = json.loads((fresh / "artifacts" / "summeval-direct" / "manifest.json").read_text())
    assert manifest["method"] == "direct"
    listed = ok(hdeval("hdeval methods", fresh, env)).stdout
    for name in ("hdeval", "direct", "paireval", "direct-yesno", "dna"):
        assert f"\n{name} (" in "\n" + listed


BENCHMARK = ("hdeval benchmark --task sfhot --preset paper --methods direct,hdeval --aggregators lr,rf --seeds 2 "
             "--train-fracs 0.25,0.5 --limit 60 --layers 2 --llm fake -o bench")


@pytest.mark.slow  # a real data set end to end; test_benchmark.py covers --force and a cached rerun
@needs_shared
def test_readme_benchmark(fresh: Path, tmp_path: Path) -> None:
    env = child_env(HDEVAL_DATA_DIR=str(shared_data_dir().resolve()), HDEVAL_CACHE_DIR=str(tmp_path / "cache"))
    r = ok(hdeval(BENCHMARK, fresh, env))
    results = json.loads((fresh / "bench" / "results.json").read_text())
    assert results["aspects"] == ["naturalness"]  # the paper's SFHOT setting
    assert len(results["settings"]) == 6 and results["calls"] > 0
    assert "benchmark written to bench" in r.stdout and (fresh / "bench" / "report.html").is_file()
    # The same sweep again, from the cache: replacing needs --force, and then makes no call.
    assert hdeval(BENCHMARK, fresh, env).returncode == 2
    ok(hdeval(BENCHMARK + " --force", fresh, env))
    assert json.loads((fresh / "bench" / "results.json").read_text())["calls"] == 0


PAIR_BENCHMARK = ("hdeval benchmark --task faireval --methods dna-direct,dna,hdeval --seeds 2 --layers 2 --limit 40 "
                  "--llm fake -o bench-pairs")


@pytest.mark.slow  # a real data set end to end; test_benchmark.py covers pairwise sweeps
@needs_shared
def test_readme_pairwise_benchmark(fresh: Path, tmp_path: Path) -> None:
    env = child_env(HDEVAL_DATA_DIR=str(shared_data_dir().resolve()), HDEVAL_CACHE_DIR=str(tmp_path / "cache"))
    r = ok(hdeval(PAIR_BENCHMARK, fresh, env))
    results = json.loads((fresh / "bench-pairs" / "results.json").read_text())
    assert results["shape"] == "pairwise" and results["calls"] > 0
    assert [s["method"] for s in results["settings"]] == ["dna-direct", "hdeval", "dna"]
    dna = results["settings"][2]
    assert "learned" in dna["agreement"] and "vs_dna_direct" in dna["bootstrap"]
    assert "held-out agreement w/o ties" in r.stdout
    ok(hdeval(PAIR_BENCHMARK + " --force", fresh, env))
    assert json.loads((fresh / "bench-pairs" / "results.json").read_text())["calls"] == 0


TREE_WORKFLOW = [
    "hdeval train --task summeval --layers 1 --limit 64 --llm fake -o artifacts/summeval-l1",
    "cp artifacts/summeval-l1/tree.json my_tree.json",
    "hdeval train --task summeval --tree my_tree.json --layers 3 --limit 64 --llm fake "
    "--decompose-llm fake:logprobs=0 -o artifacts/summeval-edited",
    "hdeval train --task summeval --tree artifacts/summeval-demo --layers 2 --limit 64 --llm fake:logprobs=0 "
    "-o artifacts/summeval-rescored",
]


@pytest.mark.slow  # a real data set end to end; test_tree_input.py covers --tree, --decompose-llm
@needs_shared
def test_readme_tree_and_decompose_llm_workflow(fresh: Path) -> None:
    env = child_env(HDEVAL_DATA_DIR=str(shared_data_dir().resolve()), HDEVAL_CACHE_DIR=str(fresh / "cache"))
    ok(hdeval(TREE_WORKFLOW[0], fresh, env))
    # the person's edit: sub-criteria for coherence, written and locked; fluency locked as it is
    tree = json.loads((fresh / "artifacts" / "summeval-l1" / "tree.json").read_text())
    for c in tree["criteria"]:
        c["locked"] = c["key"] == "fluency"
    tree["criteria"] += [
        {"key": f"coherence/{k}", "name": k.title(), "definition": f"Is the summary's {k} sound?",
         "parent": "coherence", "locked": True} for k in ("order", "focus")]
    (fresh / "my_tree.json").write_text(json.dumps(tree), encoding="utf-8")
    r = ok(hdeval(TREE_WORKFLOW[2], fresh, env))
    assert "criteria from my_tree.json (6, 3 locked): coherence, consistency, fluency (locked)" in r.stdout
    made = json.loads((fresh / "artifacts" / "summeval-edited" / "tree.json").read_text())["criteria"]
    by_key = {c["key"]: c for c in made}
    assert by_key["coherence/order"]["name"] == "Order"  # the person's criteria, kept as written
    parents = {c["parent"] for c in made if c["key"] not in {t["key"] for t in tree["criteria"]}}
    # layer 2: the unlocked aspects without children; locked ones never get any
    assert {"consistency", "relevance"} <= parents and not parents & {"fluency", "coherence/order",
                                                                     "coherence/focus"}
    manifest = json.loads((fresh / "artifacts" / "summeval-edited" / "manifest.json").read_text())
    assert manifest["state"]["decompose_llm"]["identity"] == "fake:v1:logprobs=0"
    # rescoring the demo's tree with another LLM: no decomposition, the same criteria
    ok(hdeval(OFFLINE_DEMO[0], fresh, env))
    demo = json.loads((fresh / "artifacts" / "summeval-demo" / "tree.json").read_text())
    # the demo keeps the layers that won on training data, so its tree may be shallower than
    # --layers 2: rescore to exactly the depth it holds
    depth = max(c["key"].count("/") + 1 for c in demo["criteria"])
    r = ok(hdeval(TREE_WORKFLOW[3].replace("--layers 2", f"--layers {depth}"), fresh, env))
    assert "criteria added by decomposition: 0" in r.stdout
    again = json.loads((fresh / "artifacts" / "summeval-rescored" / "tree.json").read_text())
    assert again == demo


# ------------------------------------------------------------------ every command of README.md and docs/
# `bash` blocks run as written, in order, in one fresh directory per page (a later command may
# use what an earlier one wrote); `python` blocks run as a script there. `sh` blocks need the
# network, a server or a model file the tests cannot have, and are not run.
BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)
# commands that run an LLM must say which: without --llm a command means money or hours
NEEDS_LLM = re.compile(r"^hdeval (train|benchmark)\b")


def page_commands(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind, body in BLOCK.findall(text):
        if kind == "python":
            out.append(("python", body))
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(("bash", line))
    return out


def run_page(text: str, work: Path, tmp: Path, local: bool) -> int:
    """Run a page's commands (those with --llm local only when ``local``); returns how many ran."""
    env = child_env(HDEVAL_DATA_DIR=None, HDEVAL_OFFLINE="1", HDEVAL_CACHE_DIR=str(tmp / "cache"),
                    XDG_DATA_HOME=str(tmp / "xdg"), HOME=str(tmp / "home"))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    ran = 0
    local_outputs: set[str] = set()  # what the embedded-model commands write; their readers go with them
    for kind, command in page_commands(text):
        if kind == "bash" and NEEDS_LLM.match(command):
            # a jury file names its judges' LLMs
            assert "--llm" in command or "--jury" in command, f"a command without --llm: {command}"
        words = command.split()
        if "--llm local" in command and "-o" in words:
            local_outputs.add(words[words.index("-o") + 1])
        if ("--llm local" in command or bool(local_outputs & set(words))) != local:
            continue
        if kind == "python":
            script = tmp / "snippet.py"
            script.write_text(command, encoding="utf-8")
            argv = [sys.executable, str(script)]
        else:
            assert command.startswith(("hdeval ", "cp ")), f"a command the doc test does not know: {command}"
            argv = ["bash", "-c", command]
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert r.returncode == 0 and "Traceback" not in r.stderr, f"{command}\n{r.stderr[-3000:]}"
        ran += 1
    return ran


def test_readme_commands_parse_and_write_only_under_artifacts(fresh: Path, monkeypatch) -> None:
    """The default run's share of the check below, which runs them (slow): every README command
    is one the CLI takes as written (its options, their values, --llm named), and each file or
    directory it writes lies under artifacts/, which .gitignore covers."""
    import shlex

    import click

    from hdeval.cli import cli

    monkeypatch.chdir(fresh)
    # `sh` blocks too: they are not run (a server runs until stopped), but what they write counts
    shown = README.replace("```sh\n", "```bash\n")
    commands = [c for kind, c in page_commands(shown) if kind == "bash" and c.startswith("hdeval ")]
    assert len(commands) >= 9 and any(c.startswith("hdeval label ") for c in commands)
    for command in commands:
        assert not NEEDS_LLM.match(command) or "--llm" in command, f"a command without --llm: {command}"
        name, *args = shlex.split(command.split(" #")[0])[1:]
        with click.Context(cli, info_name="hdeval") as ctx:
            cmd = cli.get_command(ctx, name)
            assert cmd is not None, command
            sub = cmd.make_context(name, args, parent=ctx)  # a bad option or value raises here
            written = [sub.params.get(k) for k in ("output", "out", "export_requests", "labels")]
            for path in filter(None, written):
                assert Path(str(path)).parts[0] == "artifacts", f"{command} writes {path}"
    assert "/artifacts/*" in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_the_docs_commands_in_turn_write_only_under_artifacts_and_never_twice() -> None:
    """A user follows the README and then the pages in one clone: no command may find its output
    already written by an earlier one (train, apply and export refuse that without --force), and
    a clone stays clean. `hdeval label` reopens its labels file on purpose."""
    import shlex

    seen: dict[str, str] = {}
    for page in [REPO / "README.md", *DOC_PAGES]:
        shown = page.read_text(encoding="utf-8").replace("```sh\n", "```bash\n")
        for kind, command in page_commands(shown):
            if kind != "bash" or not command.startswith("hdeval "):
                continue
            words = shlex.split(command.split(" #")[0])
            # train's default output depends on what it keeps: a documented run names its own
            assert words[1] != "train" or "-o" in words or "--dry-run" in words, f"{page.name}: {command}"
            written = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-o", "--export-requests", "--cache-dir")]
            made = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-o"] + (
                [words[2]] if words[1] == "merge-shards" else []
            )
            for out in filter(lambda o: o != "-", written + made):
                assert Path(out).parts[0] == "artifacts", f"{page.name}: {command} writes {out} outside artifacts/"
            for out in filter(lambda o: o != "-", made):
                # the same command again is the resume idiom (a staged run's second pass)
                if out in seen and "--force" not in words and seen[out] != command:
                    raise AssertionError(f"{page.name}: {command} writes {out}, as {seen[out]} did")
                seen[out] = command


@pytest.mark.slow  # 9 commands in new processes (~90 s at load 7); the test above parses them all
def test_readme_commands_run_as_written(fresh: Path, tmp_path: Path) -> None:
    assert run_page(README, fresh, tmp_path, local=False) >= 8
    # what the quick start and "your own data" promise the user sees
    assert (fresh / "artifacts" / "ratings.toml").is_file()
    assert (fresh / "artifacts" / "my-eval" / "manifest.json").is_file()
    assert (fresh / "artifacts" / "my-eval" / "report" / "report.html").is_file()
    rows = [json.loads(line) for line in (fresh / "artifacts" / "scored.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["new-qa-0", "new-qa-1", "new-qa-2"]
    assert all(set(r["scores"]) == {"clear", "correct"} for r in rows)  # the aspects `hdeval init` found
    assert len((fresh / "artifacts" / "judged.jsonl").read_text().splitlines()) == 2
    # a clone stays clean: everything the commands wrote is under artifacts/, which .gitignore covers
    assert sorted(p.name for p in fresh.iterdir()) == ["artifacts", "examples"]
    assert "/artifacts/*" in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_docs_commands_run_as_written(page: Path, fresh: Path, tmp_path: Path) -> None:
    run_page(page.read_text(encoding="utf-8"), fresh, tmp_path, local=False)


def test_docs_site_links_point_at_pages_that_exist() -> None:
    # the README links into docs/; mkdocs build --strict (in .ci/run) checks the site's own links
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (REPO / target).is_file(), target
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOC_PAGES:
        assert page.name in nav, f"docs/{page.name} is not in mkdocs.yml's nav"


def test_a_command_that_fails_fails_the_doc_test(fresh: Path, tmp_path: Path) -> None:
    page = "```bash\nhdeval apply artifacts/nothing-here examples/new_qa.jsonl -o x.jsonl\n```\n"
    with pytest.raises(AssertionError, match="nothing-here"):
        run_page(page, fresh, tmp_path, local=False)
    with pytest.raises(AssertionError, match="without --llm"):
        run_page("```bash\nhdeval train --task examples/qa_task.toml\n```\n", fresh, tmp_path, local=False)


QUICK_START = "hdeval train --task examples/qa_task.toml --tree examples/qa_tree.json --layers 2 --llm local -o artifacts/qa"


@pytest.mark.slow
def test_readme_quick_start_on_the_embedded_model(fresh: Path, tmp_path: Path) -> None:
    in_readme(QUICK_START, "hdeval report artifacts/qa")
    embedded_model_or_skip()
    assert run_page(README, fresh, tmp_path, local=True) == 2
    assert (fresh / "artifacts" / "qa" / "manifest.json").is_file()
    assert (fresh / "artifacts" / "qa" / "report" / "report.html").is_file()
    # the run recorded its rate: the next dry run's estimate comes from it
    rates = json.loads((tmp_path / "cache" / "rates.json").read_text())
    assert any(v.get("calls", 0) >= 20 and not v.get("probe") for v in rates.values())
