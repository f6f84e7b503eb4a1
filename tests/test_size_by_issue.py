"""benchmarks/size_by_issue.py measures git history: asked for a commit the history does not
hold, it refuses in one line (it printed a CalledProcessError traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the git history")


@pytest.mark.parametrize("flag", ["--end", "--base"])
def test_a_commit_not_in_the_history_is_one_line(flag):
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "size_by_issue.py"), flag, "no-such-ref",
                        "--sections", "commits"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"size_by_issue: {flag} no-such-ref: no such commit in {REPO}"], r.stderr
