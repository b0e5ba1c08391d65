#!/usr/bin/env python3
"""Scan speed at repository scale: loopaudit beside ruff (and, on request, TorchFix) on a pinned corpus.

The corpus is seven source distributions from PyPI, pinned by version and SHA-256 (see CORPUS): the
libraries that real training code is built on, about 3,000 files and 1.2 M lines. The script fetches
them once with `pip download` (into .bench-venv/corpus, git-ignored), checks the hashes, unpacks them,
and then times, for each tool, the runs a user meets:

- cold:        nothing cached (loopaudit writes its cache as it goes; ruff too);
- no-cache:    loopaudit --no-cache, ruff --no-cache: the cost of the analysis alone;
- warm:        the same tree again, nothing changed;
- touched:     one file edited (a comment appended), the tree scanned again: a library file of timm's,
               then a 7,200-line test module of peft's that the project analysis reaches in every
               round, each beside a scan of that file alone (the "1 s + the file" of issue 13);
- single-file: one file named on the command line, as pre-commit runs it, cache cold.

It checks that loopaudit reports the same findings with and without its cache, cold and warm and
after the touch (and, with --check-jobs, with one worker), and prints wall seconds, CPU use
(100% = one core busy) and the ratios loopaudit / ruff. ruff runs with its default rules, isolated
from the corpus' own configuration files, in its own venv (RUFF_SPEC).

    python benchmarks/bench_scan_speed.py                 # loopaudit and ruff (~6 min on 2 CPUs)
    python benchmarks/bench_scan_speed.py --torchfix      # and TorchFix, cold only (~13 min more)
    python benchmarks/bench_scan_speed.py --json out.json --check-jobs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_torchfix import DEFAULT_VENV as TORCHFIX_VENV
from bench_vs_torchfix import NCPU, BenchError, count_tree, ensure_torchfix

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".bench-venv"
RUFF_SPEC = "ruff==0.17.6"
CORPUS = {  # sdist -> sha256, as PyPI serves them
    "diffusers-0.42.1.tar.gz": "ce855ab670c8cd1c7a61be8f12fbc68c081bca8ec5e747273946d8d6c2aff23b",
    "timm-1.0.31.tar.gz": "baa0b333339c46d3d6d4965d99b69f5053afed71210e8f433d7ea5ee6a18f0ec",
    "peft-0.21.2.tar.gz": "b803ccfb3f3f316004d850284306687833a2235ea278fb56abc856203456142e",
    "accelerate-1.15.0.tar.gz": "5654f8c5eaa0d4fa68b33e287a97765da6849bf6d51dcac874e73fbbddfb6134",
    "pytorch_lightning-2.6.6.tar.gz": "52c52b20522dd3d3feb3bb3aae2dbe3f291e8e836d4111a74cfd72e9df018834",
    # With these two the corpus passes the size (1.16 M lines): 2,989 files, 1.22 M lines.
    "kornia-0.9.0.tar.gz": "65e82219b10e73289fb8cb3c739879d917e6908c0a977b1d65f388cba1741f71",
    "torchmetrics-1.9.0.tar.gz": "a488609948600df52d3db4fcdab02e62aab2a85ef34da67037dc3e65b8512faa",
}
TOUCHED = "timm-1.0.31/timm/models/resnet.py"  # a model every timm training run builds (a library file)
# A file of the project (a test module of peft's, 7,200 lines, with findings): analysed in every round
TOUCHED_PROJECT = "peft-0.21.2/tests/test_gpu_examples.py"
SINGLE = "diffusers-0.42.1/src/diffusers/training_utils.py"  # what a training script's commit touches


def fetch_corpus(folder: Path) -> Path:
    """The unpacked corpus; what is missing from it (all of it, the first time) is fetched."""
    tree = folder / "tree"
    missing = {name: digest for name, digest in CORPUS.items() if not (tree / name[: -len(".tar.gz")]).is_dir()}
    if not missing:
        return tree
    downloads = folder / "sdists"
    downloads.mkdir(parents=True, exist_ok=True)
    specs = [name[: -len(".tar.gz")].rsplit("-", 1) for name in missing]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(downloads)]
    print("Fetching the corpus (once) ...", file=sys.stderr)
    proc = subprocess.run(
        [*command, *(f"{name}=={version}" for name, version in specs)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BenchError(f"pip download failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    tree.mkdir(parents=True, exist_ok=True)
    for name, digest in missing.items():
        archive = downloads / name
        if not archive.is_file() or hashlib.sha256(archive.read_bytes()).hexdigest() != digest:
            raise BenchError(f"{archive}: missing, or not the pinned file (sha256 differs)")
        unpacking = Path(tempfile.mkdtemp(dir=folder))
        with tarfile.open(archive) as tar:
            tar.extractall(unpacking, filter="data")
        (unpacking / name[: -len(".tar.gz")]).rename(tree / name[: -len(".tar.gz")])
        unpacking.rmdir()
    return tree


def ensure_ruff() -> Path:
    venv = WORK / "ruff"
    exe = venv / "bin" / "ruff"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", RUFF_SPEC], check=True)
    return exe


def timed(command: list[str], cwd: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, errors="replace")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise BenchError(f"`{' '.join(command)}` exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return {"seconds": round(wall, 2), "cpu_percent": round(100 * cpu / wall), "stdout": proc.stdout}


def compile_loopaudit() -> None:
    """pip compiles an installed package's bytecode; a checkout installed in editable mode under
    PYTHONDONTWRITEBYTECODE (as on this machine) never gets any, and every run would compile the
    engine again (0.1 s of each start-up), which no user pays."""
    import loopaudit
    import loopaudit.rules

    folders = {os.path.dirname(loopaudit.__file__), os.path.dirname(loopaudit.rules.__file__)}
    subprocess.run([sys.executable, "-m", "compileall", "-q", *sorted(folders)], check=False)


def loopaudit_runs(tree: Path, cache: Path, check_jobs: bool) -> dict:
    exe = shutil.which("loopaudit") or str(Path(sys.executable).parent / "loopaudit")
    compile_loopaudit()
    base = [exe, "scan", "--isolated", "--output-format", "json", "--exit-zero"]
    shutil.rmtree(cache, ignore_errors=True)
    runs = {"no-cache": timed([*base, "--no-cache", "."], tree)}
    runs["cold"] = timed([*base, "--cache-dir", str(cache), "."], tree)
    runs["warm"] = timed([*base, "--cache-dir", str(cache), "."], tree)
    findings = {name: json.loads(run["stdout"]) for name, run in runs.items()}
    for name, relative in (("touched", TOUCHED), ("touched project file", TOUCHED_PROJECT)):
        touched = tree / relative
        original = touched.read_bytes()
        try:
            touched.write_bytes(original + b"\n# touched by the benchmark\n")
            runs[name] = timed([*base, "--cache-dir", str(cache), "."], tree)
            runs[f"{name}, no cache"] = timed([*base, "--no-cache", "."], tree)
            if json.loads(runs[name]["stdout"]) != json.loads(runs[f"{name}, no cache"]["stdout"]):
                raise BenchError(
                    f"loopaudit's findings after the touch of {relative} differ with and without the cache"
                )
            # What "the file" itself costs: a scan of it alone, with no cache.
            runs[f"{name}: the file alone"] = timed([*base, "--no-cache", relative], tree)
        finally:
            touched.write_bytes(original)
    single_cache = cache.with_name(cache.name + "-single")
    shutil.rmtree(single_cache, ignore_errors=True)
    runs["single-file"] = timed([*base, "--cache-dir", str(single_cache), SINGLE], tree)
    if check_jobs:
        runs["no-cache, --jobs 1"] = timed([*base, "--no-cache", "--jobs", "1", "."], tree)
        findings["--jobs 1"] = json.loads(runs["no-cache, --jobs 1"]["stdout"])
    reference = findings["no-cache"]
    differing = [name for name, found in findings.items() if found != reference]
    if differing:
        raise BenchError(f"loopaudit's findings differ between runs: {differing} vs no-cache")
    for run in runs.values():
        run["findings"] = len(json.loads(run.pop("stdout")))
    return runs


def ruff_runs(tree: Path, cache: Path) -> dict:
    base = [str(ensure_ruff()), "check", "--isolated", "--exit-zero", "--quiet", "--output-format", "concise"]
    shutil.rmtree(cache, ignore_errors=True)
    runs = {"no-cache": timed([*base, "--no-cache", "."], tree)}
    runs["cold"] = timed([*base, "--cache-dir", str(cache), "."], tree)
    runs["warm"] = timed([*base, "--cache-dir", str(cache), "."], tree)
    touched = tree / TOUCHED
    original = touched.read_bytes()
    try:
        touched.write_bytes(original + b"\n# touched by the benchmark\n")
        runs["touched"] = timed([*base, "--cache-dir", str(cache), "."], tree)
    finally:
        touched.write_bytes(original)
    runs["single-file"] = timed([*base, "--no-cache", SINGLE], tree)
    for run in runs.values():
        run["findings"] = len(run.pop("stdout").splitlines())
    return runs


def torchfix_runs(tree: Path) -> dict:
    exe = ensure_torchfix(TORCHFIX_VENV)
    run = timed([str(exe), "-j", str(NCPU), "."], tree)
    run["findings"] = len(run.pop("stdout").splitlines())
    return {"cold": run}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=WORK / "corpus", help="where the corpus is fetched and unpacked")
    parser.add_argument("--torchfix", action="store_true", help="also time TorchFix (cold only; slow)")
    parser.add_argument("--check-jobs", action="store_true", help="also scan with --jobs 1 and compare the findings")
    parser.add_argument("--json", type=Path, help="write the results here as JSON too")
    args = parser.parse_args()
    try:
        tree = fetch_corpus(args.corpus)
        files, lines = count_tree(tree)
        results = {
            "loopaudit": loopaudit_runs(tree, args.corpus / "loopaudit-cache", args.check_jobs),
            "ruff": ruff_runs(tree, args.corpus / "ruff-cache"),
        }
        if args.torchfix:
            results["torchfix"] = torchfix_runs(tree)
    except BenchError as error:
        print(f"bench_scan_speed: {error}", file=sys.stderr)
        return 2
    print(f"corpus: {files:,} files, {lines:,} lines ({', '.join(CORPUS)}); {NCPU} CPUs")
    print(f"{'run':<38} {'tool':<10} {'seconds':>8} {'CPU %':>6} {'findings':>9} {'÷ ruff':>7}")
    for name in results["loopaudit"]:
        for tool, runs in results.items():
            if name not in runs:
                continue
            run = runs[name]
            ruff = results["ruff"].get(name)
            ratio = f"{run['seconds'] / ruff['seconds']:.1f}" if ruff and tool != "ruff" else ""
            print(
                f"{name:<38} {tool:<10} {run['seconds']:>8.2f} {run['cpu_percent']:>6} {run['findings']:>9} {ratio:>7}"
            )
    if args.json:
        args.json.write_text(json.dumps({"files": files, "lines": lines, "cpus": NCPU, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
