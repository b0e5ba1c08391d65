"""Score loopaudit's findings against hand labels on real training scripts written by others.

The scripts themselves are not in this repository (they are other people's code): each corpus
folder holds them next to a `manifest.json` (where each file comes from: repository, path, commit)
and a `labels.json` ({"file.py": [{"code": "LA202", "line": 12, "note": "..."}], "file.py#ambiguous":
[...]}). `benchmarks/precision/corpora/` keeps the manifests and labels, so a corpus can be fetched
again from the same commits and re-scored.

A corpus holds single scripts (corpora a and b: `file.py` at the top of the folder, scanned together)
or multi-file projects (corpora c and d: one folder per project, `project/engine.py` in the manifest
and the labels). Each project folder is scanned on its own, as its author would scan it, so the
project-wide analysis sees exactly that project's modules.

A finding matches a label of the same code within one line (a multi-line statement may be reported
at its first line and labelled at another). Findings that match an ambiguous label count neither way.
A finding that stands for several lines (the reads of one step: its `related` places) is scored as
one finding at each of them, as it was reported before such lines were grouped.

    python benchmarks/precision/score.py CORPUS_DIR [CORPUS_DIR ...] [--codes LA2,LA3] [--show]
        [--python PATH]   # score the loopaudit installed for another interpreter (an older version)
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path


def _findings(folder: Path, python: str) -> list[dict]:
    """Every finding in the corpus, its `filename` made relative to the corpus folder."""
    scans = [[str(project)] for project in sorted(folder.iterdir()) if project.is_dir()]
    loose = sorted(str(path) for path in folder.glob("*.py"))
    if loose:
        scans.append(loose)
    findings = []
    for paths in scans:
        completed = subprocess.run(
            [python, "-m", "loopaudit", "scan", *paths, "--output-format", "json", "--isolated"],
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode not in (0, 1):
            raise SystemExit(f"loopaudit failed on {paths}:\n{completed.stderr}")
        for finding in json.loads(completed.stdout):
            finding["filename"] = Path(finding["filename"]).resolve().relative_to(folder.resolve()).as_posix()
            findings.append(finding)
    return findings


def reported_lines(findings: list[dict]) -> list[tuple[int, dict]]:
    """(line, finding) for each line the findings of the JSON output report, in line order: a grouped
    finding at its own line and at each of its members' lines, as the findings it groups would be.
    (A finding's other places, `"kind": "place"`, are lines of the same one problem: see reported_places.)"""
    return [(rows[0], finding) for rows, finding in reported_places(findings)]


def reported_places(findings: list[dict]) -> list[tuple[tuple[int, ...], dict]]:
    """(lines, finding) for each problem place the findings report, in line order: the finding's own
    line with the other lines of its one problem (a tensor built on one line and moved on another:
    a label on either is the same problem), then each group member's line alone."""
    found = []
    for finding in findings:
        related = finding.get("related", ())
        places = tuple(p["location"]["row"] for p in related if p.get("kind") == "place")
        found.append(((finding["location"]["row"], *places), finding))
        found.extend(((p["location"]["row"],), finding) for p in related if p.get("kind", "member") == "member")
    return sorted(found, key=lambda place: place[0][0])


def _family(code: str) -> str:
    return code[:3] + "xx"


def score(folders: list[Path], prefixes: tuple[str, ...], show: bool, python: str = sys.executable) -> dict:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for folder in folders:
        labels = json.loads((folder / "labels.json").read_text())
        findings = _findings(folder, python)
        by_file: dict[str, list[dict]] = collections.defaultdict(list)
        for finding in findings:
            by_file[finding["filename"]].append(finding)
        for name in sorted(k for k in labels if not k.endswith("#ambiguous")):
            wanted = [(label["code"], label["line"]) for label in labels[name] if label["code"].startswith(prefixes)]
            ambiguous = [(label["code"], label["line"]) for label in labels.get(name + "#ambiguous", [])]
            found = [
                (f["code"], rows)
                for rows, f in reported_places(by_file.get(name, []))
                if f["code"].startswith(prefixes)
            ]
            unmatched = list(wanted)
            for code, rows in found:
                hit = next((w for row in rows for w in unmatched if w[0] == code and abs(w[1] - row) <= 1), None)
                if hit is not None:
                    unmatched.remove(hit)
                    counts[_family(code)]["tp"] += 1
                elif any(a[0] == code and abs(a[1] - row) <= 1 for row in rows for a in ambiguous):
                    counts[_family(code)]["ambiguous"] += 1
                elif any(w[0] == code and abs(w[1] - row) <= 1 for row in rows for w in wanted):
                    counts[_family(code)]["duplicate"] += 1  # a second finding on a labelled line
                else:
                    counts[_family(code)]["fp"] += 1
                    if show:
                        print(f"FP {folder.name}/{name}:{rows[0]} {code}")
            for code, row in unmatched:
                counts[_family(code)]["fn"] += 1
                if show:
                    print(f"FN {folder.name}/{name}:{row} {code}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--codes", default="LA", help="comma-separated code prefixes to score, e.g. LA2,LA3")
    parser.add_argument("--show", action="store_true", help="list every false positive and miss")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose loopaudit is scored")
    args = parser.parse_args()
    print_table(score(args.folders, tuple(args.codes.split(",")), args.show, args.python))


def print_table(counts: dict[str, collections.Counter], width: int = 8) -> None:
    """tp / fp / fn, precision and recall of each family, then of all (score_blind.py prints it too)."""
    total = collections.Counter()
    print(f"{'family':{width}} {'tp':>4} {'fp':>4} {'fn':>4} {'precision':>9} {'recall':>7}")
    for family in sorted(counts):
        total.update(counts[family])
        _row(family, counts[family], width)
    _row("all", total, width)


def _row(name: str, c: collections.Counter, width: int) -> None:
    tp, fp, fn = c["tp"], c["fp"], c["fn"]
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    print(f"{name:{width}} {tp:4} {fp:4} {fn:4} {precision:9.2f} {recall:7.2f}")


if __name__ == "__main__":
    main()
