"""Project-wide analysis: the per-step model follows calls from one scanned module into another.

Each case is a small project written to a temporary folder. Lines marked `# expect: CODE` must be
reported, and nothing else may be; the same files scanned one at a time must keep the single-file
behaviour where the case says so.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.project_scan import analyze_many

from .conftest import run_cli

OPTIONS = ScanOptions(rules=all_rules())
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")


def write_project(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def expected(root: Path) -> set[tuple[str, int, str]]:
    marks = set()
    for path in sorted(root.rglob("*.py")):
        for row, line in enumerate(path.read_text().splitlines(), 1):
            match = _EXPECT.search(line)
            if match:
                marks.update(
                    (path.relative_to(root).as_posix(), row, code.strip()) for code in match.group(1).split(",")
                )
    return marks


def scan_result(root: Path, jobs: int = 1, named: bool = True):
    """`named`: the files are named one by one (always parsed); else found by walking the folder, where
    the prefilter may skip a file until the project analysis needs it."""
    items = [(str(p), p.relative_to(root).as_posix(), named, OPTIONS) for p in sorted(root.rglob("*.py"))]
    return analyze_many(items, jobs)


def scan(root: Path, jobs: int = 1, named: bool = True):
    return scan_result(root, jobs, named).findings


def found(findings) -> set[tuple[str, int, str]]:
    return {(f.filename, f.location.row, f.code) for f in findings}


PROJECTS = {
    "the step in engine.py, the loop in train.py (device from the caller)": {
        "train.py": """
            import torch
            from engine import train_step
            device = torch.device("cuda")
            model = torch.nn.Linear(4, 2).to(device)
            for x, y in train_loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                train_step(model, optimizer, x, y)
            """,
        "engine.py": """
            import torch.nn.functional as F

            def train_step(model, optimizer, x, y):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                print(loss.item())  # expect: LA101
            """,
    },
    "a loop over a plain iterable is a step loop when the callee in another module trains": {
        "train.py": """
            import torch
            import engine
            model = Net().cuda()
            for batch in stream:
                loss = engine.train_step(model, batch)
                print(loss.item())  # expect: LA101
            """,
        "engine.py": """
            def train_step(model, batch):
                loss = model(batch.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
                return loss
            """,
    },
    "self.model(x) enters the forward of a class defined in another module": {
        "trainer.py": """
            import torch
            from models import Net

            class Trainer:
                def __init__(self):
                    self.model = Net().cuda()

                def fit(self, loader):
                    for x, y in loader:
                        out = self.model(x.cuda(non_blocking=True))
                        out.sum().backward()
                        self.optimizer.step()
            """,
        "models.py": """
            import torch

            class Net(torch.nn.Module):
                def forward(self, x):
                    if x.max() > 1:  # expect: LA103
                        x = x / x.max()
                    return x
            """,
    },
    "relative imports inside a package, and a helper module that never imports torch": {
        "pkg/__init__.py": "",
        "pkg/train.py": """
            import torch
            from .metrics import accuracy
            model = Net().cuda()
            for images, labels in train_loader:
                out = model(images.cuda(non_blocking=True))
                loss = criterion(out, labels.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
                acc = accuracy(out, labels)
            """,
        "pkg/metrics.py": """
            def accuracy(output, target):
                pred = output.argmax(1)
                return pred.eq(target).sum().item()  # expect: LA101
            """,
    },
    "a call that is not per step does not make the callee per step": {
        "train.py": """
            import torch
            import report
            model = Net().cuda()
            for x, y in train_loader:
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
            report.summarize(loss)
            """,
        "report.py": """
            import torch

            def summarize(loss):
                print(loss.item())
            """,
    },
    "two projects in one scan: each utils.py is the one beside its caller": {
        "a/train.py": """
            import torch
            import utils
            model = Net().cuda()
            for x, y in train_loader:
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
                utils.log(loss)
            """,
        "a/utils.py": """
            def log(loss):
                print(loss.item())  # expect: LA101

            def show(loss):
                print(loss.item())
            """,
        "b/train.py": """
            import torch
            import utils
            model = Net().cuda()
            for x, y in train_loader:
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
                utils.show(loss)
            """,
        "b/utils.py": """
            def log(loss):
                print(loss.item())

            def show(loss):
                print(loss.item())  # expect: LA101
            """,
    },
    "the function another module's factory returns is the step (BigGAN's GAN_training_function)": {
        "train.py": """
            import torch
            import train_fns
            model = Net().cuda()
            train = train_fns.make_train(model, optimizer)
            for x, y in stream:
                x = x.cuda(non_blocking=True)
                metrics = train(x, y)
            """,
        "train_fns.py": """
            def make_train(model, optimizer):
                def train(x, y):
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
                    return {"loss": float(loss.item())}  # expect: LA101
                return train
            """,
    },
    "what a project function returns: its host tensors stay host tensors (YOLOv3's compute_loss)": {
        "train.py": """
            import torch
            from loss import compute_loss
            model = Net().cuda()
            for imgs, targets in train_loader:
                imgs = imgs.cuda(non_blocking=True)
                loss, parts = compute_loss(model(imgs), targets)
                loss.backward()
                optimizer.step()
                print(float(parts[0]))
                print(float(loss))  # expect: LA103
            """,
        "loss.py": """
            import torch

            def to_cpu(tensor):
                return tensor.detach().cpu()  # expect: LA102

            def compute_loss(outputs, targets):
                loss = outputs.sum()
                return loss, to_cpu(torch.stack([loss, loss]))
            """,
    },
    "an object handed to another module keeps its class, through DistributedDataParallel (DeiT, MoCo)": {
        "main.py": """
            import torch
            from models import Net
            from engine import train_one_epoch
            model = Net().cuda()
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
            for epoch in range(10):
                train_one_epoch(model, train_loader, optimizer)
            """,
        "engine.py": """
            def train_one_epoch(model, loader, optimizer):
                for x, y in loader:
                    loss = model(x.cuda(non_blocking=True)).sum()
                    loss.backward()
                    optimizer.step()
            """,
        "models.py": """
            import torch

            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

                def forward(self, x):
                    ptr = int(self.ptr)  # expect: LA103
                    return x * ptr
            """,
    },
    "a method that only one class of the project defines, called on an object of unknown type": {
        "train.py": """
            import torch
            from hub import build
            model = build("tacotron")
            for batch in train_loader:
                x, y = model.parse_batch(batch)
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
        "model.py": """
            import torch

            class Tacotron(torch.nn.Module):
                def parse_batch(self, batch):
                    text, lengths = batch
                    max_len = torch.max(lengths.cuda(non_blocking=True)).item()  # expect: LA101
                    return text.cuda(non_blocking=True), lengths
            """,
    },
    "a DataLoader built in main.py and iterated by engine.py's step loop (DeiT, ConvNeXt, MAE)": {
        "main.py": """
            import torch
            from torch.utils.data import DataLoader
            from engine import train_one_epoch, evaluate
            loader = DataLoader(dataset, batch_size=64, num_workers=8)  # expect: LA201, LA204
            val_loader = DataLoader(valset, batch_size=64)  # expect: LA201
            model = Net().cuda()
            for epoch in range(100):
                train_one_epoch(model, loader, optimizer)
                evaluate(model, val_loader)
            """,
        "engine.py": """
            import torch

            def train_one_epoch(model, data_loader, optimizer):
                for samples, targets in data_loader:
                    samples = samples.cuda(non_blocking=True)
                    loss = model(samples).sum()
                    loss.backward()
                    optimizer.step()

            @torch.no_grad()
            def evaluate(model, data_loader):
                for samples, targets in data_loader:
                    output = model(samples.cuda(non_blocking=True))
            """,
    },
    "DataLoaders a dataset module builds and returns, iterated every epoch by a third module's loop (RepDistiller)": {
        "dataset/cifar100.py": """
            import torch
            from torch.utils.data import DataLoader

            def get_cifar100_dataloaders(batch_size=128):
                train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=8)  # expect: LA201, LA204
                test_loader = DataLoader(test_set, batch_size=64, shuffle=False, num_workers=2)  # expect: LA201, LA204
                once_loader = DataLoader(probe_set, batch_size=64, num_workers=2)  # expect: LA201
                return train_loader, test_loader, once_loader
            """,
        "train_student.py": """
            import torch
            from dataset.cifar100 import get_cifar100_dataloaders
            from helper.loops import train, validate
            train_loader, val_loader, once_loader = get_cifar100_dataloaders(batch_size=64)
            model = Net().cuda()
            validate(once_loader, model)
            for epoch in range(240):
                train(epoch, train_loader, model, optimizer)
                validate(val_loader, model)
            """,
        "helper/loops.py": """
            import torch

            def train(epoch, train_loader, model, optimizer):
                for input, target in train_loader:
                    loss = model(input.cuda(non_blocking=True)).sum()
                    loss.backward()
                    optimizer.step()

            def validate(val_loader, model):
                with torch.no_grad():
                    for input, target in val_loader:
                        output = model(input.cuda(non_blocking=True))
            """,
    },
    "a worker count passed from another module's command line reaches the helper's DataLoader": {
        "train.py": """
            import argparse
            import torch
            from data import get_loaders
            parser = argparse.ArgumentParser()
            parser.add_argument("--num_workers", type=int, default=8)
            opt = parser.parse_args()
            train_loader, val_loader = get_loaders(batch_size=64, num_workers=opt.num_workers)
            model = Net().cuda()
            for epoch in range(100):
                for x, y in train_loader:
                    loss = model(x.cuda(non_blocking=True)).sum()
                    loss.backward()
                    optimizer.step()
                for x, y in val_loader:
                    out = model(x.cuda(non_blocking=True))
            """,
        "data.py": """
            from torch.utils.data import DataLoader

            def get_loaders(batch_size=128, num_workers=4):
                train_loader = DataLoader(train_set, batch_size=batch_size, num_workers=num_workers, pin_memory=True)  # expect: LA204
                val_loader = DataLoader(val_set, batch_size=batch_size, num_workers=int(num_workers / 2),  # expect: LA204
                                        pin_memory=True)
                return train_loader, val_loader
            """,
    },
    "CUDA reached in a callee makes the caller's loop a CUDA loop (SPADE: train.py never says cuda)": {
        "train.py": """
            import data
            from trainer import Trainer
            loader = data.create_dataloader(opt)
            trainer = Trainer(opt)
            for epoch in range(10):
                for i, data_i in enumerate(loader):
                    trainer.run_step(data_i)
            """,
        "data/__init__.py": """
            import torch.utils.data

            def create_dataloader(opt):
                dataset = make_dataset(opt)
                return torch.utils.data.DataLoader(dataset, batch_size=opt.batch_size, num_workers=0)  # expect: LA201, LA203
            """,
        "trainer.py": """
            from model import Pix2Pix

            class Trainer:
                def __init__(self, opt):
                    self.model = Pix2Pix(opt)

                def run_step(self, data):
                    loss = self.model(data)
                    loss.backward()
                    self.optimizer.step()
                    self.last = loss.item()  # expect: LA101
            """,
        "model.py": """
            import torch

            class Pix2Pix(torch.nn.Module):
                def forward(self, data):
                    image = data["image"].cuda()  # expect: LA202
                    return self.net(image).mean()
            """,
    },
    "a method reached only through an untyped attribute, in a module the prefilter skips": {
        "train_util.py": """
            import torch
            from resample import LossAwareSampler

            class TrainLoop:
                def __init__(self, model, sampler):
                    self.model = model.cuda()
                    self.sampler = sampler

                def run(self):
                    for batch in self.loader:
                        losses = self.model(batch.cuda(non_blocking=True))
                        losses.mean().backward()
                        self.opt.step()
                        if isinstance(self.sampler, LossAwareSampler):
                            self.sampler.update_with_local_losses(losses.detach())
            """,
        "resample.py": """
            import torch as th

            class LossAwareSampler:
                def update_with_local_losses(self, local_losses):
                    losses = [x.item() for x in local_losses]  # expect: LA101
                    padded = th.zeros(len(losses)).to(local_losses)  # expect: LA205
                    self.update_with_all_losses(losses)
            """,
    },
    "a batch drawn with next() from an endless generator over the loader": {
        "train.py": """
            import torch
            from torch.utils import data
            from stream import sample_data

            def train(loader, generator, device):
                loader = sample_data(loader)
                for i in range(100_000):
                    real_img = next(loader)
                    real_img = real_img.to(device)  # expect: LA202
                    loss = generator(real_img).mean()
                    loss.backward()
                    optimizer.step()

            device = "cuda"
            loader = data.DataLoader(dataset, batch_size=16, num_workers=0)  # expect: LA201, LA203
            train(loader, Generator().to(device), device)
            """,
        "stream.py": """
            def sample_data(loader):
                while True:
                    for batch in loader:
                        yield batch
            """,
    },
    "a class imported from a package that re-exports it, whose method comes from a base in another module": {
        "train.py": """
            import torch
            from model import FasterRCNNVGG16
            net = FasterRCNNVGG16().cuda()
            for epoch in range(10):
                for imgs, sizes in test_loader:
                    boxes = net.predict(imgs.cuda(non_blocking=True))
            """,
        "model/faster_rcnn_vgg16.py": """
            from model.faster_rcnn import FasterRCNN

            class FasterRCNNVGG16(FasterRCNN):
                def __init__(self):
                    super().__init__(make_extractor(), make_head())
            """,
        "model/faster_rcnn.py": """
            import torch

            class FasterRCNN(torch.nn.Module):
                def predict(self, imgs):
                    # the boxes leave autograd as NumPy arrays: the graph is thrown away (LA501)
                    scores = torch.sigmoid(self.head(self.extractor(imgs)))  # expect: LA501
                    keep = scores[scores > 0.5]  # expect: LA105
                    return keep.cpu().numpy()  # expect: LA102
            """,
    },
    "a model that another module's method builds and returns, its head in a module named like the package": {
        "yolox/core/trainer.py": """
            import torch

            class Trainer:
                def __init__(self, exp):
                    self.exp = exp

                def train(self):
                    model = self.exp.get_model()
                    self.model = model.cuda()
                    for self.iter in range(self.max_iter):
                        inps, targets = self.prefetcher.next()
                        outputs = self.model(inps, targets)
                        outputs["total_loss"].backward()
                        self.optimizer.step()
            """,
        "yolox/exp/base.py": """
            class Exp:
                def get_model(self):
                    from yolox.models import YOLOX, YOLOXHead
                    if getattr(self, "model", None) is None:
                        self.model = YOLOX(YOLOXHead(80))
                    return self.model
            """,
        "yolox/models/yolox.py": """
            import torch.nn as nn

            class YOLOX(nn.Module):
                def __init__(self, head):
                    super().__init__()
                    self.head = head

                def forward(self, x, targets):
                    return self.head(x, targets)
            """,
        "yolox/models/yolo_head.py": """
            import torch.nn as nn

            class YOLOXHead(nn.Module):
                def forward(self, x, labels):
                    nlabel = (labels.sum(dim=2) > 0).sum(dim=1)
                    total = 0
                    for batch_idx in range(x.shape[0]):  # expect: LA301
                        num_gt = int(nlabel[batch_idx])  # expect: LA103
                        total = total + x[batch_idx].sum() * num_gt
                    return {"total_loss": total}
            """,
    },
    "an abstract method of a base class stands aside for the one class that implements it": {
        "train.py": """
            from models import create_model
            model = create_model(opt)
            for epoch in range(100):
                for i, data in enumerate(dataset):
                    model.set_input(data)
                    model.optimize_parameters()
            """,
        "models/base_model.py": """
            import torch

            class BaseModel:
                def __init__(self, opt):
                    self.device = torch.device("cuda:0")

                def set_input(self, input):
                    pass

                def optimize_parameters(self):
                    raise NotImplementedError
            """,
        "models/cycle_gan_model.py": """
            import torch
            from .base_model import BaseModel

            class CycleGANModel(BaseModel):
                def __init__(self, opt):
                    self.netG = Generator().to(torch.device("cuda:0"))

                def set_input(self, input):
                    self.real_A = input["A"]

                def optimize_parameters(self):
                    loss = self.netG(self.real_A).mean()
                    loss.backward()
                    self.optimizer.step()
                    self.losses.append(loss.item())  # expect: LA101
            """,
    },
    "networks reached through the names a container stores them under (StarGAN v2's Munch)": {
        "solver.py": """
            import torch
            from model import build_model

            def compute_d_loss(nets, x_real, y_org):
                out = nets.discriminator(x_real, y_org)
                return out.mean()

            nets = build_model(args)
            for i in range(num_iters):
                x_real, y_org = next(loader_iter)
                loss = compute_d_loss(nets, x_real.cuda(non_blocking=True), y_org.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
            """,
        "model.py": """
            import torch
            import torch.nn as nn
            from munch import Munch

            class Discriminator(nn.Module):
                def forward(self, x, y):
                    out = self.main(x)
                    idx = torch.LongTensor(range(y.size(0))).to(y.device)  # expect: LA205
                    return out[idx, y]

            def build_model(args):
                discriminator = nn.DataParallel(Discriminator(args.img_size))
                return Munch(discriminator=discriminator)
            """,
    },
    "a loader handed to a solver's constructor, kept, and iterated by its training method (StarGAN)": {
        "main.py": """
            from data_loader import get_loader
            from solver import Solver

            def main(config):
                celeba_loader = get_loader(config.image_dir, config.batch_size)
                solver = Solver(celeba_loader, config)
                solver.train()
            """,
        "data_loader.py": """
            from torch.utils.data import DataLoader

            def get_loader(image_dir, batch_size):
                dataset = CelebA(image_dir)
                data_loader = DataLoader(dataset=dataset, batch_size=batch_size, shuffle=True)  # expect: LA201, LA203
                return data_loader
            """,
        "solver.py": """
            import torch

            class Solver:
                def __init__(self, celeba_loader, config):
                    self.celeba_loader = celeba_loader
                    self.device = torch.device("cuda")

                def train(self):
                    data_loader = self.celeba_loader
                    data_iter = iter(data_loader)
                    for i in range(self.num_iters):
                        x_real, label = next(data_iter)
                        x_real = x_real.to(self.device, non_blocking=True)
                        loss = self.D(x_real).mean()
                        loss.backward()
                        self.d_optimizer.step()
            """,
    },
    "a function reached through a star import of a project module (monodepth2)": {
        "trainer.py": """
            import torch
            from layers import *

            class Trainer:
                def __init__(self, loader):
                    self.loader = loader
                    self.device = torch.device("cuda")

                def train(self):
                    for inputs in self.loader:
                        axisangle = self.model(inputs.to(self.device, non_blocking=True))
                        pose = transformation_from_parameters(axisangle)
                        loss = pose.mean()
                        loss.backward()
                        self.optimizer.step()
            """,
        "layers.py": """
            import torch

            def transformation_from_parameters(vec):
                T = torch.zeros(vec.shape[0], 4, 4).to(device=vec.device)  # expect: LA205
                return T + vec.sum()
            """,
    },
    "a loader kept by a constructor from another module, its batches moved in the step (MDM)": {
        "train.py": """
            from data import get_loader
            from loop import TrainLoop

            TrainLoop(get_loader()).run_loop()
            """,
        "data.py": """
            from torch.utils.data import DataLoader

            def get_loader():
                return DataLoader(Motions(), batch_size=64, num_workers=8, pin_memory=True, persistent_workers=True)
            """,
        "loop.py": """
            import torch
            from tqdm import tqdm

            class TrainLoop:
                def __init__(self, data):
                    self.data = data
                    self.device = torch.device("cuda")

                def run_loop(self):
                    for epoch in range(10):
                        for motion, cond in tqdm(self.data):
                            motion = motion.to(self.device)  # expect: LA202
                            self.run_step(motion, cond)

                def run_step(self, motion, cond):
                    loss = self.model(motion, cond).mean()
                    loss.backward()
                    self.opt.step()
            """,
    },
    "a model built through importlib: its forward, and what it calls, run per step (PointNet++)": {
        "train.py": """
            import importlib
            import torch
            MODEL = importlib.import_module(args.model)
            classifier = MODEL.get_model(40).cuda()
            for points, target in loader:
                pred = classifier(points.cuda(non_blocking=True))
                loss = criterion(pred, target.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
            """,
        "models/pointnet2_cls.py": """
            import torch.nn as nn
            from pointnet2_utils import SetAbstraction

            class get_model(nn.Module):
                def __init__(self, k):
                    super().__init__()
                    self.sa = SetAbstraction(512)

                def forward(self, xyz):
                    return self.sa(xyz)
            """,
        "models/pointnet2_utils.py": """
            import torch
            import torch.nn as nn

            def farthest_point_sample(xyz, npoint):
                centroids = torch.zeros(xyz.shape[0], npoint, dtype=torch.long).to(xyz.device)  # expect: LA205
                return centroids

            class SetAbstraction(nn.Module):
                def __init__(self, npoint):
                    super().__init__()
                    self.npoint = npoint

                def forward(self, xyz):
                    return farthest_point_sample(xyz, self.npoint)
            """,
    },
    "a library whose only loops run its own algorithms: the models nobody calls are not entered (kornia)": {
        "geometry/ransac.py": """
            import torch

            def resolve_batch_size(n, device):
                return 256 if device.type == "cuda" else 32

            def fit(model, points, n_batches, batch_iteration):
                points = points.to("cuda")
                best = None
                for batch_idx in range(n_batches):
                    best = model(points[batch_idx])
                for record in refine(points, batch_iteration):
                    best = record
                return best
            """,
        "core/utils.py": """
            import torch

            def check_same_device(*tensors):
                data_iter = iter(tensors)
                first = next(data_iter)
                for data in data_iter:
                    assert data.device == first.device == torch.device("cuda")
            """,
        "feature/matcher.py": """
            import torch

            class Matcher(torch.nn.Module):
                def forward(self, x):
                    return x.sum().item()
            """,
    },
    "a model nobody calls, in a project that runs a loader through models on CUDA: its forward runs per step": {
        "predict.py": """
            import torch
            model = build_model(args.arch).cuda().eval()
            with torch.no_grad():
                for images in test_loader:
                    outputs.append(model(images.cuda(non_blocking=True)))
            """,
        "models/net.py": """
            import torch

            class Net(torch.nn.Module):
                def forward(self, x):
                    return x.sum().item()  # expect: LA101
            """,
    },
    "a loss model a script builds and its loop calls from a list: an outermost model (RepDistiller's CRD)": {
        "train.py": """
            import torch
            from loops import train
            from crd.criterion import CRDLoss
            criterion_list = torch.nn.ModuleList([torch.nn.CrossEntropyLoss(), CRDLoss(128)]).cuda()
            train(model, loader, criterion_list, optimizer)
            """,
        "loops.py": """
            def train(model, loader, criterion_list, optimizer):
                criterion_kd = criterion_list[-1]
                for x, y in loader:
                    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                    loss = criterion_kd(model(x), y)
                    loss.backward()
                    optimizer.step()
            """,
        "crd/criterion.py": """
            import torch
            from .memory import ContrastMemory

            class CRDLoss(torch.nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.contrast = ContrastMemory(dim)

                def forward(self, f, y):
                    return self.contrast(f, y).mean()
            """,
        "crd/memory.py": """
            import torch

            class ContrastMemory(torch.nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.register_buffer("params", torch.tensor([dim, 0.07]))

                def forward(self, f, y):
                    T = self.params[1].item()  # expect: LA101
                    return f / T
            """,
    },
    "a model nobody calls, in a project that does not train: nothing runs per step": {
        "export.py": """
            import torch
            from net import Net
            torch.save(Net().cuda().state_dict(), "net.pt")
            """,
        "net.py": """
            import torch

            class Helper(torch.nn.Module):
                def forward(self, x):
                    return x.sum().item()
            """,
    },
}


@pytest.mark.parametrize("named", [True, False], ids=["files named", "folder walked"])
@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_project(tmp_path, name, named):
    assert_marked_findings(tmp_path, PROJECTS[name], named)


def assert_marked_findings(root: Path, files: dict[str, str], named: bool) -> None:
    """The project's scan reports exactly the lines marked `# expect: CODE`."""
    write_project(root, files)
    assert found(scan(root, named=named)) == expected(root)


def test_a_callee_scanned_alone_keeps_the_single_file_behaviour(tmp_path):
    write_project(tmp_path, PROJECTS["the step in engine.py, the loop in train.py (device from the caller)"])
    alone = analyze_many([(str(tmp_path / "engine.py"), "engine.py", True, OPTIONS)], 1).findings
    assert alone == []  # engine.py shows no sign of CUDA and no loop of its own


def test_the_finding_says_how_the_callee_is_reached(tmp_path):
    write_project(tmp_path, PROJECTS["the step in engine.py, the loop in train.py (device from the caller)"])
    (finding,) = scan(tmp_path)
    assert finding.context == "step loop `for x, y in train_loader` (train.py:5) → `train_step()` (train.py:7)"


def test_bytes_literals_and_a_bytes_dest_cost_no_file_its_analysis(tmp_path):
    """`f(loss, b"\\n")` and `add_argument(..., dest=b"dev")` once made the summary fail (bytes cannot
    be JSON, and bytes and str keys do not sort together): both files were internal errors."""
    write_project(
        tmp_path,
        {
            "train.py": """
                import argparse
                import torch
                from helpers import report

                parser = argparse.ArgumentParser()
                parser.add_argument("--dev", dest=b"dev", default="cuda")
                parser.add_argument("--workers", default=4)
                args = parser.parse_args()
                model = torch.nn.Linear(4, 2).cuda()
                for x in loader:
                    loss = model(x.cuda(non_blocking=True)).sum()
                    loss.backward()
                    report(loss, b"\\n")
            """,
            "helpers.py": """
                def report(loss, separator):
                    print(loss.item())  # expect: LA101
            """,
        },
    )
    result = scan_result(tmp_path)
    assert result.problems == []
    assert found(result.findings) == expected(tmp_path)


def test_results_do_not_depend_on_the_number_of_workers(tmp_path):
    # 16 files or more are analysed in worker processes.
    files = dict(PROJECTS["two projects in one scan: each utils.py is the one beside its caller"])
    files.update({f"filler/m{i}.py": f"import torch\nx{i} = torch.zeros({i})\n" for i in range(14)})
    write_project(tmp_path, files)
    one, two = scan(tmp_path, jobs=1), scan(tmp_path, jobs=2)
    assert [f.to_json() for f in one] == [f.to_json() for f in two]
    assert found(one) == expected(tmp_path)


def test_command_line_scan_of_a_folder_follows_imports(tmp_path):
    write_project(tmp_path, PROJECTS["relative imports inside a package, and a helper module that never imports torch"])
    result = run_cli("scan", str(tmp_path), "--output-format", "json")
    assert result.returncode == 1, result.err
    reported = json.loads(result.out)
    metrics = [f for f in reported if f["filename"].endswith("metrics.py")]
    assert [(f["code"], f["location"]["row"]) for f in metrics] == [("LA101", 3)]
    assert "train.py:9" in metrics[0]["context"] and "`accuracy()`" in metrics[0]["context"]


def test_fix_in_a_callee_uses_what_the_caller_said(tmp_path):
    write_project(
        tmp_path,
        {
            "train.py": """
            import torch
            from torch.utils.data import DataLoader
            from engine import train_epoch
            loader = DataLoader(dataset, batch_size=32, pin_memory=True)
            model = Net().cuda()
            for epoch in range(10):
                train_epoch(model, loader, "cuda")
            """,
            "engine.py": """
            def train_epoch(model, loader, device):
                for x, y in loader:
                    x = x.to(device)
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
            """,
        },
    )
    before = run_cli("scan", str(tmp_path), "--output-format", "concise", "--select", "LA202")
    assert "engine.py:3:" in before.out and "LA202" in before.out
    fixed = run_cli("scan", str(tmp_path), "--fix", "--select", "LA202")
    assert fixed.returncode == 0, fixed.out + fixed.err
    assert "x = x.to(device, non_blocking=True)" in (tmp_path / "engine.py").read_text()


def test_a_folder_scan_parses_the_files_the_prefilter_skips_when_the_project_needs_them(tmp_path):
    # Scanned as a folder, train_student.py alone shows no step loop (the loops live in helper/loops.py):
    # the prefilter skips it at first, and the project analysis brings it back.
    name = next(n for n in PROJECTS if "RepDistiller" in n)
    write_project(tmp_path, PROJECTS[name])
    result = run_cli("scan", str(tmp_path), "--output-format", "json")
    reported = {(f["filename"], f["location"]["row"], f["code"]) for f in json.loads(result.out)}
    prefix = str(tmp_path) + "/"
    assert {(path[len(prefix) :], row, code) for path, row, code in reported} == expected(tmp_path)


def test_a_project_folder_named_like_one_of_its_modules_does_not_hide_it(tmp_path):
    """RAFT: `sys.path.append('core')` then `from raft import RAFT` in raft/train.py means core/raft.py,
    not the scanned folder raft/ (which has no `__init__.py`, so it is no package)."""
    root = tmp_path / "raft"
    write_project(
        root,
        {
            "train.py": """
            import sys
            sys.path.append("core")
            import torch
            from raft import RAFT
            model = torch.nn.DataParallel(RAFT()).cuda()
            for image, flow in train_loader:
                loss = model(image.cuda(non_blocking=True)).mean()
                loss.backward()
                optimizer.step()
            """,
            "core/raft.py": """
            import torch

            class RAFT(torch.nn.Module):
                def forward(self, image):
                    grid = torch.arange(image.shape[-1]).to(image.device)  # expect: LA205
                    return self.net(image) + grid
            """,
        },
    )
    assert found(scan(root)) == expected(root)


def test_a_file_analysed_again_in_a_later_round_is_not_parsed_again(tmp_path, monkeypatch):
    """The later rounds analyse a file with new facts but the same text: its tree is reused."""
    from loopaudit.scan import engine

    write_project(tmp_path, PROJECTS["the step in engine.py, the loop in train.py (device from the caller)"])
    analysed: dict[str, int] = {}
    parsed: dict[str, int] = {}
    real_source, real_parse = engine.analyze_source, engine.collector.parse_module

    def analyze_source(text, name, *args, **kwargs):
        analysed[name] = analysed.get(name, 0) + 1
        return real_source(text, name, *args, **kwargs)

    def parse_module(text):
        parsed[text] = parsed.get(text, 0) + 1
        return real_parse(text)

    indexed: dict[int, int] = {}
    real_index = engine.build_index

    def build_index(module, *args):
        indexed[id(module)] = indexed.get(id(module), 0) + 1
        return real_index(module, *args)

    monkeypatch.setattr(engine, "analyze_source", analyze_source)
    monkeypatch.setattr(engine.collector, "parse_module", parse_module)  # the analysis' parses
    monkeypatch.setattr(engine, "build_index", build_index)
    monkeypatch.setattr(engine, "_RECENT_MODULES", engine._RecentModules(limit=1_000_000))
    assert found(scan(tmp_path)) == expected(tmp_path)
    assert max(analysed.values()) > 1  # some file was analysed in a later round
    assert set(parsed.values()) == {1}  # and no text was parsed twice

    # Re-scanned with a cache after one file changed, that file alone is analysed, round after round,
    # with no other parse between: its index is reused too (it does not depend on the facts).
    from loopaudit.scan.cache import ResultCache

    items = [(str(p), p.relative_to(tmp_path).as_posix(), True, OPTIONS) for p in sorted(tmp_path.rglob("*.py"))]
    folder = tmp_path.parent / f"{tmp_path.name}-cache"
    assert ResultCache(folder).prepare() is None
    analyze_many(items, 1, cache=ResultCache(folder))
    with (tmp_path / "engine.py").open("a") as stream:
        stream.write("# touched\n")
    analysed.clear()
    indexed.clear()
    assert found(analyze_many(items, 1, cache=ResultCache(folder)).findings) == expected(tmp_path)
    assert analysed == {"engine.py": analysed["engine.py"]} and analysed["engine.py"] > 1
    assert list(indexed.values()) == [1]

    parsed.clear()  # with no room for a tree, every analysis parses: the bound is kept
    analysed.clear()
    monkeypatch.setattr(engine, "_RECENT_MODULES", engine._RecentModules(limit=10))
    assert found(scan(tmp_path)) == expected(tmp_path)
    # (the bytes parsed are origins.py's, reading line numbers)
    assert sum(count for text, count in parsed.items() if isinstance(text, str)) == sum(analysed.values())


def test_the_sources_of_a_known_library_are_its_own_in_any_layout(tmp_path):
    """`is_library`: installed (site-packages/torch), a flat clone (timm/timm/), a src-layout clone
    (diffusers/src/diffusers/) and a clone in a folder named like a package all count; a user's own
    package, in src/ or not, a src/ that is itself a package, and a project's own folder named like a
    library (melgan's datasets/) do not."""
    from loopaudit.analysis.layout import ProjectLayout

    files = [
        "site-packages/torch/__init__.py",
        "site-packages/torch/nn/__init__.py",
        "site-packages/torch/nn/linear.py",
        "timm/timm/__init__.py",
        "timm/timm/models/__init__.py",
        "timm/timm/models/resnet.py",
        "timm/train.py",
        "diffusers/src/diffusers/__init__.py",
        "diffusers/src/diffusers/models/__init__.py",
        "diffusers/src/diffusers/models/unet.py",
        "diffusers/examples/train_unet.py",
        "mine/src/myproj/__init__.py",
        "mine/src/myproj/model.py",
        "mine/train.py",
        "odd/src/__init__.py",
        "odd/src/diffusers/__init__.py",
        "odd/src/diffusers/unet.py",
        "hf/datasets/src/datasets/__init__.py",
        "hf/datasets/src/datasets/arrow_dataset.py",
        "venv/site-packages/accelerate/__init__.py",
        "venv/site-packages/accelerate-1.0.dist-info/METADATA",
        "peft/pyproject.toml",
        "peft/peft/__init__.py",
    ]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    layout = ProjectLayout(str(tmp_path / name) for name in files)
    libraries = {name for name in files if layout.is_library(str(tmp_path / name))}
    assert libraries == {
        "site-packages/torch/__init__.py",
        "site-packages/torch/nn/__init__.py",
        "site-packages/torch/nn/linear.py",
        "timm/timm/__init__.py",
        "timm/timm/models/__init__.py",
        "timm/timm/models/resnet.py",
        "diffusers/src/diffusers/__init__.py",
        "diffusers/src/diffusers/models/__init__.py",
        "diffusers/src/diffusers/models/unet.py",
        "hf/datasets/src/datasets/__init__.py",
        "hf/datasets/src/datasets/arrow_dataset.py",
        "venv/site-packages/accelerate/__init__.py",
        "peft/peft/__init__.py",
    }
    # A research repository's own datasets/ beside its scripts is what they import, not Hugging Face's.
    own = ["melgan/datasets/dataloader.py", "melgan/trainer.py"]
    for name in own:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    layout = ProjectLayout(str(tmp_path / name) for name in own)
    assert not layout.is_library(str(tmp_path / own[0])) and "datasets" not in layout.libraries


# A training script on CUDA whose model comes from somewhere the scan cannot follow.
CUDA_TRAINING = """
    import torch
    model = build().cuda()
    for x in loader:
        loss = model(x.cuda(non_blocking=True)).sum()
        loss.backward()
        optimizer.step()
    """


def test_a_library_cloned_in_the_src_layout_is_not_the_project_of_its_examples(tmp_path):
    """Scanning a clone of diffusers: its examples train on CUDA, but the library's models are
    analysed as files of their own, as they would be installed: nobody's unseen caller enters them."""
    model = """
        import torch
        import torch.nn as nn

        class UNet(nn.Module):
            def forward(self, x):
                if x.sum().item() > 0:{mark}
                    x = x * 2
                return x
        """
    for package, mark in (("diffusers", ""), ("myproj", "  # expect: LA101")):
        root = tmp_path / package
        write_project(
            root,
            {
                f"src/{package}/__init__.py": "",
                f"src/{package}/models/__init__.py": "",
                f"src/{package}/models/unet.py": model.replace("{mark}", mark),
                "examples/train.py": CUDA_TRAINING,
            },
        )
        assert found(scan(root, named=False)) == expected(root), package


def test_a_scan_of_several_repositories_runs_each_ones_models_by_its_own_training(tmp_path):
    """A folder holding two clones (each with its packaging): the training of one does not make the
    models nobody calls in the other per-step. Without the markers it is one project, and they are."""
    model = """
        import torch

        class Matcher(torch.nn.Module):
            def forward(self, x):
                return x.sum().item(){mark}
        """
    for marked, mark in ((True, ""), (False, "  # expect: LA101")):
        root = tmp_path / ("marked" if marked else "unmarked")
        write_project(
            root, {"trainer/train.py": CUDA_TRAINING, "vision/vision/matcher.py": model.replace("{mark}", mark)}
        )
        if marked:
            (root / "trainer" / ".git").mkdir()
            (root / "vision" / "pyproject.toml").write_text("[project]\nname = 'vision'\n")
        assert found(scan(root, named=False)) == expected(root), marked


def test_repositories_are_the_outermost_marked_folders_below_the_scan(tmp_path):
    """A CUDA extension with a setup.py of its own inside a repository stays part of it; a scan of
    one repository is one project."""
    from loopaudit.analysis.layout import ProjectLayout

    files = ["a/train.py", "a/models/ops/setup_helpers.py", "a/models/net.py", "b/lib/model.py", "loose.py"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    for marker in ("a/setup.py", "a/models/ops/setup.py", "b/setup.cfg"):
        (tmp_path / marker).write_text("")
    layout = ProjectLayout(str(tmp_path / name) for name in files)
    repository = {name: layout.repository_of(str(tmp_path / name)) for name in files}
    assert repository["a/train.py"] == repository["a/models/ops/setup_helpers.py"] == repository["a/models/net.py"]
    assert len({repository["a/train.py"], repository["b/lib/model.py"], repository["loose.py"]}) == 3
    alone = ProjectLayout(str(tmp_path / name) for name in files if name.startswith("a/"))
    assert len({alone.repository_of(str(tmp_path / name)) for name in files if name.startswith("a/")}) == 1


def test_importing_a_module_with_an_algorithm_loop_does_not_make_a_file_parsed(tmp_path, monkeypatch):
    """A module that imports one whose functions train, or hold a step loop that feeds models, is
    parsed even when the prefilter rules it out (its loop may be a step loop through them). A
    library's counted algorithm loop (kornia's batched RANSAC in its core utilities, which every
    module imports) is not training: the files importing it stay unparsed."""
    from loopaudit.scan import engine

    batched = """
        import torch

        def run_batched(model, points, n_batches):
            points = points.to("cuda")
            for batch_idx in range(n_batches):
                out = model(points[batch_idx])
            return out
        """
    importer = """
        from core import run_batched

        def total(values):
            result = 0
            for value in values:
                result += value
            return result
        """
    analysed: set[str] = set()
    real = engine._apply_rules

    def apply_rules(module, text, name, *args, **kwargs):
        analysed.add(name)
        return real(module, text, name, *args, **kwargs)

    monkeypatch.setattr(engine, "_apply_rules", apply_rules)
    training = batched.replace("out = model(points[batch_idx])", "model(points[batch_idx]).sum().backward()")
    for core, parsed_importer in ((batched, False), (training, True)):
        root = tmp_path / ("trains" if parsed_importer else "algorithm")
        write_project(root, {"core.py": core, "user.py": importer})
        analysed.clear()
        scan(root, named=False)
        assert ("user.py" in analysed) == parsed_importer, parsed_importer


def test_models_are_parsed_only_where_their_repository_trains_on_cuda(tmp_path, monkeypatch):
    """The prefilter leaves a model file with no step code to the project, which asks for every
    model of a repository that trains on CUDA (an unseen caller may run its forward) and for none
    elsewhere: a library's models (kornia's) are not parsed for nothing. A model file that cannot
    be parsed does not hold the others back."""
    from loopaudit.scan import engine

    analysed: set[str] = set()
    real = engine._apply_rules

    def apply_rules(module, text, name, *args, **kwargs):
        analysed.add(name)
        return real(module, text, name, *args, **kwargs)

    monkeypatch.setattr(engine, "_apply_rules", apply_rules)
    model = """
        import torch

        class Matcher(torch.nn.Module):
            def forward(self, x):
                return x.sum().item(){mark}
        """
    algorithm = """
        import torch

        def fit(model, points, n_batches):
            points = points.to("cuda")
            for batch_idx in range(n_batches):
                best = model(points[batch_idx])
            return best
        """
    for trains in (False, True):
        root = tmp_path / ("trains" if trains else "library")
        write_project(
            root,
            {
                "geometry/ransac.py": CUDA_TRAINING if trains else algorithm,
                "feature/matcher.py": model.replace("{mark}", "  # expect: LA101" if trains else ""),
                "feature/broken.py": "import torch\nclass Broken(torch.nn.Module):\n    def forward(self, x) return x\n",
            },
        )
        analysed.clear()
        findings = found(scan(root, named=False))
        assert ("feature/matcher.py" in analysed) == trains
        assert {f for f in findings if f[2] != "LA001"} == expected(root)
        assert any(f[0] == "feature/broken.py" for f in findings) == trains  # asked for: its syntax error shows
