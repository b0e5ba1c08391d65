"""Parsing out of the cyclic garbage collector's way.

A libcst tree is a Python object per token: a 1,000-line file is some 20,000 objects, and a scan
keeps the trees of its last million characters for later rounds (engine.py). CPython's collector
runs a full collection each time the objects that survived grow by a quarter, and every full
collection walks every tree still alive: on a 1.2 M-line corpus, 43 full collections of 0.25-0.56 s
each made a third of a cold scan's CPU time, for trees that hold no reference cycle at all (they
are freed by reference counting alone).

So a process that owns its collector (the command's own process and its worker processes, never a
program that imports loopaudit as a library) parses like this:

1. collect: the garbage of the analyses so far, small, since everything older is frozen;
2. parse with the collector paused;
3. freeze (`gc.freeze()`): move every object alive, the new tree with them, out of the collector's
   sight. Frozen objects are still freed by reference counting when dropped.

What is frozen is never collected as a cycle. So nothing that holds a cycle should be alive across
a parse and dropped later: an analysis keeps what it works out on its own objects (the index, the
rule context's memo), not in a module-level table (a weak-keyed one frees its values one
collection late, after the freeze), and the engine drops its kept indexes before it parses
(tests/test_collector.py scans a project and finds no frozen cycles). As a bound on what slips
through, everything is unfrozen and collected again every 16 million characters parsed.

Elsewhere the collector is only paused during the parse, and its state restored.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import libcst as cst

# About 400,000 lines. A full collection costs 0.2-0.5 s (2-CPU machine, a million characters of
# trees kept): rare enough to cost nothing measurable, often enough to bound a leak.
FULL_COLLECTION_EVERY = 16_000_000  # characters parsed

_owned = False
_parsed = 0  # characters parsed since the last full collection


def own_collector() -> None:
    """Declare that this process runs loopaudit alone and may freeze what it parses (above)."""
    global _owned
    _owned = True


def own_worker_collector() -> None:
    """own_collector, in a worker process forked from the command: what it inherited is frozen at
    once, unwalked. That is the command's whole heap (a warm scan's cache entries, a layout of
    thousands of paths), which the first parse's collection would otherwise walk, copying every
    page it touches: 0.5 s of a one-file re-scan of a large project."""
    own_collector()
    gc.freeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_module(text: str) -> cst.Module:
    if not _owned:
        with paused():
            return cst.parse_module(text)
    global _parsed
    _parsed += len(text)
    if _parsed > FULL_COLLECTION_EVERY:
        gc.unfreeze()
        _parsed = len(text)
    gc.collect()
    with paused():
        module = cst.parse_module(text)
    gc.freeze()
    return module
