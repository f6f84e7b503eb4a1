"""`hdeval data download / list / import`, against a file server on 127.0.0.1 only.

The upstream samples (first records of UniEval's files) and the shared JSONL files are read
from $HDEVAL_DATA_DIR (CI sets it to ../shared/data); tests needing them skip without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hdeval.cli.data import data
from hdeval.core.errors import DataError
from hdeval.core.paths import user_data_dir
from hdeval.data import datasets
from hdeval.data.datasets import DATASETS, DownloadError
from hdeval.data.samples import read_samples
from hdeval.data.tasks import load_task

try:
    from http_files import FileServer, files_under
except ImportError:  # tests/ became a package
    from tests.http_files import FileServer, files_under

# Read once at import: the fixtures below clear HDEVAL_DATA_DIR so that the code under test
# searches only tmp_path.
_SHARED_ENV = os.environ.get("HDEVAL_DATA_DIR")
SHARED = Path(_SHARED_ENV).resolve() if _SHARED_ENV else None
UPSTREAM = SHARED / "upstream-samples" if SHARED else None
needs_shared = pytest.mark.skipif(
    UPSTREAM is None or not UPSTREAM.is_dir(),
    reason="HDEVAL_DATA_DIR is not set to the shared data folder (with upstream-samples/); "
    "CI sets it to ../shared/data",
)

PREFIX = "/mirror/reproduce/data"
LAYOUT = {ds.path: Path(ds.path).name for ds in DATASETS.values()}
TEXT_FIELDS = ("source", "context", "output", "reference")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HDEVAL_DATA_DIR", raising=False)
    monkeypatch.delenv(datasets.SOURCE_URL_ENV, raising=False)
    # A proxy from the developer's environment must not see (or break) 127.0.0.1 traffic.
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def server():
    with FileServer(files_under(UPSTREAM, LAYOUT, PREFIX)) as srv:
        yield srv


def base_url(srv: FileServer) -> str:
    return srv.url + PREFIX + "/"


def shared_rows(name: str) -> dict[str, dict]:
    with (SHARED / f"{name}.jsonl").open(encoding="utf-8") as fh:
        return {r["id"]: r for r in map(json.loads, fh)}


def assert_match_shared(name: str, rows: list[dict]) -> None:
    """Converted rows equal the shared rows with the same id in every field UniEval carries."""
    ref = shared_rows(name)
    upstream = json.loads((UPSTREAM / LAYOUT[DATASETS[name].path]).read_text(encoding="utf-8"))
    assert len(rows) == len(upstream)
    for row in rows:
        assert row["id"] in ref, f"{row['id']} is not an id of the shared {name}.jsonl"
        want = ref[row["id"]]
        for key in (*TEXT_FIELDS, "doc_id", "scores", "task"):
            assert row[key] == want[key], (row["id"], key)
        # Labels UniEval does not carry stay empty rather than invented.
        assert row["system"] == (want["system"] if name in ("summeval", "topical_chat") else None)
        assert row["annotations"] is None
        assert "meta" not in row
    # The samples are the first records upstream, so they are the first rows of the shared
    # file in the same order: ids and doc_ids are assigned positionally the same way.
    assert [r["id"] for r in rows] == list(ref)[: len(rows)]


# --------------------------------------------------------------------------- conversion


@needs_shared
@pytest.mark.parametrize("name", list(DATASETS))
def test_conversion_of_upstream_samples_matches_shared_rows(name: str, tmp_path: Path) -> None:
    records = json.loads((UPSTREAM / LAYOUT[DATASETS[name].path]).read_text(encoding="utf-8"))
    rows = datasets.convert_records(name, records)
    assert_match_shared(name, rows)
    out = tmp_path / f"{name}.jsonl"
    assert datasets.write_samples(out, rows, load_task(name)) == len(rows)


def unieval_layout(name: str, rows: list[dict]) -> list[dict]:
    """The inverse of the conversion: shared rows back in UniEval's record layout."""
    out = []
    for i, r in enumerate(rows):
        scores = dict(r["scores"])
        rec: dict = {"source": r["source"], "system_output": r["output"]}
        if name == "summeval":
            scores["overall"] = sum(scores.values()) / len(scores)
            rec.update(doc_id=r["doc_id"], system_id=r["system"], reference=r["reference"])
        elif name == "topical_chat":
            rec.update(context=r["context"], system_id=r["system"])
        else:
            scores["overall"] = scores.pop("quality")
            rec.update(doc_id=i, reference=r["reference"])
        rec["scores"] = scores
        out.append(rec)
    return out


@needs_shared
def test_full_size_files_pass_the_official_row_counts(tmp_path: Path) -> None:
    """Full-size files rebuilt in UniEval's layout from the shared data: the strict count
    check (the official source's default) passes, and the positional id/doc_id schemes
    reproduce every id and doc_id of the shared files, not just of the first records."""
    files = {}
    for name, ds in DATASETS.items():
        rows = list(shared_rows(name).values())
        files[f"/{ds.path}"] = json.dumps(unieval_layout(name, rows)).encode("utf-8")
    with FileServer(files) as srv:
        results = datasets.download_datasets(dest=tmp_path, source_url=srv.url, strict_count=True)
    for r in results:
        assert r.rows == DATASETS[r.dataset].official_rows and r.warning is None
        ref = list(shared_rows(r.dataset).values())
        got = [json.loads(line) for line in r.path.read_text(encoding="utf-8").splitlines()]
        assert [(g["id"], g["doc_id"]) for g in got] == [(w["id"], w["doc_id"]) for w in ref]
        assert all(g["scores"] == w["scores"] for g, w in zip(got, ref))


@needs_shared
def test_conversion_renames_and_drops_overall() -> None:
    se = json.loads((UPSTREAM / "summeval.json").read_text(encoding="utf-8"))
    assert "overall" in se[0]["scores"]
    rows = datasets.convert_records("summeval", se)
    assert set(rows[0]["scores"]) == {"coherence", "consistency", "fluency", "relevance"}
    sf = json.loads((UPSTREAM / "sfres.json").read_text(encoding="utf-8"))
    rows = datasets.convert_records("sfres", sf)
    assert rows[0]["scores"]["quality"] == sf[0]["scores"]["overall"]
    assert "overall" not in rows[0]["scores"]


def test_conversion_accepts_json_encoded_scores_and_rejects_bad_records() -> None:
    rec = {
        "source": "hi \n",
        "context": "fact",
        "system_id": "Argmax Decoding",
        "system_output": "hello ",
        "scores": json.dumps(
            {"understandability": 1, "naturalness": 2, "coherence": 2, "engagingness": 1,
             "groundedness": 0, "overall": 3}
        ),
    }
    (row,) = datasets.convert_records("topical_chat", [rec])
    assert row["id"] == "topical_chat-00-argmax_decoding"
    assert row["source"] == "hi" and row["output"] == "hello"
    assert row["scores"]["overall"] == 3.0
    with pytest.raises(DataError, match=r"record 1: field 'system_output'"):
        datasets.convert_records("topical_chat", [{**rec, "system_output": "  "}])
    with pytest.raises(DataError, match=r"no score for aspect\(s\) coherence, engagingness, groundedness, overall"):
        datasets.convert_records(
            "topical_chat", [{**rec, "scores": {k: 1 for k in ("understandability", "naturalness")}}]
        )


# --------------------------------------------------------------------------- download


@needs_shared
def test_download_converts_all_four_into_user_data_dir(server: FileServer) -> None:
    events = []
    results = datasets.download_datasets(source_url=base_url(server), progress=events.append)
    dest = user_data_dir()
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"{n}.jsonl" for n in DATASETS)
    for r in results:
        assert r.downloaded and r.path == dest / f"{r.dataset}.jsonl"
        task = load_task(r.dataset)
        assert len(read_samples(r.path, task)) == r.rows
        rows = [json.loads(line) for line in r.path.read_text(encoding="utf-8").splitlines()]
        assert_match_shared(r.dataset, rows)
        # A mirror with fewer rows than UniEval is accepted, but not silently.
        assert r.warning and str(DATASETS[r.dataset].official_rows) in r.warning
    assert sorted(server.requests) == sorted(f"{PREFIX}/{p}" for p in LAYOUT)
    kinds = [e.kind for e in events]
    assert kinds.count("start") == 4 and kinds.count("done") == 4 and "bytes" in kinds


@needs_shared
def test_strict_count_rejects_a_different_row_count_and_writes_nothing(
    server: FileServer, tmp_path: Path
) -> None:
    # strict_count=True is what the official source gets by default; same code path.
    dest = tmp_path / "d"
    with pytest.raises(DataError, match=r"has 25 rows; the official UniEval file has 1181"):
        datasets.download_datasets(["sfres"], dest=dest, source_url=base_url(server), strict_count=True)
    assert not dest.exists()  # the folder it made is gone again: nothing was written


@needs_shared
def test_a_file_url_is_read_from_this_machine(tmp_path: Path) -> None:
    # --help and train's "no data" error advise file://; httpx refused it ("missing an 'http://'")
    mirror = tmp_path / "mirror"
    for path, name in LAYOUT.items():  # UniEval's layout, from the shared upstream samples
        (mirror / path).parent.mkdir(parents=True, exist_ok=True)
        (mirror / path).write_bytes((UPSTREAM / name).read_bytes())
    (r,) = datasets.download_datasets(["sfres"], dest=tmp_path / "d", source_url=mirror.as_uri() + "/")
    assert r.downloaded and r.rows == 25 and r.path == tmp_path / "d" / "sfres.jsonl"
    with pytest.raises(DownloadError, match=r"sfres.json: not found; check --source-url"):
        datasets.download_datasets(["sfres"], dest=tmp_path / "e" / "f", source_url=(tmp_path / "no").as_uri() + "/")
    assert not (tmp_path / "e").exists()


def test_official_source_is_strict_by_default() -> None:
    assert datasets.is_official_source(datasets.DEFAULT_SOURCE_URL)
    assert datasets.is_official_source(datasets.DEFAULT_SOURCE_URL.rstrip("/"))
    assert not datasets.is_official_source("http://127.0.0.1:1/mirror/")


@needs_shared
def test_second_run_fetches_nothing(server: FileServer) -> None:
    first = datasets.download_datasets(source_url=base_url(server))
    mtimes = {r.path: r.path.stat().st_mtime_ns for r in first}
    server.requests.clear()
    second = datasets.download_datasets(source_url=base_url(server))
    assert server.requests == []
    assert [r.downloaded for r in second] == [False] * 4
    assert {r.path: r.path.stat().st_mtime_ns for r in second} == mtimes
    # --force fetches again.
    datasets.download_datasets(["sfhot"], source_url=base_url(server), force=True)
    assert server.requests == [f"{PREFIX}/data2text/sfhot.json"]


@needs_shared
def test_invalid_present_file_is_replaced(server: FileServer) -> None:
    dest = user_data_dir()
    dest.mkdir(parents=True)
    (dest / "sfhot.jsonl").write_text('{"id": "x"}\n', encoding="utf-8")
    (r,) = datasets.download_datasets(["sfhot"], source_url=base_url(server))
    assert r.downloaded and r.rows == 25


@needs_shared
def test_interrupted_download_leaves_no_file(tmp_path: Path) -> None:
    files = files_under(UPSTREAM, LAYOUT, PREFIX)
    cut = f"{PREFIX}/data2text/sfres.json"
    dest = tmp_path / "d"
    with FileServer(files, truncate={cut}) as srv:
        with pytest.raises(DownloadError, match=r"connection closed after \d+ of \d+ bytes") as exc:
            datasets.download_datasets(["sfres"], dest=dest, source_url=base_url(srv))
        assert srv.url + cut in str(exc.value)
    assert not dest.exists()  # no file, and not the folder it made for one


@needs_shared
def test_interrupted_download_keeps_the_previous_good_file(tmp_path: Path) -> None:
    files = files_under(UPSTREAM, LAYOUT, PREFIX)
    with FileServer(files) as srv:
        (good,) = datasets.download_datasets(["sfres"], dest=tmp_path, source_url=base_url(srv))
    before = good.path.read_bytes()
    with FileServer(files, truncate={f"{PREFIX}/data2text/sfres.json"}) as srv:
        with pytest.raises(DownloadError):
            datasets.download_datasets(["sfres"], dest=tmp_path, source_url=base_url(srv), force=True)
    assert good.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sfres.jsonl"]


def test_404_names_the_url(tmp_path: Path) -> None:
    with FileServer({}) as srv:
        url = f"{srv.url}/nowhere/dialogue/topical_chat.json"
        with pytest.raises(DownloadError, match="HTTP 404") as exc:
            datasets.download_datasets(["topical_chat"], dest=tmp_path / "d", source_url=srv.url + "/nowhere")
    assert url in str(exc.value)
    assert not (tmp_path / "d" / "topical_chat.jsonl").exists()


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    with FileServer({}) as srv:
        base = srv.url + "/"
    # The server is closed now: nothing listens on that port.
    with pytest.raises(DownloadError, match=r"cannot reach http://127\.0\.0\.1:\d+/data2text/sfhot\.json"):
        datasets.download_datasets(["sfhot"], dest=tmp_path, source_url=base, timeout=5)


def test_not_json_is_a_clear_error(tmp_path: Path) -> None:
    with FileServer({"/data2text/sfhot.json": b"<html>rate limited</html>"}) as srv:
        with pytest.raises(DataError, match=r"sfhot\.json: not a valid JSON file"):
            datasets.download_datasets(["sfhot"], dest=tmp_path, source_url=srv.url)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- CLI: download, list


@needs_shared
def test_cli_download_and_list(server: FileServer, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.setenv(datasets.SOURCE_URL_ENV, base_url(server))
    res = runner.invoke(data, ["download", "sfres", "topical_chat"])
    assert res.exit_code == 0, res.output
    assert "sfres: 25 rows, downloaded" in res.stdout
    assert "topical_chat: 25 rows, downloaded" in res.stdout
    assert f"sfres: downloading {base_url(server)}data2text/sfres.json" in res.stderr
    assert "warning: sfres:" in res.stderr and "1181" in res.stderr

    res = runner.invoke(data, ["download", "sfres"])
    assert res.exit_code == 0 and "sfres: 25 rows, already present" in res.stdout

    res = runner.invoke(data, ["list"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "sfres: aspects informativeness, naturalness, quality; official rows 1181" in out
    assert f"* {user_data_dir() / 'sfres.jsonl'}  (present, 25 rows)" in out
    assert f"{user_data_dir() / 'summeval.jsonl'}  (missing)" in out
    assert "run `hdeval data download summeval`" in out
    assert "topical_chat: aspects naturalness, coherence, engagingness, groundedness, understandability, overall" in out


@needs_shared
def test_cli_list_shows_hdeval_data_dir_first_and_broken_files(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sfhot.jsonl").write_text("not json\n", encoding="utf-8")
    monkeypatch.setenv("HDEVAL_DATA_DIR", str(other))
    runner = CliRunner()
    res = runner.invoke(data, ["download", "sfhot", "--source-url", base_url(server)])
    assert res.exit_code == 0, res.output
    assert f"note: train will read {other / 'sfhot.jsonl'}" in res.stderr
    res = runner.invoke(data, ["list"])
    lines = res.stdout.splitlines()
    i = lines.index("sfhot: aspects informativeness, naturalness, quality; official rows 875")
    assert lines[i + 1].startswith(f"  * {other / 'sfhot.jsonl'}  (present, does not load:")
    assert "line 1: not valid JSON" in lines[i + 1]
    assert lines[i + 2] == f"    {user_data_dir() / 'sfhot.jsonl'}  (present, 25 rows)"


@needs_shared
def test_cli_download_dest_outside_search_path(server: FileServer, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        data, ["download", "sfhot", "--source-url", base_url(server), "--dest", str(tmp_path / "x")]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "x" / "sfhot.jsonl").is_file()
    assert f"set HDEVAL_DATA_DIR={tmp_path / 'x'}" in res.stderr


def test_cli_download_404_exit_code_and_message(tmp_path: Path) -> None:
    with FileServer({}) as srv:
        res = CliRunner().invoke(
            data, ["download", "sfres", "--source-url", srv.url + "/m/", "--dest", str(tmp_path)]
        )
    assert res.exit_code == DownloadError.exit_code
    last = res.stderr.splitlines()[-1]
    assert last.startswith(f"error: {srv.url}/m/data2text/sfres.json: not found (HTTP 404)")
    assert list(tmp_path.iterdir()) == []


@needs_shared
def test_cli_download_strict_count_option(server: FileServer, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        data,
        ["download", "sfhot", "--source-url", base_url(server), "--dest", str(tmp_path), "--strict-count"],
    )
    assert res.exit_code == DataError.exit_code
    assert "has 25 rows; the official UniEval file has 875" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_cli_download_unknown_task() -> None:
    res = CliRunner().invoke(data, ["download", "nope"])
    assert res.exit_code == 2 and "nope" in res.output


# --------------------------------------------------------------------------- import

GOOD_CSV = """\
article,summary,coh,consistency,fluency,relevance,model
"The cat sat on the mat. It was warm.",A cat sat.,4,5,5,3,m1
"The cat sat on the mat. It was warm.","A warm cat, on a mat.",3.5,4,5,4,m2
"Stocks fell on Monday.",Stocks fell.,5,5,4,5,m1
"""


def run_import(tmp_path: Path, name: str, text: str, *args: str) -> tuple:
    src = tmp_path / name
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(data, ["import", str(src), "--task", "summeval", "-o", str(out), *args])
    return res, out


MAP = ["--source-col", "article", "--output-col", "summary", "--score-col", "coherence=coh", "--system-col", "model"]


def test_import_good_csv_loads(tmp_path: Path) -> None:
    res, out = run_import(tmp_path, "in.csv", GOOD_CSV, *MAP)
    assert res.exit_code == 0, res.output
    assert "imported 3 rows (2 doc_ids) for task summeval" in res.stdout
    samples = read_samples(out, load_task("summeval"))
    assert len({s.id for s in samples}) == 3 and all(s.id.startswith("summeval-") for s in samples)
    assert samples[1].scores["coherence"] == 3.5
    assert samples[1].fields["output"] == "A warm cat, on a mat."
    assert samples[0].doc_id == samples[1].doc_id != samples[2].doc_id
    assert samples[0].system == "m1"


def test_import_missing_column_names_column_and_file(tmp_path: Path) -> None:
    res, out = run_import(tmp_path, "in.csv", GOOD_CSV, *MAP[:4])  # no coherence mapping
    assert res.exit_code == 2
    assert "no column 'coherence'" in res.stderr and str(tmp_path / "in.csv") in res.stderr
    assert "--score-col coherence=COLUMN" in res.stderr
    assert not out.exists()
    res, out = run_import(tmp_path, "in.csv", GOOD_CSV, *MAP, "--doc-col", "doc")
    assert res.exit_code == 2
    assert "no column 'doc' (given by --doc-col)" in res.stderr and "in.csv" in res.stderr
    assert not out.exists()


def test_import_non_numeric_score_names_row_and_column(tmp_path: Path) -> None:
    bad = GOOD_CSV.replace(",3.5,", ",high,")
    res, out = run_import(tmp_path, "in.csv", bad, *MAP)
    assert res.exit_code == 2
    assert "row 2 (line 3): column 'coh' (aspect coherence): 'high' is not a number" in res.stderr
    assert res.stderr.startswith("error: ")
    assert not out.exists()


def test_import_empty_text_names_row(tmp_path: Path) -> None:
    bad = GOOD_CSV.replace("Stocks fell.,", ",")
    res, out = run_import(tmp_path, "in.csv", bad, *MAP)
    assert res.exit_code == 2
    assert "row 3 (line 4): empty text in column 'summary' (output)" in res.stderr
    assert not out.exists()


def test_import_score_out_of_range_names_row_and_range(tmp_path: Path) -> None:
    bad = GOOD_CSV.replace(",5,5,4,5,m1", ",5,5,4,7,m1")
    res, out = run_import(tmp_path, "in.csv", bad, *MAP)
    assert res.exit_code == 2
    assert "scores in column 'relevance' range 3-7; the task says [1, 5] for relevance (1 outside it: row 3)" \
        in res.stderr
    assert not out.exists()


def test_import_reports_all_problems_at_once(tmp_path: Path) -> None:
    bad = GOOD_CSV.replace(",3.5,", ",x,").replace("Stocks fell.,", ",")
    res, _ = run_import(tmp_path, "in.csv", bad, *MAP)
    assert "2 problem(s)" in res.stderr and "row 2" in res.stderr and "row 3" in res.stderr


def test_import_jsonl_in_our_schema_needs_no_options(tmp_path: Path) -> None:
    rows = [
        {"id": f"a{i}", "source": "doc text", "output": f"summary {i}", "doc_id": "d1",
         "scores": {"coherence": 1, "consistency": 2, "fluency": 3, "relevance": 4}}
        for i in range(3)
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    res, out = run_import(tmp_path, "in.jsonl", text)
    assert res.exit_code == 0, res.output
    samples = read_samples(out, load_task("summeval"))
    assert [s.id for s in samples] == ["a0", "a1", "a2"]
    assert {s.doc_id for s in samples} == {"d1"}
    assert samples[2].scores == {"coherence": 1.0, "consistency": 2.0, "fluency": 3.0, "relevance": 4.0}


def test_import_jsonl_errors_have_line_numbers(tmp_path: Path) -> None:
    good = {"source": "s", "output": "o", "coherence": 1, "consistency": 1, "fluency": 1, "relevance": 1}
    text = json.dumps(good) + "\n\n" + json.dumps({**good, "fluency": "n/a"}) + "\n"
    res, out = run_import(tmp_path, "in.jsonl", text)
    assert res.exit_code == 2
    assert "row 2 (line 3): column 'fluency' (aspect fluency): 'n/a' is not a number" in res.stderr
    assert not out.exists()


@pytest.mark.parametrize("name,text,where", [
    ("deep.jsonl", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "line 1: not usable JSON (nested too deeply)"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "not usable JSON (nested too deeply)"),
    ("big.jsonl", '{"output": "o", "fluency": ' + "9" * 5000 + "}\n", "line 1: not usable JSON (Exceeds"),
])
def test_import_of_json_python_cannot_hold_is_one_line(tmp_path: Path, name: str, text: str, where: str) -> None:
    res, out = run_import(tmp_path, name, text)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"{name}: {where}" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_import_json_list_with_task_file_and_unscored(tmp_path: Path) -> None:
    task_file = tmp_path / "mytask.toml"
    task_file.write_text(
        'name = "mytask"\ndescription = "Answers."\n'
        '[[fields]]\nkey = "output"\nlabel = "Answer"\n'
        '[[aspects]]\nkey = "helpful"\ndefinition = "Helps."\nrange = [0, 10]\n',
        encoding="utf-8",
    )
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"answer": "yes", "h": 7, "q": 1}, {"answer": "no", "h": 2, "q": 2}]))
    out = tmp_path / "o.jsonl"
    args = ["import", str(src), "--task", str(task_file), "-o", str(out), "--output-col", "answer"]
    res = CliRunner().invoke(data, [*args, "--score-col", "helpful=h", "--id-col", "q"])
    assert res.exit_code == 0, res.output
    task = load_task(task_file)
    samples = read_samples(out, task)
    assert [(s.id, s.doc_id, s.scores["helpful"]) for s in samples] == [("1", "1", 7.0), ("2", "2", 2.0)]
    res = CliRunner().invoke(data, [*args, "--unscored", "--force"])
    assert res.exit_code == 0, res.output
    samples = read_samples(out, task, require_scores=False)
    # ids from the texts: "mytask-" and 12 hex digits, one per distinct row
    assert [len(s.id) for s in samples] == [19, 19] and samples[0].id != samples[1].id
    assert all(s.id.startswith("mytask-") for s in samples) and samples[0].scores == {}


def test_import_bad_score_option_and_unknown_task(tmp_path: Path) -> None:
    res, _ = run_import(tmp_path, "in.csv", GOOD_CSV, "--score-col", "coh")
    assert res.exit_code == 2 and "expected ASPECT=COLUMN" in res.stderr
    res, _ = run_import(tmp_path, "in.csv", GOOD_CSV, "--score-col", "style=coh")
    assert res.exit_code == 2 and "has no aspect 'style'" in res.stderr
    res = CliRunner().invoke(data, ["import", str(tmp_path / "in.csv"), "--task", "nope", "-o", "o.jsonl"])
    assert res.exit_code == 2 and "unknown task 'nope'" in res.stderr


def test_import_duplicate_ids_and_ragged_rows(tmp_path: Path) -> None:
    csv_text = "id,source,output,coherence,consistency,fluency,relevance\n" \
               "a,s,o,1,1,1,1\n" \
               "a,s,o2,1,1,1,1\n"
    res, _ = run_import(tmp_path, "in.csv", csv_text)
    assert res.exit_code == 2 and "row 2 (line 3): id 'a' already used in row 1" in res.stderr
    res, _ = run_import(tmp_path, "in.csv", csv_text.replace("o2,1,1,1,1", "o2,1,1,1"))
    assert res.exit_code == 2 and "row 2 (line 3) has 6 cells, the header has 7" in res.stderr


# --------------------------------------------------------------------------- end to end


@needs_shared
@pytest.mark.parametrize("name", list(DATASETS))
def test_downloaded_files_train_end_to_end(name: str, server: FileServer, tmp_path: Path) -> None:
    from hdeval.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["data", "download", name, "--source-url", base_url(server)])
    assert res.exit_code == 0, res.output
    art = tmp_path / "art"
    res = runner.invoke(
        cli,
        ["train", "--task", name, "--llm", "fake", "--layers", "2", "--children", "2",
         "--aggregator", "lr", "--concurrency", "1", "-q", "-o", str(art)],
    )
    assert res.exit_code == 0, res.output
    assert "held-out Spearman: trained" in res.stdout and art.is_dir()


@pytest.mark.parametrize("name", ["x.parquet", "x.csv", "-"])
def test_import_refuses_an_output_that_is_not_a_jsonl_file(tmp_path: Path, monkeypatch, name: str) -> None:
    # it wrote JSONL under any name: train then read x.parquet as parquet ("magic bytes not
    # found"), and '-o -' left a file named '-'
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.csv"
    src.write_text("article,summary,coh\nA text.,A summary.,3\n", encoding="utf-8")
    res = CliRunner().invoke(data, ["import", str(src), "--task", "summeval", "-o", name, "--source-col", "article",
                                    "--output-col", "summary", "--score-col", "coherence=coh"])
    assert res.exit_code == 2 and ("writes JSONL" in res.output or "writes a file" in res.output), res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]
