"""conftest's no_leaked_resources fails a test that leaves a file or socket to be freed
unclosed, whether the garbage collector frees it or the test's own locals do as it returns
(that one passed: its ResourceWarning came before the fixture looked, and is ignored by
default)."""

from __future__ import annotations

from conftest import REPO

pytest_plugins = ["pytester"]

PROBE = '''
import pytest
pytestmark = pytest.mark.usefixtures("no_leaked_resources")

def test_leaves_a_local_file_open(tmp_path):
    (tmp_path / "f").write_text("x")
    f = open(tmp_path / "f")
    assert f.read() == "x"

def test_leaves_a_file_in_a_cycle_open(tmp_path):
    (tmp_path / "f").write_text("x")
    class Holder: pass
    h = Holder(); h.f = open(tmp_path / "f"); h.me = h

def test_closes_its_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with open(tmp_path / "f") as f:
        assert f.read() == "x"
'''


def test_the_guard_fails_each_leak_and_only_them(pytester):
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaves_a_local_file_open*",
                                 "*left open for the garbage collector*",
                                 "*ERROR at teardown of test_leaves_a_file_in_a_cycle_open*"])
