"""prompts/ and tasks/ must be found from an installed wheel, not only from a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_carries_prompts_and_tasks_and_the_cli_finds_them(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(dist)],
                   cwd=REPO, check=True, capture_output=True)
    wheel = next(dist.glob("hdeval-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("prompts/score.toml", "prompts/decompose.toml", "tasks/summeval.toml", "tasks/sfhot.toml"):
        assert f"hdeval/_resources/{f}" in names
    # the reports' templates and style ship inside the package
    for f in ("base.html.j2", "macros.html.j2", "style.css", "hdeval.html.j2", "pairs.html.j2", "benchmark.html.j2"):
        assert f"hdeval/report/templates/{f}" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # Run from an unrelated directory with the unpacked wheel first on sys.path, as an
    # installed copy would be, so the checkout's top-level folders cannot be used.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import hdeval, hdeval.core.paths as p; "
        "assert hdeval.__file__.startswith(sys.argv[1]), hdeval.__file__; "
        "print(p.resource_dir('tasks')); "
        "from hdeval.report import render, banner; b = banner.Banner(); banner.llm_line(b, 'fake:v1'); "
        "page = render('benchmark.html.j2', title='t', banner=b, tables=[], figures=[], definitions={}); "
        "assert 'offline fake LLM' in page and 'font-family' in page, page[:200]; "
        "sys.argv = ['hdeval', 'tasks']; "
        "from hdeval.cli import main; main()"
    )
    # without the test session's request book, whose start-up hook would import the checkout's hdeval
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HDEVAL_TEST_BOOK_DIR")}
    out = subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path,
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert str(site / "hdeval" / "_resources" / "tasks") in out.stdout
    assert "summeval (pointwise):" in out.stdout and "informativeness [1-6]" in out.stdout
    assert "llmbar (pairwise):" in out.stdout
