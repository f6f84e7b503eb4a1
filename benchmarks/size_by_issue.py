"""How many lines of the package the features that existed at b877c61 take now (issue #19's size item).

Issue #19's last "Done means" item: "The package has fewer lines than today's 17,050 for the same
features." Issues #20-#23 added features after b877c61, so the package's raw size says nothing
about that item. This script measures it from git history, read-only:

- **commit method** (the headline): 17,050 plus the net line change of every commit that did not
  add a feature of issues 20-23 (class 19 or fix), plus the merge remainder (growth that no
  non-merge commit accounts for, i.e. merge resolutions), charged to #19;
- **judgement-call bounds**: the estimate with every ambiguous commit of |delta| >= 30 flipped to
  its alternative class;
- **modules new since base**: their lines by group (feature-only, mixed, #19 splits and seams);
- **blame** at ``--end``: each line charged to the class of the commit that last wrote it,
  with and without ``-M -C``;
- **statements**: the commit method again in Python logical lines (tokenize NEWLINE tokens),
  which re-wrapping, docstrings and comments do not change.

The hand-made inputs sit next to this script: ``size_by_issue.tsv`` (one class per commit in
base..end, with the judgement notes) and ``size_by_issue_modules.tsv`` (what each new module is
for). The script refuses to run while a commit in base..end has no class: to extend the figures
past 5d33523, classify the new commits first. See size_by_issue.md for the method and its limits.

    python benchmarks/size_by_issue.py                  # the published figures: b877c61..5d33523
    python benchmarks/size_by_issue.py --sections commits,statements
    python benchmarks/size_by_issue.py --end main       # after classifying main's newer commits

Needs the full history from base to end (a shallow clone will not do). About 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve().parent
CLASSES = HERE / "size_by_issue.tsv"
MODULES = HERE / "size_by_issue_modules.tsv"
SPEC = "hdeval/*.py"  # a git pathspec: '*' crosses '/', so this is every .py under hdeval/
FEATURES = ("20", "21", "22", "23")
HOUSE = ("19", "fix")  # the classes whose lines count for "the same features"
CLASS_ORDER = ("19", "fix", *FEATURES)
JUDGEMENT_MIN = 30  # judgement calls at least this large move the bounds; smaller ones are listed
SECTIONS = ("commits", "modules", "blame", "statements")

# Modules whose only job was a 20-23 feature but which no longer exist at 5d33523 (moved into
# cache/guard.py by 0cfb4ac and paireval/sources.py by 2d0beb1); the modules section counts #19
# cuts in them as well.
GONE_FEATURE_MODULES = {"hdeval/cache_guard.py", "hdeval/methods/paireval/all_vs_all.py"}
# Commits that create or delete feature-only modules by moving code: their per-file deltas are
# moves, not cuts of feature code, so the modules section leaves them out.
MOVES = {"ec72fa5", "0cfb4ac", "1227820", "2d0beb1", "fbd0a0d", "bfbbd57", "15c0313", "277d991"}


def refuse(message: str) -> NoReturn:
    """One line on stderr and exit 2: the inputs do not cover what was asked."""
    print(f"size_by_issue: {message}", file=sys.stderr)
    raise SystemExit(2)


class Git:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self._cat: subprocess.Popen | None = None
        self._statements: dict[str, int] = {}

    def __call__(self, *args: str) -> str:
        return subprocess.check_output(["git", "-C", str(self.repo), *args], text=True, errors="replace")

    def size(self, rev: str) -> int:
        """Lines of every .py under hdeval/ at rev (git grep -c '' counts as wc -l does here)."""
        out = self("grep", "-c", "", rev, "--", SPEC)
        return sum(int(line.rsplit(":", 1)[1]) for line in out.splitlines())

    def net(self, rng: str) -> int:
        """Sum of the non-merge commits' net line deltas in SPEC over a revision range."""
        total = 0
        log = self("log", "--no-merges", "--no-renames", "--numstat", "--format=", rng, "--", SPEC)
        for line in log.splitlines():
            added, removed = (line.split("\t") + ["", ""])[:2]
            if added.isdigit():
                total += int(added) - int(removed)
        return total

    def pyfiles(self, rev: str) -> set[str]:
        return {p for p in self("ls-tree", "-r", "--name-only", rev, "hdeval").split() if p.endswith(".py")}

    def statements(self, rev: str, path: str) -> int:
        """Python logical lines of path at rev; 0 if the file does not exist there."""
        key = f"{rev}:{path}"
        if key not in self._statements:
            self._statements[key] = self._count_statements(key)
        return self._statements[key]

    def _count_statements(self, key: str) -> int:
        # one long-lived cat-file process: thousands of blobs, a subprocess each would take minutes
        if self._cat is None:
            self._cat = subprocess.Popen(["git", "-C", str(self.repo), "cat-file", "--batch"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._cat.stdin is not None and self._cat.stdout is not None
        self._cat.stdin.write(key.encode() + b"\n")
        self._cat.stdin.flush()
        head = self._cat.stdout.readline().split()
        if head[-1] == b"missing":
            return 0
        data = self._cat.stdout.read(int(head[2]))
        self._cat.stdout.read(1)  # the newline after each blob
        try:
            return sum(t.type == tokenize.NEWLINE for t in tokenize.tokenize(io.BytesIO(data).readline))
        except (tokenize.TokenError, SyntaxError):  # not expected at any commit; keeps going
            return data.count(b"\n")


class History:
    """The non-merge commits of base..end, their deltas in the package and their hand classes."""

    def __init__(self, git: Git, base: str, end: str, classes_path: Path) -> None:
        self.base, self.end = base, end
        self.order: list[str] = []  # short hashes (7 hex), oldest first
        self.full: dict[str, str] = {}
        self.subject: dict[str, str] = {}
        rng = f"{base}..{end}"
        for line in git("log", "--no-merges", "--reverse", "--format=%H\t%s", rng).splitlines():
            full, subject = line.split("\t", 1)
            # 7 hex, not %h: a clone with more objects may abbreviate longer than the TSV does
            self.order.append(full[:7])
            self.full[full[:7]] = full
            self.subject[full[:7]] = subject
        # per-commit deltas in the package; a commit missing here does not touch hdeval/*.py
        self.delta: dict[str, int] = {}
        self.added: dict[str, int] = {}
        self.removed: dict[str, int] = {}
        self.files: dict[str, list[tuple[str, int]]] = {}
        cur = ""
        log = git("log", "--no-merges", "--no-renames", "--reverse", "--numstat", "--format=@%H", rng,
                  "--", SPEC)
        for line in log.splitlines():
            if line.startswith("@"):
                cur = line[1:8]
                self.delta[cur] = self.added[cur] = self.removed[cur] = 0
                self.files[cur] = []
            elif line.strip():
                a, r, path = line.split("\t")
                if a == "-":  # binary
                    continue
                self.delta[cur] += int(a) - int(r)
                self.added[cur] += int(a)
                self.removed[cur] += int(r)
                self.files[cur].append((path, int(a) - int(r)))
        self.cls, self.judge = read_classes(classes_path)
        unknown = sorted(set(self.cls.values()) - set(CLASS_ORDER))
        if unknown:
            refuse(f"{classes_path.name} has unknown class(es) {unknown}; "
                     f"use {', '.join(CLASS_ORDER)}")
        missing = [h for h in self.order if h not in self.cls]
        if missing:
            refuse(f"{len(missing)} commit(s) in {rng} have no class in {classes_path.name} "
                     f"(classify them first): {' '.join(missing)}")


def read_classes(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """hash -> class, and hash -> 'alternative class:why' for the judgement calls."""
    cls, judge = {}, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        h, c, j, _subject = line.split("\t", 3)
        cls[h[:7]] = c
        if j:
            judge[h[:7]] = j
    return cls, judge


def read_modules(path: Path) -> dict[str, tuple[str, str, str]]:
    """path -> (group, issue, job) for the new modules that are not plain #19 splits."""
    groups = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        p, group, issue, job = line.split("\t")
        groups[p] = (group, issue, job)
    return groups


def section_commits(git: Git, hist: History, out: dict) -> None:
    base, end = hist.base, hist.end
    base_size, end_size = git.size(base), git.size(end)
    growth, commit_sum = end_size - base_size, sum(hist.delta.values())
    remainder = growth - commit_sum
    out.update(base_size=base_size, end_size=end_size)
    print(f"END = {end} ({git('rev-parse', end).strip()})")
    print(f"size {base} = {base_size}; size {end} = {end_size}; growth = {growth}")
    print(f"non-merge commits: {len(hist.order)} ({len(hist.delta)} touch {SPEC}); "
          f"sum of their deltas = {commit_sum}")
    print(f"merge remainder (growth - sum) = {remainder}")
    print("  per first-parent merge (size(M) - size(M^1) - sum of non-merge commits in M^1..M), "
          "nonzero only:")
    total = 0
    for m in git("rev-list", "--first-parent", "--merges", f"{base}..{end}").split():
        r = git.size(m) - git.size(m + "^1") - git.net(f"{m}^1..{m}")
        total += r
        if r:
            print(f"    {r:+5d}  {m[:7]} {git('log', '-1', '--format=%s', m)[:92].strip()}")
    print(f"    total {total:+d}")

    print("\nclass\tcommits\tcommits touching package\tnet delta")
    per = {c: [0, 0, 0] for c in CLASS_ORDER}
    for h in hist.order:
        t = per.setdefault(hist.cls[h], [0, 0, 0])
        t[0] += 1
        t[1] += h in hist.delta and hist.added[h] + hist.removed[h] > 0
        t[2] += hist.delta.get(h, 0)
    for c, (n, touching, d) in per.items():
        print(f"{c}\t{n}\t{touching}\t{d:+d}")
    house = per["19"][2] + per["fix"][2] + remainder
    feat = sum(per[c][2] for c in FEATURES)
    est = base_size + house
    print(f"net(19 + fix + merge remainder) = {per['19'][2]:+d} {per['fix'][2]:+d} {remainder:+d} "
          f"= {house:+d}")
    print(f"net(20..23) = {feat:+d};  check: {base_size} + {house:+d} + {feat:+d} "
          f"= {base_size + house + feat} (= {end_size})")
    print(f"SAME FEATURES NOW (estimate) = {base_size} {house:+d} = {est}")

    # a judgement call moves the estimate only if it crosses between house (19/fix) and a feature
    print(f"\njudgement calls (|delta| >= {JUDGEMENT_MIN}): hash, delta, class -> alternative, "
          "effect on the estimate if flipped")
    low = up = est
    for h in hist.order:
        d = hist.delta.get(h, 0)
        if h not in hist.judge or abs(d) < JUDGEMENT_MIN:
            continue
        alt, why = hist.judge[h].split(":", 1)
        house_now, house_alt = hist.cls[h] in HOUSE, alt in HOUSE
        effect = 0 if house_now == house_alt else (d if house_alt else -d)
        if house_now and not house_alt:
            low += effect  # flipping to a feature lowers the estimate
        if not house_now and house_alt:
            up += effect  # flipping to #19/fix raises it
        print(f"  {h}\t{d:+d}\t{hist.cls[h]} -> {alt}\t{effect:+d}\t{why[:150]}")
    print(f"lower bound (every judgement call counted as its feature) = {low}")
    print(f"upper bound (every judgement call counted as 19) = {up}")
    small = [h for h in hist.order if h in hist.judge and abs(hist.delta.get(h, 0)) < JUDGEMENT_MIN]
    print(f"judgement calls below {JUDGEMENT_MIN} lines: {len(small)}",
          " ".join(f"{h}({hist.delta.get(h, 0):+d})" for h in small))


def section_modules(git: Git, hist: History, out: dict) -> None:
    groups = read_modules(MODULES)
    # Weakness 1's certain part: #19/fix commits cutting code in modules whose only job is a feature
    only = {p for p, (g, _, _) in groups.items() if g == "feature"} | GONE_FEATURE_MODULES
    cuts = adds = 0
    big = []
    for h in hist.order:
        if hist.cls[h] not in HOUSE or h in MOVES:
            continue
        for p, d in hist.files.get(h, []):
            if p in only:
                if d < 0:
                    cuts += d
                    big.append((d, h, p))
                else:
                    adds += d
    print(f"\n#19/fix commits (moves excluded) in feature-only modules: cuts {cuts:+d}, additions {adds:+d}")
    for d, h, p in sorted(big)[:8]:
        print(f"  {d:+d}\t{h}\t{p}\t{hist.subject[h][:70]}")
    negative = sum(d for h in hist.order if hist.cls[h] in HOUSE for _, d in hist.files.get(h, []) if d < 0)
    print(f"all negative per-file deltas of #19/fix commits (anywhere) = {negative:+d}")

    base, end = hist.base, hist.end
    new = sorted(git.pyfiles(end) - git.pyfiles(base))
    lines = {}
    for line in git("grep", "-c", "", end, "--", *new).splitlines():
        lines[line.split(":", 2)[1]] = int(line.rsplit(":", 1)[1])
    unknown = [p for p in groups if p not in lines]
    if unknown:
        refuse(f"{MODULES.name} names modules that are not new at {end}: "
                 f"{' '.join(unknown)}")
    by_group: collections.Counter[str] = collections.Counter()
    by_issue: collections.Counter[tuple[str, str]] = collections.Counter()
    print(f"\nmodules new since {base}: {len(new)} files, {sum(lines.values())} lines; "
          f"removed since: {sorted(git.pyfiles(base) - git.pyfiles(end))}")
    for p in new:
        # a new module the TSV does not name is a split of an old module or a #19 seam
        g, i, job = groups.get(p, ("house19", "19", ""))
        by_group[g] += lines[p]
        by_issue[(g, i)] += lines[p]
        print(f"  {lines[p]:5d}  {g:8s} {i}  {p}  {job}")
    print("  by group:", dict(by_group), " by group and issue:",
          {f"{g}/{i}": v for (g, i), v in sorted(by_issue.items())})
    end_size = out.get("end_size") or git.size(end)
    print(f"  module-level bounds on same-features-now: at most {end_size - by_group['feature']} "
          "(only feature-only modules are new-feature code); "
          f"{end_size - by_group['feature'] - by_group['mixed']} "
          "if the mixed modules were all new-feature code")


def section_blame(git: Git, hist: History) -> None:
    full = {hist.full[h]: c for h, c in hist.cls.items() if h in hist.full}
    old = set(git("rev-list", hist.base).split())
    header = re.compile(r"^([0-9a-f]{40}) \d+ \d+")
    files = sorted(git.pyfiles(hist.end))
    # without -M -C a moved line is charged to the commit that moved it (mostly #19's splits)
    for opts in ([], ["-M", "-C"]):
        count: collections.Counter[str] = collections.Counter()
        for p in files:
            for line in git("blame", "-w", *opts, "--porcelain", hist.end, "--", p).splitlines():
                m = header.match(line)
                if m:
                    sha = m.group(1)
                    count[full.get(sha) or ("old" if sha in old else "merge")] += 1
        feature_lines = sum(count[c] for c in FEATURES)
        print(f"\nblame -w {' '.join(opts)}: "
              + ", ".join(f"{c} {count[c]}" for c in ("old", "19", "fix", "merge", *FEATURES))
              + f"; lines last written by 20-23 commits {feature_lines}; "
              f"all other lines {sum(count.values()) - feature_lines}")


def section_statements(git: Git, hist: History) -> None:
    per: collections.Counter[str] = collections.Counter({c: 0 for c in CLASS_ORDER})
    for h in hist.order:
        full = hist.full[h]
        paths = git("diff-tree", "--no-commit-id", "--no-renames", "--name-only", "-r", full + "^", full,
                    "--", SPEC).split()
        per[hist.cls[h]] += sum(git.statements(full, p) - git.statements(full + "^", p) for p in paths)

    def size(rev: str) -> int:
        return sum(git.statements(rev, p) for p in git.pyfiles(rev))

    b, e = size(hist.base), size(hist.end)
    remainder = e - b - sum(per.values())
    house = per["19"] + per["fix"] + remainder
    print(f"\nstatements: {hist.base} {b}, {hist.end} {e}; per class "
          + ", ".join(f"{c} {d:+d}" for c, d in per.items()) + f"; merge remainder {remainder:+d}")
    print(f"same features now, in statements = {b} {house:+d} = {b + house} "
          f"({100 * house / b:+.1f}% against {hist.base})")


def write_commits(hist: History, path: Path) -> None:
    """The per-commit table (hash, delta, added, removed, class, judgement call, subject)."""
    with path.open("w", encoding="utf-8") as f:
        f.write("hash\tdelta\tadded\tremoved\tclass\tjudgement_call\tsubject\n")
        for h in hist.order:
            f.write(f"{h}\t{hist.delta.get(h, 0)}\t{hist.added.get(h, 0)}\t{hist.removed.get(h, 0)}\t"
                    f"{hist.cls[h]}\t{hist.judge.get(h, '')}\t{hist.subject[h]}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=None,
                    help="the git repository to measure (default: the one holding this script)")
    ap.add_argument("--base", default="b877c61", help="the commit whose features are counted")
    ap.add_argument("--end", default="5d33523",
                    help="the commit measured (the published figures are for 5d33523)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)")
    ap.add_argument("--commits-out", type=Path, default=None,
                    help="also write the per-commit table (delta and class of every commit) to this TSV")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
    repo = args.repo or Path(subprocess.check_output(["git", "-C", str(HERE), "rev-parse", "--show-toplevel"],
                                                     text=True).strip())
    for flag, rev in (("--base", args.base), ("--end", args.end)):
        if subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True).returncode:
            refuse(f"{flag} {rev}: no such commit in {repo}")
    git = Git(repo)
    hist = History(git, args.base, args.end, CLASSES)
    if args.commits_out:
        write_commits(hist, args.commits_out)
    out: dict = {}
    if "commits" in sections:
        section_commits(git, hist, out)
    if "modules" in sections:
        section_modules(git, hist, out)
    if "blame" in sections:
        section_blame(git, hist)
    if "statements" in sections:
        section_statements(git, hist)
    return 0


if __name__ == "__main__":
    sys.exit(main())
