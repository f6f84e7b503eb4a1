"""What the browser tests share (their fixtures, ``browsers`` and ``servers``, are conftest's):
Selenium driving Debian's chromium through /usr/bin/chromedriver, and an ``hdeval`` command
serving a page, run as a subprocess as a user runs it."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def need_browser() -> None:
    pytest.importorskip("selenium", reason="needs selenium (pip install -e '.[test]')")
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")


def new_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,900", "--proxy-server=direct://", "--proxy-bypass-list=*"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(30)
    return d


class CliServer:
    """``hdeval ARGV`` serving a page in a subprocess (cwd ``tmp_path``, stderr in ``log``);
    ``url`` as it printed it, ``base`` without its query. Started when the page answers."""

    def __init__(self, tmp_path: Path, argv: list[str], log: str = "server.log") -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.log_path = tmp_path / log
        self.log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "hdeval.cli", *argv],
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=tmp_path)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            self.url = lines.get(timeout=60).decode().strip()
        except queue.Empty:
            self.stop()
            raise AssertionError(f"hdeval {argv[0]} printed no URL in 60 s") from None
        assert self.url.startswith("http://"), (self.url, self.log_path.read_text())
        self.base = self.url.split("?")[0].rstrip("/")
        for _ in range(200):
            try:
                urllib.request.urlopen(self.base + "/static/app.css", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # it answers (a refusal without the token counts)
            except OSError:
                time.sleep(0.05)

    def get_json(self, path: str, token: str | None = None) -> dict:
        req = urllib.request.Request(self.base + path, headers={"Cookie": f"hdeval_token={token}"} if token else {})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


def wait(cond, timeout=60.0, what="condition"):
    try:
        from selenium.common.exceptions import WebDriverException  # stale or missing elements among them

        replaced: tuple = (WebDriverException,)
    except ImportError:  # the browserless tests run without selenium
        replaced = ()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = cond()
        except replaced:
            value = None  # the page was replaced meanwhile (the next sample): ask again
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
