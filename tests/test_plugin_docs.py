"""docs/plugins.md's toy method plug-in, read from the page itself, installed through an entry
point and run through train, apply, benchmark and report by the page's own commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def _install(site: Path) -> None:
    """The plug-in module as the page gives it, and the entry point the page declares, as pip
    would install them (a dist-info on a sys.path entry)."""
    (module,) = _blocks("python")
    (toml,) = _blocks("toml")
    name, target = re.search(r'^(\w+) = "([\w.:]+)"$', toml, re.M).groups()
    (site / f"{target.split(':')[0]}.py").write_text(module, encoding="utf-8")
    info = site / "hdeval_toycalib-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hdeval-toycalib\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hdeval.methods]\n{name} = {target}\n")


@pytest.mark.slow
def test_the_documented_plug_in_trains_applies_benchmarks_and_reports(tmp_path, data_dir):
    site, work = tmp_path / "site", tmp_path / "work"
    site.mkdir()
    work.mkdir()
    _install(site)
    rows = (data_dir / "summeval.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    (work / "new.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path]),
           "HDEVAL_CACHE_DIR": str(tmp_path / "cache"), "HDEVAL_DATA_DIR": str(data_dir),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    (commands,) = _blocks("sh")
    lines = [line for line in commands.splitlines() if line.strip()]
    assert [line.split()[1] for line in lines] == ["methods", "train", "apply", "benchmark", "report"]
    out = {}
    for line in lines:
        r = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "warning: method plug-in" not in r.stderr, f"{line}\n{r.stderr[-2000:]}"
        out[line.split()[1]] = r.stdout
    assert "toycalib (pointwise data)" in out["methods"] and "-O shrink=VALUE (default 0.0)" in out["methods"]
    manifest = json.loads((work / "artifacts" / "toy" / "manifest.json").read_text())
    assert manifest["method"] == "toycalib" and manifest["run"]["config"]["options"] == {"shrink": 0.1}
    assert set(manifest["state"]["lines"]) == {"coherence", "consistency", "fluency", "relevance"}
    scored = [json.loads(x) for x in (work / "artifacts" / "toy-scored.jsonl").read_text().splitlines()]
    assert len(scored) == 6 and all(1 <= v <= 5 for r in scored for v in r["scores"].values())
    results = json.loads((work / "artifacts" / "bench-toy" / "results.json").read_text())
    assert sorted(s["method"] for s in results["settings"]) == ["direct", "toycalib"]
    assert "toycalib: summeval" in (work / "artifacts" / "toy" / "report" / "report.html").read_text()


def test_a_tampered_state_of_the_documented_plug_in_is_one_line(tmp_path, monkeypatch):
    # the state is validated by the plug-in's pydantic model: an unknown or mistyped field is
    # refused in one line naming the manifest and the field
    _install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import hdeval_toycalib as toy

    from hdeval.artifact.directory import ArtifactReader
    from hdeval.core.errors import ArtifactError

    good = {"prompts": {"score": "ab"}, "lines": {"coherence": [0.5, 1.0]}}
    assert toy.ToyEvaluator.read_state(ArtifactReader(tmp_path, good, [])).lines == {"coherence": (0.5, 1.0)}
    for state, field in (({**good, "coef": 1}, "coef"), ({**good, "lines": {"coherence": ["x", 1]}},
                                                          "lines.coherence.0")):
        with pytest.raises(ArtifactError) as err:
            toy.ToyEvaluator.read_state(ArtifactReader(tmp_path, state, []))
        assert str(err.value).startswith(f"{tmp_path / 'manifest.json'}: state field {field!r}: ")
        assert "\n" not in str(err.value)
    sys.modules.pop("hdeval_toycalib", None)
