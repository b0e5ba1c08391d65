"""The per-step model, case by case.

Each case is a small script with `.item()` (LA101) as a probe: lines marked `# per-step` must be
reported, every other `.item()` must not. The cases follow docs/per-step-model.md.
"""

from __future__ import annotations

import textwrap

import pytest

from .conftest import findings_of

CASES = {
    "epoch loop around a step loop is not per-step": """
        import torch
        device = torch.device("cuda")
        for epoch in range(epochs):
            total = torch.zeros((), device=device)
            for x, y in train_loader:
                loss = model(x.to(device)).sum()
                loss.backward()
                optimizer.step()
                seen = loss.item()  # per-step
            print(epoch, total.item())
        """,
    "training through helper functions, transitively": """
        import torch
        model = model.cuda()
        def compute(batch):
            out = model(batch.cuda())
            return out.sum()
        def train_step(batch):
            loss = compute(batch)
            loss.backward()
            optimizer.step()
            return loss.item()  # per-step
        def train_epoch(loader):
            for batch in loader:
                value = train_step(batch)
        for epoch in range(3):
            train_epoch(train_loader)
            done = torch.ones(1).item()
        """,
    "nanoGPT: while True with micro-steps, periodic eval and logging": """
        import torch
        device = "cuda"
        model.to(device)
        @torch.no_grad()
        def estimate_loss():
            out = {}
            for split in ["train", "val"]:
                losses = torch.zeros(eval_iters)
                for k in range(eval_iters):
                    X, Y = get_batch(split)
                    logits, loss = model(X, Y)
                    losses[k] = loss.item()  # per-step
                out[split] = losses.mean()
            return out
        while True:
            if iter_num % eval_interval == 0 and master_process:
                losses = estimate_loss()
                best = losses["val"].item()
            for micro_step in range(gradient_accumulation_steps):
                logits, loss = model(X, Y)
                X, Y = get_batch("train")
                scaler.scale(loss).backward()
                seen = loss.item()  # per-step
            scaler.step(optimizer)
            scaler.update()
            last = loss.item()  # per-step
            if iter_num % log_interval == 0 and master_process:
                lossf = loss.item() * gradient_accumulation_steps
            iter_num += 1
            if iter_num > max_iters:
                break
        """,
    "periodic guards of every shape": """
        import time
        import torch
        model.cuda()
        for step, (x, y) in enumerate(loader):
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                a = loss.item()
            if (step + 1) % args.log_every == 0:
                b = loss.item()
            if not step % 10:
                c = loss.item()
            if step == len(loader) - 1:
                d = loss.item()
            if should_log:
                e = loss.item()
            if time.time() - t0 > 60:
                f = loss.item()
            if step % 100 == 0:
                pass
            else:
                g = loss.item()  # per-step
        """,
    "counted step loops": """
        import torch
        model.to("cuda")
        for step in range(max_steps):
            loss = model(get_batch()).sum()
            a = loss.item()  # per-step
        iter_num = 0
        while iter_num < max_iters:
            loss = model(get_batch()).sum()
            b = loss.item()  # per-step
            iter_num += 1
        """,
    "loaders through enumerate, tqdm, zip and subscripts": """
        import torch
        from tqdm import tqdm
        model.cuda()
        for i, batch in enumerate(tqdm(train_loader)):
            a = model(batch.cuda()).sum().item()  # per-step
        for (xa, ya), (xb, yb) in zip(loader_a, loader_b):
            b = model(xa.cuda()).sum().item()  # per-step
        for inputs, labels in dataloaders[phase]:
            c = model(inputs.cuda()).sum().item()  # per-step
        """,
    "a name bound to a DataLoader is a loader": """
        import torch
        from torch.utils import data as tud
        model.cuda()
        batches = tud.DataLoader(dataset, batch_size=32)
        for b in batches:
            a = model(b.cuda()).sum().item()  # per-step
        """,
    "loops that only look like step loops": """
        import torch
        model.cuda()
        for step in range(num_steps):
            schedule.append(step * 2)
            value = torch.tensor(step).item()
        for i in range(len(classes)):
            count = counts[i].item()
        while True:
            line = next(lines)
            if not line:
                break
        """,
    "exception handlers and leaving branches are not per-step": """
        import sys
        import torch
        model.cuda()
        for x, y in loader:
            loss = model(x.cuda()).sum()
            try:
                loss.backward()
            except RuntimeError:
                print(loss.item())
            if not torch.isfinite(loss):
                print(loss.item())
                sys.exit(1)
            if bad:
                report = loss.item()
                raise ValueError(report)
            if done:
                last = loss.item()
                return last
            optimizer.step()
        else:
            final = loss.item()
        """,
    "a function defined in the loop runs only when called": """
        import torch
        model.cuda()
        for x, y in loader:
            loss = model(x.cuda()).sum()
            def report():
                return loss.item()
            hook = lambda: loss.item()
            loss.backward()
            optimizer.step()
        """,
    "Lightning step hooks and methods they call": """
        import torch
        import pytorch_lightning as pl
        class Base(pl.LightningModule):
            pass
        class Model(Base):
            def training_step(self, batch, batch_idx):
                loss = self.shared(batch)
                self.log("loss", loss.item())  # per-step
                return loss
            def shared(self, batch):
                x, y = batch
                out = self(x)
                acc = (out.argmax(1) == y).float().mean().item()  # per-step
                return out.sum()
            def on_train_epoch_end(self):
                epoch_loss = self.epoch_total.item()
        """,
    "HF Trainer subclasses": """
        import torch
        from transformers import Trainer
        class WeightedTrainer(Trainer):
            def compute_loss(self, model, inputs, return_outputs=False):
                outputs = model(**inputs)
                loss = outputs.loss
                self.seen = loss.item()  # per-step
                return loss
            def helper_never_called(self):
                return self.total.item()
        """,
    "a CPU-only script costs nothing": """
        import torch
        for x, y in train_loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            total += loss.item()
        """,
    "a cuda device named but never used is CPU-only": """
        import torch
        for x, y in train_loader:
            loss = net(x).sum()
            loss.backward()
            optimizer.step()
            total += loss.item()
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        print(device)
        """,
    "NumPy values and dict.items are not tensors": """
        import numpy as np
        import torch
        model.cuda()
        for x, y in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            m = np.float32(3.0).item()
            arr = np.asarray(times)
            v = arr.mean().item()
            for k, val in metrics.items():
                pass
            n = x.size(0)
        """,
    "a file that never imports torch": """
        for x, y in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            total += loss.item()
        """,
    "evaluation loops are per-step": """
        import torch
        device = torch.device("cuda")
        def evaluate(model, loader):
            model.eval()
            correct = 0
            with torch.no_grad():
                for images, labels in loader:
                    out = model(images.to(device))
                    correct += (out.argmax(1) == labels.to(device)).sum().item()  # per-step
            return correct
        for epoch in range(10):
            train(model)
            if epoch % 5 == 0:
                acc = evaluate(model, val_loader)
        """,
    "an accelerator-provided device": """
        import torch
        from accelerate import Accelerator
        accelerator = Accelerator()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            total += loss.item()  # per-step
        """,
    "a loop whose body always returns runs once (a timing helper)": """
        import torch
        model = model.cuda()
        def time_one_batch(loader):
            for x, y in loader:
                out = model(x.cuda())
                print(out.sum().item())
                return out
        for x, y in train_loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            print(loss.item())  # per-step
        """,
    "the first few steps only (`if i < 4:`) are not per-step": """
        import torch
        model = model.cuda()
        for i, (x, y) in enumerate(train_loader):
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            if i < 4:
                print(loss.item())
            if 2 >= batch_idx:
                print(loss.item())
            if i < len(train_loader) - 1:
                print(loss.item())  # per-step
        """,
    "ignite's process function and per-iteration handlers are step hooks": """
        import torch
        from ignite.engine import Engine, Events
        model = model.cuda()
        def train_step(engine, batch):
            x, y = batch
            loss = criterion(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
            return loss.item()  # per-step
        trainer = Engine(train_step)
        @trainer.on(Events.ITERATION_COMPLETED)
        def log_loss(engine):
            print(engine.state.output.item())  # per-step
        @trainer.on(Events.ITERATION_COMPLETED(every=100))
        def log_rarely(engine):
            print(engine.state.output.item())
        trainer.run(train_loader, max_epochs=10)
        """,
    "a counted loop inside a model's own method unrolls one step (an autoregressive decoder)": """
        import torch
        class Decoder(torch.nn.Module):
            def inference(self, memory):
                outputs = []
                while True:
                    out = self.prenet(memory)
                    outputs.append(out)
                    if len(outputs) > 100 or out.sum().item() > 0.5:
                        break
                return outputs
            def forward(self, x):
                return self.prenet(x)
        model = Decoder().cuda()
        for x, y in train_loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            print(loss.item())  # per-step
        """,
    "a submodule called through `self.encoder(x)` runs its forward per step": """
        import torch
        class Encoder(torch.nn.Module):
            def forward(self, x, lengths):
                print(lengths.max().item())  # per-step
                return x
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = Encoder()
            def forward(self, x, lengths):
                return self.encoder(x, lengths)
        model = Net().cuda()
        for x, lengths in train_loader:
            loss = model(x.cuda(), lengths.cuda()).sum()
            loss.backward()
            optimizer.step()
        """,
    "the parameters of a model are device tensors (a per-parameter gradient norm)": """
        import torch
        model = model.cuda()
        for x, y in train_loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            for name, p in model.named_parameters():
                print(name, p.grad.norm().item())  # per-step
            optimizer.step()
        """,
    "a factory of this module returns the step function": """
        import torch
        model = model.cuda()
        def make_step(model, optimizer):
            def step_fn(x):
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                return loss.item()  # per-step
            return step_fn
        run = make_step(model, optimizer)
        for x in stream:
            run(x.cuda())
        """,
    "a loop over a progress bar that wraps a loader, the training in another module (BigGAN)": """
        import torch
        from tqdm import tqdm
        device = "cuda"
        model = Net().to(device)
        for epoch in range(10):
            pbar = tqdm(loaders[0])
            for i, (x, y) in enumerate(pbar):
                x, y = x.to(device), y.to(device)
                metrics = train(x, y)
                print(metrics["loss"].item())  # per-step
        """,
    "only the arms a caller's option or the default selects are per-step": """
        import torch
        model = model.cuda()
        class Head(torch.nn.Module):
            def __init__(self, kind="linear"):
                super().__init__()
                self.kind = kind
            def forward(self, x):
                if self.kind == "linear":
                    print(x.sum().item())
                elif self.kind in ("mlp", "conv"):
                    print(x.mean().item())  # per-step
                else:
                    print(x.max().item())
                return x
        head = Head(kind="mlp").cuda()
        def step(x, skip_type="logSNR", adaptive=False, log=True):
            if skip_type == "logSNR":
                print(x.sum().item())  # per-step
            elif skip_type == "uniform":
                print(x.mean().item())
            if adaptive:
                print(x.max().item())
            if not log:
                print(x.min().item())
            loss = head(model(x)).sum()
            loss.backward()
            optimizer.step()
        def run(loader, skip_type, **extra):
            for x, y in loader:
                step(x.cuda(non_blocking=True), skip_type=skip_type, adaptive=False, **extra)
        run(train_loader, "logSNR", log=False)
        """,
    "a loop that runs the model on each item with autograd off is an evaluation step": """
        import torch
        model = model.cuda()
        def forward(model, generator):
            outputs = []
            for n, batch in enumerate(generator):
                x = torch.as_tensor(batch["waveform"]).cuda(non_blocking=True)
                with torch.no_grad():
                    out = model(x)
                outputs.append(out["clipwise"].sum().item())  # per-step
            for name in names:
                print(torch.zeros(1).cuda().item())
            return outputs
        """,
    "a flag the code sets to a literal selects its arms": """
        import torch
        model = model.cuda()
        classify = False
        use_ema = True
        for x, y in train_loader:
            loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            optimizer.step()
            if classify:
                print(loss.item())
            if use_ema:
                print(loss.detach().item())  # per-step
        """,
    "a function that repeats the model's work itself is many steps, not one (a benchmark harness)": """
        import torch
        import gc
        model = model.cuda()
        @torch.no_grad()
        def run_benchmark(scenario):
            inputs = scenario.inputs()
            for _ in range(NUM_WARMUP_ROUNDS):
                out = model(inputs)
            print(out.sum().item())
            gc.collect()
        for scenario in scenarios:
            run_benchmark(scenario)
        """,
    "an option no literal states makes every arm per-step": """
        import torch
        model = model.cuda()
        def step(x, mode):
            if mode == "a":
                print(x.sum().item())  # per-step
            else:
                print(x.mean().item())  # per-step
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
        for x, y in train_loader:
            step(x.cuda(non_blocking=True), args.mode)
        """,
    "a function handed in and called once per iteration of a loop runs per step": """
        import torch
        model = model.cuda()
        def sample_fn(n):
            x = model(torch.randn(n, 4, device="cuda"))
            print(x.sum().item())  # per-step
            return x
        def sample_all(total, batch_size, fn):
            n_batches = total // batch_size
            for _ in range(n_batches):
                save(fn(batch_size))
        sample_all(50000, 500, sample_fn)
        """,
    "an update loop that counts to one runs within the environment step around it (CURL)": """
        import torch
        agent = Agent().cuda()
        for step in range(num_train_steps):
            action = agent.act(obs).item()  # per-step
            if step >= init_steps:
                num_updates = 1
                for _ in range(num_updates):
                    loss = agent.loss(replay_buffer.sample())
                    loss.backward()
                    optimizer.step()
                    print(loss.item())  # per-step
            obs, reward, done, _ = env.step(action)
        """,
    "a batch the iteration moves later is on the host before the move (XLM's asserts before to_cuda)": """
        import torch
        model = Net().cuda()
        for batch in get_iterator("train"):
            x, lengths = batch
            assert lengths.max().item() <= 512
            x, lengths = to_cuda(x, lengths)
            loss = model(x, lengths).mean()
            loss.backward()
            optimizer.step()
            print(loss.item())  # per-step
        """,
    "an evaluation function's walk over users that runs the model's predict (SASRec)": """
        import torch
        import numpy as np
        model = SASRec().cuda()
        def evaluate(model, users):
            hits = 0
            for u in users:
                predictions = -model.predict(np.array([u]), np.array(history[u]))
                rank = predictions.argsort().argsort()[0].item()  # per-step
                hits += rank < 10
            return hits
        for epoch in range(200):
            for x, y in loader:
                model(x.cuda(non_blocking=True)).mean().backward()
                optimizer.step()
            if epoch % 20 == 0:
                evaluate(model, users)
        """,
    "a loop over file names that reads each file and runs the model is an inference step (Retinaface)": """
        import cv2
        import torch
        torch.set_grad_enabled(False)
        device = torch.device("cuda")
        net = Net().to(device)
        names = open(listfile).read().split()
        for i, name in enumerate(names):
            img = cv2.imread(folder + name)
            x = torch.from_numpy(img).permute(2, 0, 1)[None].float()
            boxes = net(x.to(device, non_blocking=True))
            score = boxes.max().item()  # per-step
        """,
    "a branch that fills a cache the test finds missing runs once, not per step": """
        import torch
        model = Net().cuda()
        scale = None
        def set_scale(x):
            global scale
            scale = model(x).abs().max().item()
        for x in train_loader:
            x = x.cuda(non_blocking=True)
            if scale is None or scale < 0:
                set_scale(x)
            if self_stats is None:
                self_stats = model(x).mean().item()
            loss = model(x / scale).sum()
            loss.backward()
            optimizer.step()
            seen = loss.item()  # per-step
        """,
    "a parameter defaulting to None is filled on every call that passes none: no cache": """
        import torch
        model = Net().cuda()
        def forward(x, state=None):
            if state is None:
                state = model(x).mean().item()  # per-step
            return model(x).sum() * state
        for x in train_loader:
            loss = forward(x.cuda(non_blocking=True))
            loss.backward()
            optimizer.step()
        """,
    "a loop over settings written out, reading no file, is no inference step": """
        import torch
        torch.set_grad_enabled(False)
        device = torch.device("cuda")
        net = Net().to(device)
        x = torch.zeros(1, 3, 64, 64, device=device)
        for name in ["small", "large"]:
            print(name, net(x).max().item())
        """,
}


def expected(source: str) -> list[int]:
    return [row for row, line in enumerate(source.splitlines(), 1) if line.rstrip().endswith("# per-step")]


@pytest.mark.parametrize("name", CASES)
def test_per_step_model(name):
    source = textwrap.dedent(CASES[name]).lstrip("\n")
    reported = [row for row, code in findings_of(source, "LA101")]
    assert reported == expected(source)


def test_a_module_class_forward_called_per_step():
    source = textwrap.dedent("""
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    x = x * 2
                return x
        model = Net().cuda()
        for x, y in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
    """).lstrip("\n")
    assert findings_of(source, "LA103") == [(5, "LA103")]


def test_parameters_take_the_kind_of_what_call_sites_pass():
    source = textwrap.dedent("""
        import torch
        model.cuda()
        def report(value, step):
            print(value)
            print(step)
        for step, (x, y) in enumerate(loader):
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            report(loss, step)
    """).lstrip("\n")
    assert findings_of(source, "LA104") == [(4, "LA104")]


def test_host_tensors_are_not_syncs():
    source = textwrap.dedent("""
        import torch
        device = torch.device("cuda")
        model.to(device)
        for images, targets in val_loader:
            out = model(images.to(device))
            top1 = out.argmax(1).cpu()
            hits = int((targets == top1).sum())
            counts = torch.zeros(10)
            if counts.sum() > 0:
                pass
            n = targets.tolist()
    """).lstrip("\n")
    assert findings_of(source, "LA1") == [(6, "LA102")]


def test_a_batch_moved_to_the_device_in_place_is_a_device_tensor():
    source = textwrap.dedent("""
        import torch
        device = torch.device("cuda")
        model.to(device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            if (y > 0).any():
                print(x)
    """).lstrip("\n")
    assert findings_of(source, "LA10") == [(6, "LA103"), (7, "LA104")]


def test_decoded_strings_zipped_beside_a_batch_are_not_tensors():
    source = textwrap.dedent("""
        import torch
        model = model.cuda()
        for images, labels in valid_loader:
            preds = model(images.cuda())
            preds_str = converter.decode(preds)
            for pred, gt in zip(preds_str, labels):
                if pred == gt:
                    n_correct += 1
    """).lstrip("\n")
    assert findings_of(source, "LA103") == []


def test_fields_of_a_batch_object_moved_to_the_device_are_device_tensors():
    source = textwrap.dedent("""
        import torch
        device = torch.device("cuda")
        for batch in train_loader:
            batch = batch.to(device)
            out = model(batch.x, batch.edge_index, batch.batch)
            is_labeled = batch.y == batch.y
            loss = criterion(out[is_labeled], batch.y[is_labeled])
            loss.backward()
            optimizer.step()
            if batch.num_graphs > 1:
                pass
    """).lstrip("\n")
    assert findings_of(source, "LA105") == [(7, "LA105")]


def test_a_value_the_iteration_moves_later_is_on_the_host_until_then():
    # XLM's evaluators: `lengths` comes from the project's own iterator (its kind unknown) and is
    # moved with `to_cuda(...)` further down the body, so before that line it is a host tensor.
    import libcst as cst

    from loopaudit.analysis.module_index import build_index
    from loopaudit.analysis.stepmodel import StepModel
    from loopaudit.analysis.tensors import Kind, TensorInference

    source = textwrap.dedent("""
        import torch
        model = Net().cuda()
        class Evaluator:
            def run(self):
                for batch in self.get_iterator("valid"):
                    x, lengths = batch
                    n = lengths.max()
                    x, lengths = to_cuda(x, lengths)
                    loss = model(x, lengths).mean()
                    m = lengths.max()
                    print(loss.item())
    """).lstrip("\n")
    module = cst.parse_module(source)
    index = build_index(module, (cst.Call,))
    tensors = TensorInference(index, StepModel(index))
    before, after = (
        (site.call.func.value, site.scope)
        for site in index.calls
        if isinstance(site.call.func, cst.Attribute) and site.call.func.attr.value == "max"
    )
    assert tensors.kind(*before) is Kind.HOST_TENSOR
    assert tensors.kind(*after) is Kind.UNKNOWN
