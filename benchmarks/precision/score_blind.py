"""Score loopaudit on a blind project set labelled by family (the u1-dev format).

A blind set is labelled by people who never saw loopaudit, by problem family (SYNC, PIN, NONBLOCK, ...)
rather than by rule code, following `../shared/eval/u1-dev/LABELING.md`: a `labels.json` list with one
entry per file on a project's training path, `{project, path, cuda, families, labels: [{line, family,
periodic, unresolved, confidence, ...}]}`. Each project folder is scanned whole, as a user would scan
it, and only the labelled files are scored.

A finding scores against the labels of its file, by family, within one line (a multi-line statement
may be reported at its first line and labelled at another):
- a label that is neither periodic nor uncertain is wanted: the first finding on it is a true
  positive, a second one a duplicate (counted apart, never as a false positive); unmatched, it is a miss;
- a label with `confidence: "medium"` or `unresolved: true` may go either way: findings on it count
  neither way;
- a periodic label marks a place that must not be reported as per-step: a finding on it is a false
  positive, like any finding that matches no label;
- findings of families the file's labeller did not look for (`families`) are not scored;
- a finding that stands for several lines (its group's members) scores at each of them, as the
  findings it groups would; a finding whose one problem spans lines (a tensor built on one line and
  moved on another, its `"kind": "place"` related places) scores once, at whichever of them is
  labelled (score.reported_places);
- NOGRAD is a property of an evaluation loop, and the guide does not say which line of the loop
  carries it: labellers put it on the loop's header or on a forward pass in it. A NOGRAD finding
  and label also match when the innermost loop around each is the same loop (`--lines-only`
  turns this off: the one-line rule alone, as sets were scored before 2026-11-27).

    python benchmarks/precision/score_blind.py LABELS.json PROJECTS_DIR [--projects a,b] [--show]
        [--python PATH] [--lines-only]
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import subprocess
import sys
from pathlib import Path

from score import print_table, reported_places  # (this script's folder is on the path when it runs)

# The labelling guide's families, as loopaudit's rule codes. Codes absent here (file errors, the
# dynamic mode's measurements) have no family and are not scored.
FAMILY_OF_CODE = {
    "LA101": "SYNC",
    "LA102": "SYNC",
    "LA103": "SYNC",
    "LA104": "SYNC",
    "LA105": "SYNC",
    "LA106": "SYNC",
    "LA201": "PIN",
    "LA202": "NONBLOCK",
    "LA203": "WORKERS",
    "LA204": "PERSIST",
    "LA205": "CPUCREATE",
    "LA301": "PYLOOP",
    "LA302": "PYLOOP",
    "LA401": "EMPTYCACHE",
    "LA402": "GC",
    "LA403": "GRAPHLEAK",
    "LA404": "ZEROGRAD",
    "LA501": "NOGRAD",
    "LA502": "AMPDEPRECATED",
    "LA701": "FINDUNUSED",
    "LA702": "NOSYNC",
    "LA703": "COLLECTIVE",
    "LA704": "SYNCBN",
    "LA705": "SETEPOCH",
}


def scan_project(folder: Path, python: str) -> list[dict]:
    """Every finding in one project folder, scanned whole; `filename` relative to the folder."""
    completed = subprocess.run(
        [python, "-m", "loopaudit", "scan", str(folder), "--output-format", "json", "--isolated", "--no-cache"],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode not in (0, 1):
        raise SystemExit(f"loopaudit failed on {folder}:\n{completed.stderr}")
    findings = json.loads(completed.stdout)
    for finding in findings:
        finding["filename"] = Path(finding["filename"]).resolve().relative_to(folder.resolve()).as_posix()
    return findings


# Families whose labels name a loop rather than a line (see the module's docstring).
LOOP_FAMILIES = frozenset({"NOGRAD"})


def innermost_loops(source: str) -> dict[int, int]:
    """Line -> the first line of the innermost `for`/`while` loop around it (its header included)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    spans = sorted(
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
    )
    loop_at: dict[int, int] = {}
    for start, end in spans:  # outer loops first, so inner ones overwrite their lines
        for line in range(start, end + 1):
            loop_at[line] = start
    return loop_at


def score_file(
    entry: dict, findings: list[dict], counts: dict, show: bool, loop_at: dict[int, int] | None = None
) -> None:
    """Match one labelled file's findings against its labels, adding to `counts[family]`. `loop_at`
    (innermost_loops of the file) lets a loop family's finding and label meet anywhere in one loop."""
    loop_at = loop_at or {}
    looked_for = set(entry.get("families") or FAMILY_OF_CODE.values())
    where = f"{entry['project']}/{entry['path']}"
    wanted, uncertain, periodic = [], [], []
    for label in entry["labels"]:
        place = (label["family"], label["line"])
        if label.get("confidence") == "medium" or label.get("unresolved"):
            uncertain.append(place)
        elif label.get("periodic"):
            periodic.append(place)
        else:
            wanted.append(place)
    unmatched = list(wanted)

    def same_loop(family, line, row):
        return family in LOOP_FAMILIES and loop_at.get(line) is not None and loop_at.get(line) == loop_at.get(row)

    def near(places, family, rows):
        return next(
            (
                p
                for row in rows
                for p in places
                if p[0] == family and (abs(p[1] - row) <= 1 or same_loop(family, p[1], row))
            ),
            None,
        )

    for rows, finding in reported_places(findings):
        family = FAMILY_OF_CODE.get(finding["code"])
        if family is None or family not in looked_for:
            continue
        row = rows[0]
        hit = near(unmatched, family, rows)
        if hit is not None:
            unmatched.remove(hit)
            counts[family]["tp"] += 1
        elif near(wanted, family, rows):
            counts[family]["duplicate"] += 1
        elif near(uncertain, family, rows):
            counts[family]["uncertain"] += 1
        else:
            counts[family]["fp"] += 1
            if show:
                kind = "periodic" if near(periodic, family, rows) else "unlabelled"
                print(f"FP {where}:{row} {finding['code']} ({kind}) {finding['message'][:90]}")
    for family, line in unmatched:
        counts[family]["fn"] += 1
        if show:
            print(f"FN {where}:{line} {family}")


def score(
    labels: list[dict], projects_dir: Path, only: set[str] | None, show: bool, python: str, by_loop: bool = True
) -> dict:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_project: dict[str, list[dict]] = collections.defaultdict(list)
    for entry in labels:
        if only is None or entry["project"] in only:
            by_project[entry["project"]].append(entry)
    for project, entries in sorted(by_project.items()):
        folder = projects_dir / project
        if not folder.is_dir():
            raise SystemExit(f"{folder} is missing: fetch {entries[0]['repo']} at {entries[0]['commit']}")
        by_file = collections.defaultdict(list)
        for finding in scan_project(folder, python):
            by_file[finding["filename"]].append(finding)
        for entry in entries:
            path = folder / entry["path"]
            loops = by_loop and any(label["family"] in LOOP_FAMILIES for label in entry["labels"]) and path.is_file()
            loop_at = innermost_loops(path.read_text(errors="replace")) if loops else None
            score_file(entry, by_file.get(entry["path"], []), counts, show, loop_at)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labels", type=Path, help="the set's labels.json")
    parser.add_argument("projects", type=Path, help="the folder holding one folder per project")
    parser.add_argument("--projects", dest="only", help="comma-separated project names to score")
    parser.add_argument("--show", action="store_true", help="list every false positive and miss")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose loopaudit is scored")
    parser.add_argument("--lines-only", action="store_true", help="match NOGRAD by line alone, not by loop")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    counts = score(
        json.loads(args.labels.read_text()), args.projects, only, args.show, args.python, not args.lines_only
    )
    print_table(counts, 14)


if __name__ == "__main__":
    main()
