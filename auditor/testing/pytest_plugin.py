"""pytest plugin (installed with loopaudit, entry point `pytest11`): the sync budget as a marker and a
fixture.

    @pytest.mark.sync_budget(0)          # the test fails if its code syncs the host with the GPU
    def test_training_step(model, batch):
        train_step(model, batch)

    def test_logging(sync_budget):       # the fixture: a budget around part of a test
        with sync_budget(1):
            log_metrics(step=100)

Loading the plugin imports nothing heavy: torch is imported when a budget opens.
"""

from __future__ import annotations

import pytest


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "sync_budget(allowed=0): fail the test when its code synchronizes the host with the GPU more than "
        "`allowed` times (loopaudit; on a machine without a GPU, the calls that would synchronize on CUDA)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("sync_budget")
    if marker is None:
        return (yield)
    from loopaudit.testing.sync_budget import sync_budget

    allowed = marker.args[0] if marker.args else marker.kwargs.get("allowed", 0)
    # The test's own failure comes out of the `yield` and passes through: the budget is judged only
    # on a test that otherwise passed.
    with sync_budget(allowed):
        return (yield)


@pytest.fixture(name="sync_budget")
def sync_budget_fixture():
    """The `sync_budget` context manager, for a budget around part of a test."""
    from loopaudit.testing.sync_budget import sync_budget

    return sync_budget
