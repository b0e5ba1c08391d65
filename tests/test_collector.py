"""Parsing out of the garbage collector's way (collector.py): what is frozen, and what must not be.

The processes that own their collector freeze what is alive after each parse. These tests run in
their own Python processes, since freezing changes the process for good."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

from loopaudit.scan import collector

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_project_scan_leaves_no_cycle_frozen():
    """Every fixture, scanned as one project in rounds, by a process that owns its collector: once
    the scan is over and its own garbage collected, unfreezing finds nothing more to collect. A
    rule that kept an index in a module-level table would leave that index and its tree here."""
    output = _python(f"""
        import gc, glob
        from loopaudit.scan import collector
        from loopaudit.scan.project_scan import analyze_many
        from loopaudit.scan.options import ScanOptions
        from loopaudit.rule_api.registry import all_rules

        collector.own_collector()
        collector.FULL_COLLECTION_EVERY = 10**12  # no full collection to hide a leak
        options = ScanOptions(tuple(all_rules()))
        files = sorted(glob.glob({str(FIXTURES)!r} + "/*.py"))
        result = analyze_many([(path, path, False, options) for path in files], jobs=1)
        gc.collect()
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        print(len(files), len(result.findings), frozen, gc.collect())
    """)
    files, findings, frozen, leaked = map(int, output.split())
    assert files > 20 and findings > 20 and frozen > 100_000  # the trees were frozen
    assert leaked == 0


def test_a_cycle_frozen_by_a_parse_is_collected_at_the_next_full_collection():
    output = _python("""
        import gc, weakref
        from loopaudit.scan import collector

        class Node:
            pass

        def cycle():
            node = Node()
            node.itself = node
            return node

        collector.own_collector()
        kept = cycle()
        alive = weakref.ref(kept)
        collector.parse_module("x = 1\\n")  # freezes `kept`
        del kept
        gc.collect()
        collector.parse_module("y = 2\\n")
        after_collection = alive() is not None
        collector.FULL_COLLECTION_EVERY = 10
        collector.parse_module("z = 3\\n")  # past the bound: unfrozen and collected
        print(after_collection, alive() is not None)
    """)
    assert output == "True False"


def test_a_library_caller_s_collector_is_left_as_it_was():
    frozen = gc.get_freeze_count()
    assert not collector._owned  # this process imports loopaudit as a library
    module = collector.parse_module("import torch\nx = torch.ones(3)\n")
    assert module.code.startswith("import torch") and gc.isenabled()
    gc.disable()
    try:
        collector.parse_module("y = 1\n")
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert gc.get_freeze_count() == frozen


def test_a_forked_worker_freezes_what_it_inherits_without_walking_it():
    """The command's heap, copied into each worker at fork (cache entries, the project's layout),
    must not be walked by the worker's collections: own_worker_collector moves it out of their sight."""
    output = _python("""
        import gc
        from loopaudit.scan import collector

        inherited = [[n] for n in range(50_000)]  # stands for what the command holds when it forks
        collector.own_worker_collector()
        print(collector._owned, gc.get_freeze_count() >= len(inherited))
    """)
    assert output == "True True"
