"""What a finding tells the user to write fits the code it reports: a dtype conversion before a batch
copy is told to convert after it, a tensor a model rebuilds or keeps on the host every forward is told
to become a buffer, and a loss kept with its graph is told to detach, not to sync."""

from __future__ import annotations

import textwrap

import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.scan.engine import analyze_text
from loopaudit.scan.options import ScanOptions

from .conftest import run_cli

OPTIONS = ScanOptions(rules=tuple(all_rules()))


def messages(source: str, code: str) -> dict[int, object]:
    """Line -> finding of `code` in the source."""
    return {f.location.row: f for f in analyze_text(textwrap.dedent(source), "train.py", OPTIONS) if f.code == code}


CONVERTED = """\
    import torch
    from torch.utils.data import DataLoader
    device = torch.device("cuda")
    loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True)
    for x, y, depth in loader:
        x = x.float().to(device)
        y = y.long().cuda()
        out = model(x)
        depth = depth.half().to(out)
        loss = criterion(out, y) + (out - depth).abs().mean()
        loss.backward()
        optimizer.step()
"""


def test_a_conversion_before_the_copy_is_told_to_convert_after_it():
    found = messages(CONVERTED, "LA202")
    assert sorted(found) == [6, 7, 9]
    assert "`.float()` makes a new, unpinned host tensor" in found[6].message
    assert found[6].message.endswith("copy first, convert on the GPU (`x.to(device, non_blocking=True).float()`)")
    assert found[7].message.endswith("(`y.cuda(non_blocking=True).long()`)")
    assert found[6].fix.applicability == found[7].fix.applicability == "unsafe"
    # `.to(out)` takes `out`'s dtype too: copying first and converting after would change the result.
    assert found[9].message.endswith("copy first, convert on the GPU") and found[9].fix is None


def test_the_conversion_fix_copies_first_and_only_when_unsafe_fixes_are_asked(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(CONVERTED))
    run_cli("scan", "train.py", "--fix", cwd=tmp_path)
    assert script.read_text() == textwrap.dedent(CONVERTED)
    run_cli("scan", "train.py", "--fix", "--unsafe-fixes", cwd=tmp_path)
    fixed = script.read_text()
    assert "    x = x.to(device, non_blocking=True).float()\n" in fixed
    assert "    y = y.cuda(non_blocking=True).long()\n" in fixed
    assert "    depth = depth.half().to(out)\n" in fixed
    assert sorted(messages(fixed, "LA202")) == [9]


MODEL = """\
    import torch
    from torch import nn
    MAX_LEN = 512
    class Net(nn.Module):
        def __init__(self, block_size):
            super().__init__()
            self.block_size = block_size
            self.mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
        def forward(self, x):
            x = x - self.mean.to(x.device)
            positions = torch.arange(MAX_LEN).to(x.device)
            mask = torch.tril(torch.ones(self.block_size, self.block_size)).cuda()
            scale = torch.tensor([0.5, 2.0]).to(x.device)
            steps = torch.arange(x.size(1)).to(x.device)
            noise = torch.randn(16).cuda()
            idx = torch.LongTensor(range(x.size(0))).to(x.device)
            return self.body(x, positions, mask, scale, steps, noise, idx)
    model = Net(256).cuda()
    for x, y in train_loader:
        loss = model(x.cuda(non_blocking=True)).sum()
        loss.backward()
        optimizer.step()
"""


def test_a_tensor_a_model_keeps_on_the_host_is_told_to_become_a_buffer():
    assert not messages(MODEL, "LA202")  # the model's own tensor, not batch data: LA205's
    finding = messages(MODEL, "LA205")[10]
    assert "a tensor the model keeps on the host (`self.mean`, set in `__init__`)" in finding.message
    assert 'self.register_buffer("mean", ..., persistent=False)` instead of `self.mean = ...`' in finding.message
    assert "of the batch" not in finding.message
    assert finding.fix is None  # `non_blocking=True` from pageable memory would only hide it


@pytest.mark.parametrize("row, buffer", [(11, "positions"), (12, "mask"), (13, "scale")])
def test_a_constant_a_model_rebuilds_every_forward_is_told_to_become_a_buffer(row, buffer):
    message = messages(MODEL, "LA205")[row].message
    assert "the same tensor on the CPU each time" in message
    assert (
        f'build it once in `__init__` as a buffer, `self.register_buffer("{buffer}", ..., persistent=False)`' in message
    )


def test_what_the_batch_or_chance_decides_is_made_on_the_device_instead():
    found = messages(MODEL, "LA205")
    assert sorted(found) == [10, 11, 12, 13, 14, 15, 16]
    for row in (14, 15):  # the batch's shape, random numbers: no buffer can hold them
        assert found[row].message.endswith("create it with `device=`")
    # A legacy constructor takes no `device=`: the factory that makes the same tensor does.
    assert found[16].message.endswith(
        "`torch.LongTensor` cannot take `device=`; create it on the device with `torch.arange(n, dtype=torch.long, device=...)`"
    )


def test_a_tensor_another_object_keeps_on_the_host_is_moved_once_in_its_init():
    source = """\
        import torch
        class Schedule:
            def __init__(self, n):
                self.t = torch.linspace(0.0, 1.0, n)
            def at(self, s):
                return torch.searchsorted(self.t.clone().to(s.device), s)
        schedule = Schedule(1000)
        model = torch.nn.Linear(4, 4).cuda()
        for x, y in loader:
            loss = model(x.cuda(non_blocking=True), schedule.at(y.cuda(non_blocking=True))).sum()
            loss.backward()
    """
    assert not messages(source, "LA202")
    message = messages(source, "LA205")[6].message
    assert "a tensor the object keeps on the host (`self.t`, set in `__init__`)" in message
    assert message.endswith(
        "move it to the device once, in `__init__` (`self.t = ....to(device)`), or build it there with `device=`"
    )


def test_outside_a_model_a_constant_is_made_once_before_the_loop():
    source = """\
        import torch
        device = torch.device("cuda")
        for x, y in train_loader:
            margin = torch.tensor(0.2).to(device)
            loss = model(x.to(device, non_blocking=True), margin).sum()
            loss.backward()
            optimizer.step()
    """
    assert messages(source, "LA205")[4].message.endswith("create it once, before the loop")


ACCUMULATED = """\
    import torch
    model.cuda()
    for epoch in range(10):
        total, losses, logits = 0.0, [], []
        for x, y in train_loader:
            out = model(x.cuda())
            loss = criterion(out, y.cuda())
            loss.backward()
            optimizer.step()
            total += loss
            losses.append(loss)
            logits.append(out)
"""


def test_a_loss_kept_with_its_graph_is_told_to_detach_not_to_sync():
    found = messages(ACCUMULATED, "LA403")
    assert sorted(found) == [10, 11, 12]
    assert found[10].message == (
        "`total += loss` chains each step's autograd graph onto `total`, which keeps them all alive until it "
        "dies: accumulate `loss.detach()` (on the device, no sync) and read `total` once per epoch"
    )
    assert found[11].message.endswith(
        "append `loss.detach()` and reduce the list once per epoch (`torch.stack(losses).mean()`)"
    )
    assert found[12].message.endswith("append `out.detach()`")  # outputs, not losses: nothing to stack
    for finding in found.values():
        assert ".item()" not in finding.message


def test_a_loss_read_as_a_number_every_step_is_a_sync_not_a_kept_graph():
    source = ACCUMULATED.replace("total += loss\n", "total += loss.item()\n").replace(
        "losses.append(loss)\n", "losses.append(float(loss))\n"
    )
    assert sorted(messages(source, "LA403")) == [12]
    assert sorted(messages(source, "LA101")) == [10]
    assert "`total += loss.detach()`" in messages(source, "LA101")[10].suggestion


def test_a_loss_converted_to_keep_is_told_to_stay_on_the_device_and_a_condition_keeps_its_advice():
    source = ACCUMULATED.replace(
        "losses.append(loss)\n", "losses.append(float(loss))\n            scale = 0.5 if loss > 10 else 1.0\n"
    )
    found = messages(source, "LA103")
    kept, tested = found[11], found[12]
    assert kept.message.startswith("`float()` of a tensor")
    assert "append `loss.detach()`" in kept.suggestion and "NaN" not in kept.suggestion
    assert "NaN guard" in tested.suggestion  # a decision on the host: the rule's own advice


def test_a_count_read_at_once_is_one_finding_that_names_both_waits():
    source = """\
        import torch
        for x, t in loader:
            ts = schedule.timesteps.to("cuda")
            index = (ts == t.cuda(non_blocking=True)).nonzero().item()
            model(x.cuda(non_blocking=True), index).sum().backward()
            optimizer.step()
    """
    assert messages(source, "LA105") == {}
    [read] = messages(source, "LA101").values()
    assert read.message.endswith(
        "waits for the GPU twice, once per step: `.nonzero()` to count its elements, `.item()` to copy them to the host"
    )
