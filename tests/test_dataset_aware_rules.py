"""What the loader rules read from a dataset's own code, LA201's advice for loaders Accelerate
prepares, and LA301 on a tokenizer's ids across modules (the rules' own examples cover the rest)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.scan.engine import analyze_text
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.project_scan import analyze_many

OPTIONS = ScanOptions(rules=all_rules())


def findings(code: str, text: str):
    return [f for f in analyze_text(textwrap.dedent(text).lstrip(), "train.py", OPTIONS) if f.code == code]


ACCELERATE_LOOP = """
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    accelerator = Accelerator({config})
    train_dataloader = torch.utils.data.DataLoader(train_dataset, batch_size=16, num_workers=8)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for batch in train_dataloader:
        loss = model(batch["pixel_values"]).mean()
        accelerator.backward(loss)
        optimizer.step()
"""


def test_a_loader_accelerate_prepares_is_told_to_set_both_pinning_and_non_blocking_placement():
    [finding] = findings("LA201", ACCELERATE_LOOP.format(config=""))
    assert "non_blocking=False" in finding.message
    assert "pin_memory=True" in finding.message
    assert "dataloader_config=DataLoaderConfiguration(non_blocking=True)" in finding.message
    assert finding.fix is not None  # the DataLoader's half is still fixed by `--fix`


def test_with_non_blocking_placement_configured_only_pinning_is_left():
    config = "dataloader_config=DataLoaderConfiguration(non_blocking=True)"
    [finding] = findings("LA201", ACCELERATE_LOOP.format(config=config))
    assert "DataLoaderConfiguration" not in finding.message
    assert "pinned" in finding.message and "pin_memory=True" in finding.message


def test_a_config_bound_to_a_name_counts():
    text = ACCELERATE_LOOP.format(config="dataloader_config=loader_config").replace(
        "accelerator = Accelerator(",
        "loader_config = DataLoaderConfiguration(non_blocking=True)\n    accelerator = Accelerator(",
    )
    [finding] = findings("LA201", text)
    assert "DataLoaderConfiguration" not in finding.message


def test_a_loader_no_accelerator_prepares_keeps_the_plain_message():
    [finding] = findings(
        "LA201",
        """
        import torch
        from accelerate import Accelerator
        accelerator = Accelerator()
        loader = torch.utils.data.DataLoader(train_dataset, batch_size=16, num_workers=8)
        model = accelerator.prepare(model)
        for x, y in loader:
            loss = model(x.to(accelerator.device)).mean()
            accelerator.backward(loss)
            optimizer.step()
    """,
    )
    assert "Accelerate" not in finding.message and "accelerator.prepare" not in finding.message


PINNED_LOOP = """
    model.cuda()
    for batch in loader:
        loss = model(batch["input_ids"].cuda()).mean()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize(
    "dataset, loader",
    [
        # Python data, but a collate function may make tensors of it (a tokenizer): it is not read.
        (
            """
        class PromptDataset(Dataset):
            def __init__(self, prompts):
                self.prompts = prompts
            def __getitem__(self, index):
                return {"prompt": self.prompts[index], "index": index}
        """,
            'loader = DataLoader(PromptDataset(["a", "b"]), batch_size=2, collate_fn=tokenize)',
        ),
        # `self.images` is whatever the caller passed: not shown to be Python data.
        (
            """
        class Images(Dataset):
            def __init__(self, images, prompt):
                self.images, self.prompt = images, prompt
            def __getitem__(self, index):
                return {"image": self.images[index], "prompt": self.prompt}
        """,
            'loader = DataLoader(Images(load_images(), "a photo"), batch_size=2)',
        ),
    ],
)
def test_items_not_shown_to_be_python_data_keep_the_finding(dataset, loader):
    header = "import torch\nfrom torch.utils.data import DataLoader, Dataset\n"
    text = header + textwrap.dedent(dataset).lstrip() + loader + "\n" + textwrap.dedent(PINNED_LOOP).lstrip()
    [finding] = findings("LA201", text)
    assert finding.location.row == 8


def test_a_dataset_handed_a_device_tensor_for_one_option_still_loads_its_images():
    # diffusers' DreamBooth: precomputed prompt embeddings on the GPU, images opened per item.
    found = findings(
        "LA203",
        """
        import torch
        from PIL import Image
        from torch.utils.data import DataLoader, Dataset
        class DreamBoothDataset(Dataset):
            def __init__(self, paths, encoder_hidden_states=None):
                self.paths = paths
                self.encoder_hidden_states = encoder_hidden_states
            def __getitem__(self, index):
                example = {"image": to_tensor(Image.open(self.paths[index]))}
                if self.encoder_hidden_states is not None:
                    example["prompt_embeds"] = self.encoder_hidden_states
                return example
        embeds = text_encoder(ids.to("cuda"))[0] if args.pre_compute else None
        train_dataset = DreamBoothDataset(paths, encoder_hidden_states=embeds)
        train_loader = DataLoader(train_dataset, batch_size=2, pin_memory=True)
        for batch in train_loader:
            loss = model(batch["image"].cuda(non_blocking=True)).mean()
            loss.backward()
            optimizer.step()
    """,
    )
    assert [f.location.row for f in found] == [15]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text).lstrip())


def test_a_tokenizers_ids_are_no_batch_even_where_a_namesake_method_returns_a_tensor(tmp_path):
    # `tokenizer.encode` resolves by name to `Encoder.encode` of another module, which returns a
    # tensor; without `return_tensors=` a tokenizer gives a Python list of ids.
    _write(
        tmp_path,
        {
            "vae.py": """
            import torch
            class Encoder(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.net = torch.nn.Linear(4, 4)
                def encode(self, x, **kwargs):
                    return self.net(x)
        """,
            "train.py": """
            import torch
            from vae import Encoder
            def get_mask(tokenizer, accelerator):
                mask = torch.ones(len(tokenizer)).to(accelerator.device, dtype=torch.bool)
                for token in tokenizer.token_map:
                    ids = tokenizer.encode(token, add_special_tokens=False)
                    for i in range(len(ids)):
                        mask = mask & (torch.arange(len(tokenizer)) != ids[i]).to(accelerator.device)
                return mask
            def get_rows(accelerator, x):
                ids = Encoder().encode(x)
                for i in range(len(ids)):
                    total = total + ids[i].sum()
                return total
            encoder = Encoder().cuda()
            for step, batch in enumerate(train_dataloader):
                loss = encoder(batch["x"].cuda()).mean() + get_rows(accelerator, batch["x"].cuda())
                loss.backward()
                mask = get_mask(tokenizer, accelerator)
                optimizer.step()
        """,
        },
    )
    items = [(str(p), p.name, True, OPTIONS) for p in sorted(tmp_path.glob("*.py"))]
    rows = sorted((f.filename, f.location.row) for f in analyze_many(items, 1).findings if f.code == "LA301")
    assert rows == [("train.py", 12)]  # the encoder's rows, not the tokenizer's ids


def test_a_tensor_dataset_is_on_the_device_only_by_what_its_data_was_when_it_was_made():
    # DeepCTR-Torch's predict: the name `x` is moved to the device only later, batch by batch.
    text = """
        import numpy as np
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def predict(model, x, device="cuda:0"):
            x = [np.expand_dims(column, axis=1) for column in x]
            loader = DataLoader(TensorDataset(torch.from_numpy(np.concatenate(x, axis=-1))), batch_size=256)
            outputs = []
            with torch.no_grad():
                for batch in loader:
                    x = batch[0].to(device).float()
                    outputs.append(model(x))
            return torch.cat(outputs)
    """
    assert [f.location.row for f in findings("LA201", text)] == [7]
    moved = text.replace(
        "torch.from_numpy(np.concatenate(x, axis=-1))", "torch.from_numpy(np.concatenate(x, axis=-1)).to(device)"
    )
    assert findings("LA201", moved) == []
