"""mypy on hdeval/, held to a baseline that may only shrink.

The package predates the type checker: its known errors are counted per (file, error code) in
.ci/mypy-baseline.json. A run fails when any count grows or a new (file, code) appears, so new
code is checked strictly while the old errors are paid down; when counts fall, it says so and
`python .ci/typecheck.py --update` writes the smaller baseline.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".ci" / "mypy-baseline.json"
ERROR = re.compile(r"^(?P<file>[^:]+):\d+(?::\d+)?: error: .*\[(?P<code>[a-z0-9-]+)\]$")


def run_mypy() -> tuple[Counter, str]:
    proc = subprocess.run([sys.executable, "-m", "mypy", "hdeval"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (bad config, crash)
        sys.exit(f"typecheck: mypy failed to run:\n{proc.stdout}{proc.stderr}")
    counts: Counter = Counter()
    for line in proc.stdout.splitlines():
        m = ERROR.match(line)
        if m:
            counts[f"{m['file']}:{m['code']}"] += 1
    return counts, proc.stdout


def main() -> int:
    counts, output = run_mypy()
    if "--update" in sys.argv:
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n", encoding="utf-8")
        print(f"typecheck: baseline written, {sum(counts.values())} known errors")
        return 0
    baseline = Counter(json.loads(BASELINE.read_text(encoding="utf-8")))
    grown = {k: (baseline.get(k, 0), n) for k, n in counts.items() if n > baseline.get(k, 0)}
    if grown:
        print(output, end="")
        for key, (was, now) in sorted(grown.items()):
            print(f"typecheck: {key}: {now} error(s), the baseline allows {was}")
        return 1
    fewer = sum(baseline.values()) - sum(counts.values())
    note = f"; {fewer} fewer than the baseline: run python .ci/typecheck.py --update" if fewer > 0 else ""
    print(f"typecheck: {sum(counts.values())} known mypy error(s), none new{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
