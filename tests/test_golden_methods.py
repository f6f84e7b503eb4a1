"""Golden runs for every method and shape: a refactor must not change any artifact's text.

``test_golden.py`` pins HD-Eval's pointwise output; this file pins what every other method
writes (manifest, metrics, score table, tree, learned weights, prompts) after training with the
fake LLM on fixed slices of the shared data. Only fields that record when and with which
versions a run happened, and call/token usage, are left out; skops model files are binary and
not byte-stable, so the manifest's and metrics' description of the model stands for them.

A change that is meant to alter a method's output updates the digests in the same commit
(``HDEVAL_GOLDEN_UPDATE=1 pytest tests/test_golden_methods.py``) and says why.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from conftest import train_artifact

GOLDEN = Path(__file__).parent / "golden" / "methods.json"

# name: (task, data slice (first n rows, plus extra row ranges), extra train arguments)
CASES = {
    "direct-summeval": ("summeval", (60, None), ["--method", "direct"]),
    "direct-yesno-summeval": ("summeval", (60, None), ["--method", "direct-yesno"]),
    "paireval-summeval": ("summeval", (160, None), ["--method", "paireval"]),
    "hdeval-pairwise-scorer-summeval": ("summeval", (160, None),
                                        ["--method", "hdeval", "--scorer", "pairwise", "--layers", "1"]),
    "dna-faireval": ("faireval", (40, None), ["--method", "dna"]),
    "dna-direct-faireval": ("faireval", (40, None), ["--method", "dna", "--dna-mode", "direct"]),
    "hdeval-llmbar": ("llmbar", (40, (200, 220)), ["--method", "hdeval", "--layers", "2"]),
}

_VOLATILE_MANIFEST = ("created", "hdeval_version", "versions", "files")


def _view(art: Path, tmp: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in sorted(p for p in art.rglob("*") if p.is_file()):
        rel = f.relative_to(art).as_posix()
        if rel.endswith(".skops"):
            continue
        # the run's own temporary paths (data file, cache) differ from run to run
        text = f.read_text(encoding="utf-8").replace(str(tmp), "<tmp>")
        if rel == "manifest.json":
            m = json.loads(text)
            for k in _VOLATILE_MANIFEST:
                m.pop(k, None)
            text = json.dumps(m, sort_keys=True)
        elif rel == "metrics.json":
            m = json.loads(text)
            m.pop("usage", None)
            text = json.dumps(m, sort_keys=True)
        out[rel] = hashlib.sha256(text.encode()).hexdigest()
    return out


def _slice(src: Path, dst: Path, first: int, extra: tuple[int, int] | None) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()
    keep = lines[:first] + (lines[extra[0]:extra[1]] if extra else [])
    dst.write_text("\n".join(keep) + "\n", encoding="utf-8")
    return dst


@pytest.mark.parametrize("name", sorted(CASES))
def test_method_output_is_unchanged(name, data_dir, tmp_path):
    task, (first, extra), args = CASES[name]
    data = _slice(data_dir / f"{task}.jsonl", tmp_path / "data.jsonl", first, extra)
    got = _view(train_artifact(task, data, tmp_path, *args), tmp_path)
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    if os.environ.get("HDEVAL_GOLDEN_UPDATE"):
        recorded[name] = got
        GOLDEN.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        return
    assert name in recorded, f"no golden digests for {name}: run with HDEVAL_GOLDEN_UPDATE=1"
    assert got == recorded[name]
