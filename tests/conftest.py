"""Shared fixtures: no test reaches the network; cache and data dirs live in tmp_path."""

from __future__ import annotations

import gc
import json
import os
import platform
import shutil
import sqlite3
import sys
import warnings
from pathlib import Path

import diskcache
import pytest

from hdeval.core.paths import user_model_dir

REPO = Path(__file__).resolve().parent.parent
# a news article and a good and a bad summary of it: real prompts for the local-model tests
ARTICLE = (
    "The city council of Riverton voted on Tuesday to build a new public library on the site of "
    "the old bus depot. Construction is expected to start next spring and to cost 12 million "
    "dollars, paid for by a bond approved by voters last year. The mayor said the library would "
    "include a children's wing, a maker space and longer opening hours than the current branch."
)
SUMMARIES = (
    "Riverton will build a new library on the old bus depot site, starting next spring, for 12 million dollars.",
    "the mayor library bus. voted Tuesday council the spring 12 of dollars build",
)


# The embedded model is a read-only resource shared by every test: the user's own model folder
# (read before the per-test isolation below points XDG_DATA_HOME elsewhere).
MODEL_DIR = user_model_dir()


def embedded_model_or_skip() -> Path:
    """The embedded model's file for the tests that run it: skip without a llama.cpp runtime;
    otherwise fetch the model once as a user's first ``--llm local`` run does. A failed download
    skips with its reason, except under CI, where it must not hide the embedded-model tests."""
    import importlib.util

    from hdeval.core.errors import ConfigError
    from hdeval.llm.backends import model_file

    if not any(importlib.util.find_spec(m) for m in ("xllamacpp", "llama_cpp")):
        pytest.skip("needs a llama.cpp runtime: pip install -e '.[local]'")
    try:
        return model_file.installed_model() or model_file.fetched_model() or model_file.fetch()
    except ConfigError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the embedded model is not available here: {exc}")


def _one_blas_kernel() -> None:
    """The golden digests hash training output to the last bit, and OpenBLAS chooses its kernel
    by CPU: an AVX-512 machine (its SkylakeX kernel) gives other last bits than an AVX2 one
    (Haswell, Zen) for the same code, and 4 golden cases changed. Every x86-64 machine with AVX2
    gets the Haswell kernel in tests, set before numpy loads OpenBLAS; a value already set wins."""
    if "numpy" in sys.modules or "OPENBLAS_CORETYPE" in os.environ:
        return
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return
    if "avx2" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


def pytest_configure(config) -> None:
    _one_blas_kernel()  # first: no test module has loaded numpy yet
    # Child processes enter the requests they build (declared kind and data, never sent) in a
    # book the test servers read (tests/child_book/sitecustomize.py); set here, so module-scoped
    # fixtures and every subprocess see it.
    import tempfile

    from llm_server import child_book_env

    # a session inside this one (pytester runs this conftest in-process) keeps the outer book:
    # its own would be deleted at its end while the outer session's children still write to it
    if not os.path.isdir(os.environ.get("HDEVAL_TEST_BOOK_DIR", "")):
        book = tempfile.mkdtemp(prefix="hdeval-test-book-")
        config.add_cleanup(lambda: shutil.rmtree(book, ignore_errors=True))
        os.environ.update(child_book_env(dict(os.environ), book))
    # A method registers its fake LLM's responders when its package is imported (the registry
    # imports them all on first use); tests that use the fake directly with HD-Eval's "score" or
    # "decompose" requests get HD-Eval's here.
    import hdeval.methods.hdeval  # noqa: F401
    # `HDEVAL_DATA_DIR=../shared/data python -m pytest` (the README's command): resolve the
    # relative path once, against the directory pytest was started in, before any test starts
    # a subprocess in another working directory (which would resolve it there).
    env = os.environ.get("HDEVAL_DATA_DIR")
    if env and not os.path.isabs(env):
        os.environ["HDEVAL_DATA_DIR"] = os.path.abspath(env)


# The default run (`python -m pytest`, addopts `-m "not slow"`) takes minutes on 2 cores; these
# take the rest of CI's time: end-to-end runs on the real data sets, and the embedded model.
REAL_DATA_FIXTURES = frozenset({"data_dir", "faireval40", "llmbar60"})
EMBEDDED_MODEL_MODULES = frozenset({"test_xllamacpp", "test_llama_cpp"})


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        module = getattr(item.module, "__name__", "") if hasattr(item, "module") else ""
        if names & REAL_DATA_FIXTURES or (module in EMBEDDED_MODEL_MODULES and "backend" in names):
            item.add_marker(pytest.mark.slow)


def shared_data_dir() -> Path | None:
    env = os.environ.get("HDEVAL_DATA_DIR")
    if env and Path(env).is_dir():
        return Path(env)
    return None


@pytest.fixture
def data_dir() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip("HDEVAL_DATA_DIR is not set to the shared data folder")
    return d


def data_file() -> Path:
    """The shared ``sfres.jsonl`` (skips the test when HDEVAL_DATA_DIR does not hold it)."""
    env = os.environ.get("HDEVAL_DATA_DIR")
    if not env or not (Path(env) / "sfres.jsonl").is_file():
        pytest.skip("HDEVAL_DATA_DIR is not set to the shared data folder (needs sfres.jsonl)")
    return Path(env) / "sfres.jsonl"


@pytest.fixture
def faireval40(data_dir, tmp_path):
    return slice_jsonl(data_dir / "faireval.jsonl", tmp_path / "faireval40.jsonl", 40)


@pytest.fixture
def llmbar60(data_dir, tmp_path):
    # the first 40 rows of LLMBar plus 20 from the Adversarial part, so both labels occur
    src = (data_dir / "llmbar.jsonl").read_text(encoding="utf-8").splitlines()
    p = tmp_path / "llmbar60.jsonl"
    p.write_text("\n".join(src[:40] + src[200:220]) + "\n", encoding="utf-8")
    return p


def run_cli(*args):
    """``hdeval ARGS`` in-process (each argument as text); exceptions become the result's."""
    from click.testing import CliRunner

    from hdeval.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def trained_and_refitted(tmp_path: Path) -> tuple[Path, Path]:
    """An HD-Eval artifact trained with the fake judge on 16 simulated documents (``art``) and
    its refit onto ``fake:logprobs=0`` (``art2``), both under ``tmp_path``, sharing one cache."""
    from simjudge import pointwise_rows, write_pointwise

    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=16, seed=2))
    cache = ["--cache-dir", tmp_path / "c", "-q"]
    res = run_cli("train", "--task", task, "--data", data, "--llm", "fake", "--layers", "1", "--aggregator", "lr",
                  "-o", tmp_path / "art", *cache)
    assert res.exit_code == 0, res.output
    res = run_cli("refit", tmp_path / "art", "--llm", "fake:logprobs=0", "--data", data, "-o", tmp_path / "art2",
                  *cache)
    assert res.exit_code == 0, res.output
    return tmp_path / "art", tmp_path / "art2"


def calls_made(result) -> int:
    """The number of LLM calls a CLI run reports on its "LLM calls made:" line."""
    line = next(x for x in result.stderr.splitlines() if x.startswith("LLM calls made:"))
    return int(line.split(":")[1].split(",")[0])


@pytest.fixture
def browsers():
    """``browsers()``: a new headless chromium (Selenium), each quit at the end; skips without one."""
    from browser import need_browser, new_browser

    need_browser()
    made = []

    def new():
        made.append(new_browser())
        return made[-1]

    yield new
    for d in made:
        d.quit()


@pytest.fixture
def servers():
    """``servers(tmp_path, argv)``: ``hdeval ARGV`` serving a page (tests/browser.py's CliServer),
    each stopped at the end."""
    from browser import CliServer

    started: list = []

    def start(tmp_path: Path, argv: list[str], log: str = "server.log"):
        started.append(CliServer(tmp_path, argv, log))
        return started[-1]

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for one test module; workers import this checkout's hdeval
    and never reach the network. Only the Ray test modules use it (they importorskip ray)."""
    import ray

    path = os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "HDEVAL_OFFLINE": "1"}})
    yield
    ray.shutdown()


def train_artifact(task: str, data: Path, tmp_path: Path, *args, llm=("--llm", "fake"),
                   env: dict | None = None) -> Path:
    """``hdeval train`` of ``task`` on ``data`` with ``llm`` (the fake one by default), a fresh
    cache and ``args``, quiet; the artifact directory (the golden tests' one way to train)."""
    from click.testing import CliRunner

    from hdeval.cli import cli

    out = tmp_path / "art"
    r = CliRunner().invoke(cli, ["train", "--task", task, "--data", str(data), *llm, "--cache-dir",
                                 str(tmp_path / "cache"), "-o", str(out), "-q", *(str(a) for a in args)],
                           env=env, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


def trained_toy_artifact(folder: Path, **options) -> Path:
    """The toy task trained with the fake LLM and ``options`` into ``folder / "art"`` (its task,
    data and cache beside it): for a module-scoped fixture that trains once and hands each test
    its own copy (``copy_artifact``)."""
    from hdeval.run.train import train

    task = folder / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(folder / "toy.jsonl", toy_rows())
    ev = train(task=str(task), data=str(data), llm="fake", cache_dir=str(folder / "train-cache"), **options)
    return ev.save(folder / "art")


def copy_artifact(artifact: Path, tmp_path: Path) -> Path:
    """A test's own copy of a shared artifact, as ``tmp_path / "art"``: what it changes stays its own."""
    return Path(shutil.copytree(artifact, tmp_path / "art"))


def one_error(result, *fragments: str) -> str:
    """The one ``error:`` line of a refused CLI run (not a traceback), holding every fragment."""
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def one_line_error(result, *fragments: str) -> None:
    """The command failed with exactly one ``error:`` line holding every fragment."""
    assert result.exit_code != 0, result.output
    lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


_to_close: list = []


def close_after_test(obj):
    """``obj``, closed when the test ends (a backend's connections: not left to the garbage
    collector, whose ResourceWarning would land in a later test)."""
    _to_close.append(obj)
    return obj


@pytest.fixture(autouse=True)
def _close_after_test():
    yield
    while _to_close:
        _to_close.pop().close()


_LEAKED = pytest.StashKey[list]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # a file or socket the test's own locals held is freed as the test returns, before any
    # fixture's teardown: its ResourceWarning (ignored by default) is recorded here
    if "no_leaked_resources" not in getattr(item, "fixturenames", ()):
        yield
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        yield
    item.stash[_LEAKED] = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    for w in seen:  # the others as pytest would have seen them
        if not issubclass(w.category, ResourceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@pytest.fixture
def no_leaked_resources(request):
    """Fail the test if it left a socket or file open for the garbage collector (whose
    ResourceWarning would come at a random moment, once into an artifact's notes). A module
    that is clean opts in: ``pytestmark = pytest.mark.usefixtures("no_leaked_resources")``."""
    # what earlier tests left is theirs: only what this test makes is collected below (and a
    # collection of those alone is quick, where a full one costs ~0.1 s a test)
    gc.freeze()
    try:
        yield
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            gc.collect()
    finally:
        gc.unfreeze()
    leaked = request.node.stash.get(_LEAKED, []) + [str(w.message) for w in seen
                                                     if issubclass(w.category, ResourceWarning)]
    assert not leaked, f"left open for the garbage collector: {leaked[:3]}"


@pytest.fixture(scope="module", autouse=True)
def _isolated_module_env(tmp_path_factory):
    # module-scoped fixtures (a trained artifact, a reference run) are set up before the per-test
    # isolation below: the module gets an isolated home of its own first
    with pytest.MonkeyPatch.context() as mp:
        isolate_env(mp, tmp_path_factory.mktemp("module-home"))
        yield


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory, monkeypatch):
    isolate_env(monkeypatch, tmp_path_factory.mktemp("home"))


def isolate_env(monkeypatch, home: Path) -> None:
    # A test never uses the developer's real cache, data dir, API key or default LLM.
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("HDEVAL_MODEL_DIR", str(MODEL_DIR))
    monkeypatch.delenv("HDEVAL_CACHE_DIR", raising=False)
    monkeypatch.delenv("HDEVAL_LLM", raising=False)
    monkeypatch.delenv("HDEVAL_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # the test servers speak plain OpenAI and count their requests: no /models question first
    # (the tests of the dialects set it)
    monkeypatch.setenv("HDEVAL_LLM_DIALECT", "openai")
    # `train` on a built-in task with no data would download it: tests never reach the network.
    monkeypatch.setenv("HDEVAL_OFFLINE", "1")


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def slice_jsonl(src: Path, dest: Path, n: int) -> Path:
    """The first ``n`` lines of a shared data file (a small real slice)."""
    with src.open(encoding="utf-8") as fh:
        lines = [next(fh) for _ in range(n)]
    dest.write_text("".join(lines), encoding="utf-8")
    return dest


def toy_rows(n_docs: int = 12, per_doc: int = 3, aspects=("clarity", "accuracy")) -> list[dict]:
    rows = []
    for d in range(n_docs):
        for k in range(per_doc):
            rows.append(
                {
                    "id": f"toy-{d:02d}-{k}",
                    "doc_id": f"doc-{d:02d}",
                    "source": f"Question number {d}: how do plants make {{food}}?" + " more" * d,
                    "output": f"Answer {k}: plants use light." + " words" * (k * 5 + d),
                    "scores": {a: float(1 + (d + k + i) % 5) for i, a in enumerate(aspects)},
                }
            )
    return rows


TOY_TASK = """
name = "toy_qa"
description = "Question answering: a system answered a question."
output_label = "Answer"

[[fields]]
key = "source"
label = "Question"

[[fields]]
key = "output"
label = "Answer"

[[aspects]]
key = "clarity"
name = "Clarity"
definition = "How clear the answer is."
range = [1, 5]

[[aspects]]
key = "accuracy"
name = "Accuracy"
definition = "How correct the answer is."
range = [1, 5]
"""

TOY_DIALOGUE = TOY_TASK.replace('name = "toy_qa"', 'name = "toy_dialogue"').replace(
    'output_label = "Answer"', 'output_label = "Response"')


def toy_pairs() -> list[dict]:
    """18 pairs of answers to 18 questions, preferences a, b and tie in turn."""
    return [{"id": f"p{i}", "doc_id": f"q{i}", "source": f"Question {i}: how to rest?",
             "output_a": "Sleep well and take breaks. " * (1 + i % 4), "output_b": "Rest." * (1 + i % 3),
             "label": ("a", "b", "tie")[i % 3]} for i in range(18)]


def edited_artifact(src: Path, tmp_path: Path, change) -> Path:
    """A copy of the artifact ``src`` at <tmp_path>/art whose manifest ``change`` edited in place."""
    art = tmp_path / "art"
    shutil.copytree(src, art)
    m = json.loads((art / "manifest.json").read_text(encoding="utf-8"))
    change(m)
    (art / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
    return art


def edited_metrics(src: Path, dest: Path, change) -> Path:
    """A copy of the artifact ``src`` at ``dest`` whose metrics.json is ``change(metrics)``, its
    checksum in the manifest updated: only the metrics model can refuse it."""
    from hdeval.artifact.directory import MANIFEST, sha256_file

    shutil.copytree(src, dest)
    metrics = json.loads((dest / "metrics.json").read_text(encoding="utf-8"))
    (dest / "metrics.json").write_text(json.dumps(change(metrics)), encoding="utf-8")
    manifest = json.loads((dest / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"]["metrics.json"] = sha256_file(dest / "metrics.json")
    (dest / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return dest


def set_field(path: str, value):
    """A change of a JSON object that sets its field ``a.b.c`` to ``value``."""
    def change(m: dict) -> dict:
        *parents, last = path.split(".")
        d = m
        for p in parents:
            d = d[p]
        d[last] = value
        return m
    return change


def refused_in_one_line(art: Path, data: Path, tmp_path: Path, *fragments: str) -> None:
    """Loading ``art`` is one ArtifactError line naming its manifest and ``fragments``; so is apply,
    which writes nothing."""
    from hdeval.core.errors import ArtifactError
    from hdeval.methods.registry import load_artifact

    with pytest.raises(ArtifactError) as err:
        load_artifact(art)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{art / 'manifest.json'}: "), line
    for f in fragments:
        assert f in line, line
    out = tmp_path / "out.jsonl"
    one_error(run_cli("apply", art, data, "-o", out, "--cache-dir", tmp_path / "c"),
              "manifest.json", *fragments)
    assert not out.exists()



@pytest.fixture
def toy(tmp_path) -> tuple[Path, Path]:
    """A custom task file and a matching JSONL of 36 samples over 12 documents."""
    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    return task, data


def view(ev) -> dict[str, str]:
    """What must not change between runs of one training: tree, metrics (but call counts),
    score table. Strings, because NaN != NaN in a dict compare."""
    metrics = {k: v for k, v in ev.metrics.items() if k != "usage"}
    return {
        "tree": json.dumps(ev.tree.to_dict(), sort_keys=True),
        "metrics": json.dumps(metrics, sort_keys=True),
        "scores": ev.score_table.to_csv(index=False),
    }


def artifact_view(path: Path) -> dict[str, str]:
    """:func:`view` of a saved artifact directory."""
    metrics = json.loads((path / "metrics.json").read_text())
    metrics.pop("usage")
    return {
        "tree": json.dumps(json.loads((path / "tree.json").read_text()), sort_keys=True),
        "metrics": json.dumps(metrics, sort_keys=True),
        "scores": (path / "scores.csv").read_text(),
    }


def cache_entries(cache_dir: Path) -> dict:
    """Every cache entry parsed as a completion: a corrupt one fails here (and nothing in the
    cache is ever unpickled, as in hdeval itself)."""
    from hdeval.llm.backends.base import Completion
    from hdeval.llm.cache.codec import table_value
    from hdeval.llm.cache.guard import TABLE_DBNAME
    from hdeval.llm.cache.store import JSONDisk

    with diskcache.Cache(str(cache_dir), disk=JSONDisk) as c:
        found = {k: Completion.from_dict(json.loads(c[k])) for k in c.iterkeys()}
    if (Path(cache_dir) / TABLE_DBNAME).is_file():  # the reply table, read on its own
        con = sqlite3.connect(Path(cache_dir) / TABLE_DBNAME)
        try:
            for key, value in con.execute("SELECT key, value FROM reply"):
                found[key.hex()] = Completion.from_dict(json.loads(table_value(value)))
        finally:
            con.close()
    return found


@pytest.fixture
def fake_calls(monkeypatch) -> list[int]:
    """Counts LLM calls made by any FakeBackend in this process (CLI runs included)."""
    from hdeval.llm.backends.fake import FakeBackend

    calls: list[int] = []
    real = FakeBackend.complete

    def counting(self, request):
        calls.append(1)
        return real(self, request)

    monkeypatch.setattr(FakeBackend, "complete", counting)
    return calls
