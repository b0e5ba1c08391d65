"""`loopaudit.sync_budget` and its pytest marker, run for real on this machine's CPU: the calls that
would synchronize on CUDA are counted at their lines, `# noqa` allows a line, threads keep their own
budgets, and a real pytest run fails a test whose step reads `.item()`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch", reason="a sync budget watches torch calls (pip install 'loopaudit[profile]')")

import loopaudit  # noqa: E402  (after the skip: the budget needs torch)
from loopaudit.testing.sync_budget import SyncBudgetExceeded, sync_budget  # noqa: E402


def train_steps(model, optimizer, steps: int, read_loss: bool) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if read_loss:
            print(loss.item())  # the line a budget must name


def model_and_optimizer():
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_per_step_item_exceeds_a_budget_of_zero_and_is_named_by_line():
    with pytest.raises(SyncBudgetExceeded) as raised, sync_budget(0):
        train_steps(*model_and_optimizer(), steps=3, read_loss=True)
    message = str(raised.value)
    assert message.startswith("3 host-GPU syncs where 0 are allowed:")
    assert f"{__file__}:{train_steps.__code__.co_firstlineno + 7}  `.item()`  ×3" in message


def test_the_fixed_loop_passes_and_the_budget_lists_nothing():
    with sync_budget(0) as budget:
        train_steps(*model_and_optimizer(), steps=3, read_loss=False)
    assert budget.syncs == []  # the optimizer's own step counter is no sync of the user's


def test_a_budget_allows_what_it_says():
    with sync_budget(3) as budget:
        train_steps(*model_and_optimizer(), steps=3, read_loss=True)
    assert budget.count == 3
    with pytest.raises(SyncBudgetExceeded, match="4 host-GPU syncs where 3 are allowed"), sync_budget(3):
        train_steps(*model_and_optimizer(), steps=4, read_loss=True)


def test_a_noqa_comment_allows_its_line_as_the_scan_does():
    x = torch.ones(3)
    with sync_budget(0) as budget:
        x.sum().item()  # noqa: LA101
        torch.nonzero(x)  # loopaudit: ignore[LA1]
        x.tolist()  # noqa: LA601
    assert budget.syncs == [] and len(budget.sites) == 3


def test_threads_keep_their_own_budgets_and_the_last_one_restores_torch():
    original_item = torch.Tensor.item
    counts: dict[str, int] = {}
    both_open = threading.Barrier(2)

    def counted(name: str, reads: int) -> None:
        with sync_budget(10) as budget:
            both_open.wait()
            for _ in range(reads):
                torch.ones(2).sum().item()
            both_open.wait()  # neither closes while the other still reads
        counts[name] = budget.count

    workers = [threading.Thread(target=counted, args=(name, reads)) for name, reads in (("a", 2), ("b", 5))]
    for worker in workers:
        worker.start()
    torch.ones(2).sum().item()  # this thread has no budget: counted by neither
    for worker in workers:
        worker.join()
    assert counts == {"a": 2, "b": 5}
    assert torch.Tensor.item is original_item


def test_budgets_nest_and_the_innermost_counts():
    with sync_budget(5) as outer:
        torch.ones(1).item()
        with sync_budget(5) as inner:
            torch.ones(1).item()
            torch.ones(1).item()
    assert (outer.count, inner.count) == (1, 2)


def test_the_package_offers_it_without_importing_torch_until_used():
    assert loopaudit.sync_budget is sync_budget
    checked = subprocess.run(
        [sys.executable, "-c", "import sys, loopaudit; loopaudit.sync_budget; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert checked.stdout.strip() == "False"


USERS_TESTS = textwrap.dedent("""\
    import pytest
    import torch


    def step(model, optimizer, log):
        loss = model(torch.randn(8, 4)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if log:
            return loss.item()


    @pytest.mark.sync_budget(0)
    def test_step_with_item():
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            step(model, optimizer, log=True)


    @pytest.mark.sync_budget(0)
    def test_fixed_step():
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            step(model, optimizer, log=False)


    @pytest.mark.sync_budget(0)
    def test_own_failure_comes_first():
        torch.ones(1).item()
        assert False, "the test's own assertion"


    def test_fixture(sync_budget):
        with sync_budget(1):
            torch.ones(1).item()
""")


@pytest.mark.slow
def test_the_pytest_plugin_fails_the_item_step_and_passes_the_fixed_one(tmp_path):
    (tmp_path / "test_users.py").write_text(USERS_TESTS)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "test_users.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "2 failed, 2 passed" in out, out
    assert "FAILED test_users.py::test_step_with_item - loopaudit.testing.sync_budget.Syn" in out
    assert "SyncBudgetExceeded: 3 host-GPU syncs where 0 are allowed" in out
    assert f"{tmp_path / 'test_users.py'}:11  `.item()`  ×3" in out
    assert "FAILED test_users.py::test_own_failure_comes_first - AssertionError: the test" in out
