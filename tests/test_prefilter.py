"""The text prefilter must never rule out a file that has findings: it is a shortcut, not a rule.
Every source that yields findings when parsed must also pass the prefilter."""

from __future__ import annotations

import textwrap

import pytest

from loopaudit.rule_api.registry import all_rules, select_rules
from loopaudit.scan.engine import passes_prefilter
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.prefilter import may_contain_findings

from .conftest import FIXTURES, findings_of
from .test_step_model import CASES

SOURCES = {
    **{f"{rule.code}-invalid-{n}": example for rule in all_rules() for n, example in enumerate(rule.invalid)},
    **{f"step-model: {name}": textwrap.dedent(source) for name, source in CASES.items()},
    **{f"fixture {path.name}": path.read_text() for path in sorted(FIXTURES.glob("*.py"))},
}


@pytest.mark.parametrize("name", SOURCES)
def test_sources_with_findings_pass_the_prefilter(name):
    source = SOURCES[name]
    for code in sorted({code for _, code in findings_of(source)}):
        # Each rule alone, as `--select CODE` runs it, must let the source through.
        assert passes_prefilter(source, ScanOptions(rules=select_rules([code], None))), code


def test_the_prefilter_rules_out_files_without_torch_or_steps():
    assert not may_contain_findings("import numpy\nfor x in loader:\n    x.item()\n", only_cuda_rules=True)
    assert not may_contain_findings("import torch\nx = torch.ones(3).cuda()\n", only_cuda_rules=True)
    # An import machinery's loader is no data loader.
    assert not may_contain_findings(
        "import torch\nfor name in names:\n    spec.loader.exec_module(load(name))\ntorch.cuda.synchronize()\n",
        only_cuda_rules=True,
    )
    assert not may_contain_findings(
        'import torch\ndef f():\n    """Example:\n\n    >>> loss.backward()\n    """\n    return torch.cuda.is_available()\n',
        only_cuda_rules=True,
    )


def test_in_a_project_the_torch_import_and_the_device_may_be_in_another_module():
    # SPADE's trainer: it trains, but never imports torch nor names CUDA; its model module does both.
    trainer = "from models import Pix2Pix\nclass Trainer:\n    def step(self, data):\n        loss = self.model(data)\n        loss.backward()\n"
    assert not may_contain_findings(trainer, only_cuda_rules=True)
    assert may_contain_findings(trainer, only_cuda_rules=True, in_project=True)
    # Still no step code, still ruled out.
    assert not may_contain_findings("import torch\nx = torch.ones(3).cuda()\n", only_cuda_rules=True, in_project=True)
    # A project's model module with no step code is left to the project: it asks for the modules its
    # steps enter, and for every model where it trains on CUDA (test_project).
    model = "import torch.nn as nn\nclass Head(nn.Module):\n    def forward(self, x):\n        return x[x > 0]\n"
    assert not may_contain_findings(model, only_cuda_rules=True, in_project=True)


@pytest.mark.parametrize(
    "step_line,passes",
    [
        ("latents = self.scheduler.step(noise_pred, t, latents).prev_sample", False),  # a diffusion sampler
        ("lr_scheduler.step()", False),
        ("for i, t in enumerate(timesteps):", False),  # no range: the step model never counts it
        ("for t in tqdm(self.progress_bar(timesteps)):", False),
        ("optimizer.step()", True),
        ("scaler.step(optimizer); scheduler.step()", True),
        ("self.optimizers().step()", True),
        ("loss.backward()", True),
        ("for i in tqdm(range(num_steps)):", True),
        ("for i, _ in enumerate(range(max_iters)):", True),
        ("for it in trange(total_steps):", True),
        ("for i in range(0, lastframe, opt.batch_size):", True),  # one batch at a time (stepmodel.batch_stride)
        ("for i in tqdm(range(0, len(images), batch_size)):", True),
        ("for i in range(0, len(images), 2):", False),
    ],
)
def test_a_step_line_passes_only_when_the_step_model_could_act_on_it(step_line, passes):
    """A denoising loop (`scheduler.step` over `enumerate(timesteps)`) is neither a training call nor a
    counted step loop: a file that has nothing else is not parsed (293 diffusers pipelines were)."""
    text = f"import torch\ndevice = 'cuda'\ndef sample(x):\n    {step_line}\n        pass\n"
    assert may_contain_findings(text, only_cuda_rules=True) is passes
