"""Code that tests distributed training on purpose: torch's own DDP tests set every flag and run every
collective to exercise it, and so do a project's tests. The LA7xx rules leave it alone."""

from __future__ import annotations

import libcst as cst


def in_test_code(frame) -> bool:
    """Inside a test (`def test_...`, `class Test...`, a `TestCase`): DDP's own tests, and a
    project's, set the flag on purpose to exercise models with unused parameters."""
    while frame is not None:
        function, owner = frame.function, frame.class_info
        if function is not None and function.name.lstrip("_").startswith("test"):  # and `_test_...` helpers
            return True
        if owner is not None and (
            owner.name.startswith("Test")
            or any(cst.Module([]).code_for_node(base).endswith("TestCase") for base in owner.bases)
        ):
            return True
        frame = frame.parent
    return False
