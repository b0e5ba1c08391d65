"""Freeze a blind set's labels: check every label file against the sources it points at, and write
the corpus's labels.json and manifest.json, with its halves drawn at random.

    python benchmarks/precision/freeze_labels.py WORKDIR OUT SEED [--aside NAME,NAME,...]

WORKDIR holds commits.txt ("<owner>__<repo> <owner>/<repo> <commit>" per line), projects/<name>/ (the
sources at those commits), labels/<name>.json (one helper's labels per project) and, optionally, the
brief the labellers got (BRIEF.md). Run it, commit OUT, and only then scan any of the projects.

A project that another corpus here (or u1-dev, or reserved.txt) already holds has been seen: it is
kept as development data and never drawn into the aside half. `--aside` names the aside half
instead of drawing it, for a set whose halves were drawn before (some of it scanned already).
"""

from __future__ import annotations

import json
import pathlib
import random
import sys


def read_commits(path: pathlib.Path) -> dict[str, tuple[str, str]]:
    """Project name -> (repository, commit)."""
    commits = {}
    for line in path.read_text().splitlines():
        if line.strip():
            name, repo, commit = line.split()
            commits[name] = (repo, commit)
    return commits


def checked_entries(root: pathlib.Path, name: str, commit: str) -> list[dict]:
    """The project's label entries, each checked against its file: a label past the file's end, a
    file that is not there or an entry for another commit stops the freeze."""
    entries = json.loads((root / "labels" / f"{name}.json").read_text())
    for entry in entries:
        if entry["project"] != name or entry["commit"] != commit:
            raise SystemExit(f"{name}: an entry names {entry['project']} at {entry.get('commit')}")
        source = root / "projects" / name / entry["path"]
        if not source.exists():
            raise SystemExit(f"{name}: {entry['path']} is not in the sources")
        length = len(source.read_text(errors="replace").split("\n"))
        for label in entry["labels"]:
            if not 1 <= label["line"] <= length:
                raise SystemExit(f"{name}: {entry['path']}:{label['line']} is past the file's end")
    return entries


def seen_repositories(out: pathlib.Path) -> dict[str, str]:
    """Repository (lower case) -> where it is already: the other corpora's manifests, u1-dev, reserved.txt."""
    seen: dict[str, str] = {}
    for manifest in sorted(out.parent.glob("*/manifest.json")):
        if manifest.parent.resolve() == out.resolve():
            continue
        for entry in json.loads(manifest.read_text()):
            seen.setdefault(entry["repo"].lower(), manifest.parent.name)
    shared = pathlib.Path(__file__).resolve().parents[3] / "shared" / "eval"
    if (shared / "u1-dev" / "labels.json").exists():
        for entry in json.loads((shared / "u1-dev" / "labels.json").read_text()):
            seen.setdefault(entry["repo"].lower(), "u1-dev")
    if (shared / "reserved.txt").exists():
        for line in (shared / "reserved.txt").read_text().splitlines():
            if "/" in line and not line.startswith("#"):
                seen.setdefault(line.strip().lower(), "reserved.txt")
    return seen


def main() -> None:
    root, out, seed = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
    chosen = sys.argv[sys.argv.index("--aside") + 1].split(",") if "--aside" in sys.argv else None
    out.mkdir(parents=True, exist_ok=True)
    commits = read_commits(root / "commits.txt")
    labels, names = [], []
    for name in sorted(commits):
        if not (root / "labels" / f"{name}.json").exists():
            print("missing", name)
            continue
        labels += checked_entries(root, name, commits[name][1])
        names.append(name)
    seen = seen_repositories(out)
    for name in names:
        if commits[name][0].lower() in seen:
            print(f"{name} is in {seen[commits[name][0].lower()]} already: development data only")
    fresh = [name for name in names if commits[name][0].lower() not in seen]
    if chosen is not None:
        stale = sorted(set(chosen) - set(fresh))
        if stale:
            raise SystemExit(f"cannot be aside (unknown, or seen already): {stale}")
        aside = set(chosen)
    else:
        aside = set(random.Random(seed).sample(fresh, len(fresh) // 2))
    manifest = [
        {
            "project": name,
            "repo": commits[name][0],
            "commit": commits[name][1],
            "half": "aside" if name in aside else "development",
        }
        for name in names
    ]
    brief = root / "BRIEF.md"
    if brief.exists():
        (out / "LABELLING-BRIEF.md").write_text(brief.read_text())
    (out / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    count = sum(len(entry["labels"]) for entry in labels)
    wanted = sum(
        1
        for entry in labels
        for label in entry["labels"]
        if not label.get("periodic") and label.get("confidence") == "high" and not label.get("unresolved")
    )
    print(len(names), "projects", len(labels), "files", count, "labels", wanted, "wanted")
    print("aside", sorted(aside))


if __name__ == "__main__":
    main()
