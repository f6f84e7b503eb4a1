"""`hdeval view` in a real browser (Selenium driving Debian's chromium), run as a subprocess as a
user runs it: the listing, a report, two artifacts compared. It also makes docs/labelling.md's
screenshot of the listing (HDEVAL_UPDATE_SCREENSHOTS=1 refreshes it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from browser import wait
from conftest import REPO, TOY_TASK, toy_rows, train_artifact, write_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture
def runs(tmp_path) -> Path:
    task = tmp_path / "toy.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp_path / "toy.jsonl", toy_rows())
    folder = tmp_path / "artifacts"
    folder.mkdir()
    for name, args in (("hd", ()), ("direct", ("--method", "direct"))):
        shutil.move(str(train_artifact(str(task), data, tmp_path / name, *args)), str(folder / f"toy-{name}"))
    return folder


def test_browse_open_a_report_and_compare_two(tmp_path, runs, servers, browsers):
    from selenium.webdriver.support.ui import Select

    command = "hdeval view artifacts"  # docs/labelling.md's and docs/cli.md's, as written
    for page in ("labelling.md", "cli.md"):
        assert f"```sh\n{command}\n```" in (REPO / "docs" / page).read_text(encoding="utf-8")
    assert runs == tmp_path / "artifacts"
    server = servers(tmp_path, [*command.split()[1:], "--port", "0"], "view.log")
    d = browsers()
    d.get(server.url)
    sections = wait(lambda: d.find_elements("css selector", "section.artifact"), what="the listing")
    assert [s.get_attribute("data-name") for s in sections] == ["toy-direct", "toy-hd"]
    assert all(s.find_elements("css selector", ".banner .headline") for s in sections)
    shot = tmp_path / "view.png"
    d.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    d.find_element("css selector", "a.open-report").click()
    wait(lambda: "hdeval report" in d.title, timeout=120, what="the report page")
    assert d.find_elements("css selector", "img")  # its plots, embedded
    d.back()

    wait(lambda: d.find_elements("css selector", "a.compare-from"), what="the listing again")[1].click()
    Select(wait(lambda: d.find_element("id", "pick-b"), what="the compare form")).select_by_value("toy-direct")
    d.find_element("css selector", "form.pick button").click()
    table = wait(lambda: d.find_element("id", "compare-table"), what="the comparison")
    assert "held-out spearman (average)" in table.text
    assert d.find_element("id", "side-a").get_attribute("innerText").startswith("toy-hd")
    assert d.find_element("id", "side-b").get_attribute("innerText").startswith("toy-direct")
    compare = tmp_path / "view-compare.png"
    d.save_screenshot(str(compare))
    if os.environ.get("HDEVAL_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(shot, REPO / "docs" / "images" / "view.png")
        shutil.copy(compare, REPO / "docs" / "images" / "view-compare.png")
