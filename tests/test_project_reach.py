"""Per-step reach across a project's modules, for the code shapes of projects labelled by others
(issue 23): receivers of unknown type, overridden methods, registries, settings and devices declared
in another module, training under a cadence guard, inference loops over data that is no DataLoader.

Each case is a small project; lines marked `# expect: CODE` must be reported, and nothing else may be
(the helpers are test_project.py's).
"""

from __future__ import annotations

import pytest

from .test_project import assert_marked_findings, scan, write_project

CASES = {
    "a method called on an object a config builds: every project method of that name the call fits": {
        "train.py": """
            import torch
            import hydra
            from logger import Meter

            agent = hydra.utils.instantiate(cfg.agent)
            meter = Meter()
            metrics = {}
            for step in range(1000):
                batch = next(replay_iter)
                out = agent.update(batch, step)
                metrics.update(out)
                meter.update(out["loss"], 1)
        """,
        "agents.py": """
            import torch

            class DrQAgent:
                def __init__(self):
                    self.critic = torch.nn.Linear(4, 1).cuda()
                    self.opt = torch.optim.Adam(self.critic.parameters())

                def update(self, replay_iter, step):
                    loss = self.critic(torch.randn(4, device="cuda")).sum()
                    loss.backward()
                    self.opt.step()
                    return {"loss": loss.item()}  # expect: LA101

                def act(self, obs):
                    return self.critic(obs).argmax().item()
        """,
        "logger.py": """
            class Meter:
                def update(self, value, n=1):
                    self.total = value * n

            class Table:
                def update(self):
                    print("refreshed")
        """,
    },
    "a method a base class calls on self runs a subclass's override (mdistiller's trainers)": {
        "trainer.py": """
            import torch

            class BaseTrainer:
                def __init__(self, model, loader):
                    self.model = model.cuda()
                    self.loader = loader
                    self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

                def train(self):
                    for epoch in range(10):
                        for data in self.loader:
                            self.train_iter(data)

                def train_iter(self, data):
                    loss = self.model(data.cuda(non_blocking=True)).sum()
                    loss.backward()
                    self.opt.step()
        """,
        "crd.py": """
            from trainer import BaseTrainer

            class CRDTrainer(BaseTrainer):
                def train_iter(self, data):
                    loss = self.model(data.cuda(non_blocking=True)).sum()
                    loss.backward()
                    print(loss.cpu().numpy())  # expect: LA102
        """,
    },
    "loaders returned through a dataset factory, handed to a trainer picked from a registry (mdistiller)": {
        "lib/data/cifar.py": """
            from torch.utils.data import DataLoader

            def get_loaders(batch_size, num_workers):
                train = DataLoader(range(10), batch_size=batch_size, num_workers=num_workers)  # expect: LA201, LA204
                return train, 10
        """,
        "lib/data/__init__.py": """
            from .cifar import get_loaders

            def get_dataset(cfg):
                train_loader, n = get_loaders(cfg.BATCH, 8)
                return train_loader, n
        """,
        "lib/engine/trainer.py": """
            import torch

            class Trainer:
                def __init__(self, model, train_loader):
                    self.model = model
                    self.train_loader = train_loader
                    self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

                def train(self):
                    for epoch in range(10):
                        self.train_epoch()

                def train_epoch(self):
                    for data in self.train_loader:
                        loss = self.model(data.cuda(non_blocking=True)).sum()
                        loss.backward()
                        self.opt.step()
        """,
        "lib/engine/__init__.py": """
            from .trainer import Trainer
            trainer_dict = {"base": Trainer}
        """,
        "tools/train.py": """
            import torch
            from lib.data import get_dataset
            from lib.engine import trainer_dict

            def main(cfg):
                train_loader, n = get_dataset(cfg)
                model = torch.nn.Linear(3, 3).cuda()
                trainer = trainer_dict[cfg.TRAINER](model, train_loader)
                trainer.train()
        """,
    },
    "worker counts declared in another module: an argparse default, a config object's key": {
        "run.py": """
            import argparse
            import torch
            from exp import Exp

            parser = argparse.ArgumentParser()
            parser.add_argument("--num_workers", type=int, default=10)
            args = parser.parse_args()
            Exp(args).train()
        """,
        "exp.py": """
            import torch
            from data_factory import data_provider

            class Exp:
                def __init__(self, args):
                    self.args = args
                    self.model = torch.nn.Linear(3, 3).cuda()
                    self.opt = torch.optim.Adam(self.model.parameters())

                def train(self):
                    loader = data_provider(self.args)
                    for epoch in range(10):
                        for x in loader:
                            loss = self.model(x.cuda(non_blocking=True)).sum()
                            loss.backward()
                            self.opt.step()
        """,
        "data_factory.py": """
            from torch.utils.data import DataLoader
            from hparams import hparams

            def data_provider(args):
                return DataLoader(range(10), num_workers=args.num_workers, pin_memory=True)  # expect: LA204

            def other_provider():
                return DataLoader(range(10), num_workers=hparams.workers, pin_memory=True)
        """,
        "hparams.py": """
            class HParams:
                def __init__(self, **kwargs):
                    self.__dict__.update(kwargs)

            hparams = HParams(workers=16, batch_size=8)
        """,
    },
    "CUDA named in one module and used in another, training under a cadence guard (Rainbow)": {
        "main.py": """
            import torch
            from agent import Agent

            args.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            dqn = Agent(args)
            for T in range(1, args.T_max + 1):
                action = dqn.act(state)
                state = env.step(action)
                if T % args.replay_frequency == 0:
                    dqn.learn(mem)
                if T % args.evaluation_interval == 0:
                    dqn.evaluate(state)
        """,
        "agent.py": """
            import torch

            class Agent:
                def __init__(self, args):
                    self.net = torch.nn.Linear(4, 2).to(device=args.device)
                    self.opt = torch.optim.Adam(self.net.parameters())

                def act(self, state):
                    # the action leaves autograd at once: no graph is needed (LA501)
                    return self.net(state).argmax(1).item()  # expect: LA101, LA501

                def learn(self, mem):
                    loss = self.net(mem.sample()).sum()
                    self.opt.zero_grad()
                    loss.backward()
                    self.opt.step()
                    mem.update_priorities(loss.detach().cpu().numpy())  # expect: LA102

                def evaluate(self, state):
                    return self.net(state).max(1)[0].item()
        """,
    },
    "inference loops over a batch generator, a file list and a dataset by index; data converted then moved": {
        "inference.py": """
            import numpy as np
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"

            def datagen(frames, mels):
                batch = []
                for frame in frames:
                    batch.append(frame)
                    if len(batch) == 8:
                        yield np.asarray(batch)
                        batch = []

            @torch.no_grad()
            def main(frames, mels, filelist, dataset):
                model = torch.nn.Linear(3, 3).to(device)
                for i, img_batch in enumerate(datagen(frames, mels)):
                    img = torch.FloatTensor(np.transpose(img_batch, (0, 2, 1))).to(device)  # expect: LA202
                    pred = model(img)
                    pred = pred.cpu().numpy()  # expect: LA102
                for filename in filelist:
                    wav = torch.FloatTensor(np.load(filename)).to(device)  # expect: LA202
                    out = model(wav)
                for i in range(len(dataset)):
                    data = dataset[i]
                    out = model(data["img"].cuda())  # expect: LA202
                for chunk in [frames[:8], frames[8:]]:
                    print(len(chunk))
        """,
    },
    "a replay buffer's sampled rows, converted and moved in the step (TD3)": {
        "main.py": """
            import torch
            import utils
            import TD3

            buffer = utils.ReplayBuffer(3, 1)
            policy = TD3.TD3(3, 1)
            for t in range(int(1e6)):
                buffer.add(t)
                policy.train(buffer, 256)
        """,
        "TD3.py": """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

            class TD3:
                def __init__(self, state_dim, action_dim):
                    self.actor = torch.nn.Linear(state_dim, action_dim).to(device)
                    self.opt = torch.optim.Adam(self.actor.parameters())

                def train(self, replay_buffer, batch_size=256):
                    state, action = replay_buffer.sample(batch_size)
                    loss = self.actor(state).sum()
                    loss.backward()
                    self.opt.step()
        """,
        "utils.py": """
            import numpy as np
            import torch

            class ReplayBuffer:
                def __init__(self, state_dim, action_dim):
                    self.state = np.zeros((1000, state_dim))
                    self.action = np.zeros((1000, action_dim))
                    self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

                def add(self, t):
                    self.size = t

                def sample(self, batch_size):
                    ind = np.random.randint(0, self.size, size=batch_size)
                    return (
                        torch.FloatTensor(self.state[ind]).to(self.device),  # expect: LA202
                        torch.FloatTensor(self.action[ind]).to(self.device),  # expect: LA202
                    )
        """,
    },
    "an attribute bound to a library module or a project class by configuration: the project's forward runs": {
        "model.py": """
            import torch
            import torch.nn as nn
            from prediction import Attention

            class Model(nn.Module):
                def __init__(self, opt):
                    super().__init__()
                    if opt.Prediction == "CTC":
                        self.Prediction = nn.Linear(8, 4)
                    else:
                        self.Prediction = Attention(8, 4)

                def forward(self, x):
                    return self.Prediction(x)
        """,
        "prediction.py": """
            import torch
            import torch.nn as nn
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

            class Attention(nn.Module):
                def __init__(self, i, o):
                    super().__init__()
                    self.cell = nn.Linear(i, o)

                def forward(self, x):
                    hidden = torch.FloatTensor(x.size(0), 4).fill_(0).to(device)  # expect: LA205
                    return self.cell(x) + hidden
        """,
        "train.py": """
            import torch
            from model import Model
            model = Model(opt).cuda()
            optimizer = torch.optim.Adam(model.parameters())
            for x in loader:
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
        """,
    },
    "a name rebound after the read does not decide what the read sees; a setting named like a loss": {
        "model.py": """
            import torch

            def forward_gru(x, masks, fmax_loss=None):
                has_zeros = (masks[1:] == 0.0).any(dim=-1).nonzero().squeeze().cpu()  # expect: LA102, LA105
                if has_zeros.dim() == 0:
                    has_zeros = [has_zeros.item() + 1]
                else:
                    has_zeros = (has_zeros + 1).numpy().tolist()
                has_zeros = [0] + has_zeros
                key = str(fmax_loss)
                return x
        """,
        "train.py": """
            import torch
            from model import forward_gru
            net = torch.nn.Linear(3, 3).cuda()
            optimizer = torch.optim.Adam(net.parameters())
            for x, m in loader:
                out = forward_gru(net(x.cuda(non_blocking=True)), net(m.cuda(non_blocking=True)), 8000)
                out.sum().backward()
                optimizer.step()
        """,
    },
    "a loader with one worker per CPU, cycled forever by the trainer (denoising-diffusion-pytorch)": {
        "trainer.py": """
            from multiprocessing import cpu_count
            import torch
            from torch.utils.data import DataLoader

            def cycle(dl):
                while True:
                    for data in dl:
                        yield data

            class Trainer:
                def __init__(self, model, dataset):
                    self.model = model.cuda()
                    dl = DataLoader(dataset, batch_size=32, shuffle=True, pin_memory=True, num_workers=cpu_count())  # expect: LA204
                    self.dl = cycle(dl)
                    self.opt = torch.optim.Adam(model.parameters())

                def train(self):
                    for step in range(100000):
                        data = next(self.dl).cuda(non_blocking=True)
                        loss = self.model(data).sum()
                        loss.backward()
                        self.opt.step()
        """,
    },
    "a rule that holds everywhere sees a model file with no step code (deprecated torch.cuda.amp)": {
        "train.py": """
            import torch
            from blocks import helper
            model = torch.nn.Linear(3, 3).cuda()
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
        """,
        "blocks.py": """
            import torch

            def helper(x):
                with torch.cuda.amp.autocast(enabled=False):  # expect: LA502
                    return x.float()
        """,
    },
    "debugging branches and options no caller turns on are not per-step; a verbose flag on by default is": {
        "evaluate.py": """
            import torch

            def validate(model, dataset, warm_start=False, flip=False):
                for i in range(len(dataset)):
                    image = dataset[i].cuda(non_blocking=True)
                    flow = model(image)  # expect: LA501
                    if warm_start:
                        prev = flow.cpu().numpy()
                    if flip:
                        mirrored = flow.flip(0).cpu()  # expect: LA102
                    if args.debug:
                        print(flow.sum().item())
                    if opt.debug > 0:
                        show(flow.cpu())
                    if args.debug_loss and "name" in image_info:
                        print(flow.mean().item())
        """,
        "fit.py": """
            import torch

            def fit(model, loader, optimizer, verbose=1):
                for x, y in loader:
                    out = model(x.cuda(non_blocking=True))
                    loss = torch.nn.functional.mse_loss(out, y.cuda(non_blocking=True))
                    loss.backward()
                    optimizer.step()
                    if verbose > 0:
                        print(loss.item())  # expect: LA101
        """,
        "main.py": """
            import torch
            from evaluate import validate
            model = torch.nn.Linear(3, 3).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                for x in train_loader:
                    model(x.cuda(non_blocking=True)).sum().backward()
                    optimizer.step()
                validate(model, val_dataset, flip=True)
        """,
    },
    "inference one batch at a time: a range stepped by the batch size, a method of the project's model": {
        "scores.py": """
            import torch
            from syncnet import SyncNet

            class Scorer:
                def __init__(self):
                    self.net = SyncNet().cuda()

                def evaluate(self, frames, batch_size):
                    feats = []
                    for i in range(0, len(frames), batch_size):
                        batch = torch.cat(frames[i:i + batch_size], 0)
                        out = self.net.forward_lip(batch.cuda())  # expect: LA501
                        feats.append(out.cpu())  # expect: LA102
                    return feats
        """,
        "syncnet.py": """
            import torch

            class SyncNet(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lip = torch.nn.Linear(4, 4)

                def forward_lip(self, x):
                    return self.lip(x)
        """,
    },
    "what an inference loop loads from each file and converts is the step's batch": {
        "inference.py": """
            import os
            import torch
            from utils import load_wav

            device = torch.device("cuda")
            generator = torch.nn.Linear(4, 4).to(device)
            filelist = os.listdir("wavs")
            with torch.no_grad():
                for i, filename in enumerate(filelist):
                    wav, sr = load_wav(os.path.join("wavs", filename))
                    wav = wav / 32768.0
                    x = torch.FloatTensor(wav).to(device)  # expect: LA202
                    y = generator(x)
        """,
        "utils.py": """
            import numpy as np

            def load_wav(path):
                return np.load(path), 22050
        """,
    },
    "a loop that hands each item to an evaluation method is an evaluation loop; a few settings are not": {
        "agent.py": """
            import torch

            class Agent:
                def __init__(self):
                    self.net = torch.nn.Linear(4, 2).cuda()

                def evaluate_q(self, state):
                    with torch.no_grad():
                        return self.net(state.unsqueeze(0)).max(1)[0].item()  # expect: LA101

            def test(agent, val_states):
                qs = []
                for state in val_states:
                    qs.append(agent.evaluate_q(state))
                return sum(qs) / len(qs)

            @torch.no_grad()
            def render(agent, states, scale):
                return agent.net(states * scale).cpu()

            def debug_images(agent, states):
                for scale in [0.5, 1.0, 2.0]:
                    render(agent, states, scale)

            agent = Agent()
            optimizer = torch.optim.Adam(agent.net.parameters())
            for epoch in range(10):
                for states in train_loader:
                    agent.net(states.cuda(non_blocking=True)).sum().backward()
                    optimizer.step()
                test(agent, torch.load("val.pt"))
                debug_images(agent, torch.load("val.pt"))
        """,
    },
    "branches for other devices, a model's config and device flags are not syncs on CUDA": {
        "train.py": """
            import torch

            def unwrap_model(model):
                return model.module if hasattr(model, "module") else model

            device = torch.device("cuda")
            model = torch.nn.Linear(4, 4).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            is_npu = device.type == "npu" and torch.npu.is_available()
            for x in loader:
                x = x.to(device, non_blocking=True)
                if unwrap_model(model).config.in_channels == 8:
                    x = torch.cat([x, x], dim=1)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                if device.type == "cuda":
                    pass
                elif device.type == "npu":
                    torch.npu.synchronize()
                if is_npu:
                    print(loss.item())
        """,
    },
    "a base class in a module without steps sets the device its subclasses copy to (st-gcn)": {
        "processor/io.py": """
            import torch

            class IO:
                def __init__(self, use_gpu=True):
                    self.dev = "cuda:0" if use_gpu else "cpu"

                def load_model(self, model):
                    self.model = model.to(self.dev)
        """,
        "processor/recognition.py": """
            import torch
            from .io import IO

            class Recognition(IO):
                def train(self, loader, optimizer):
                    for data, label in loader:
                        data = data.to(self.dev, non_blocking=True)
                        label = label.to(self.dev, non_blocking=True)
                        loss = torch.nn.functional.cross_entropy(self.model(data), label)
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
                        print(loss.item())  # expect: LA101
        """,
        "processor/__init__.py": "",
    },
    "a loader factory that hands back another module's factory's result (Swin's data/__init__.py)": {
        "data/build.py": """
            import torch

            def build_loader(config):
                dataset = make_dataset(config)
                loader = torch.utils.data.DataLoader(  # expect: LA204
                    dataset, batch_size=64, num_workers=8, pin_memory=True,
                )
                return dataset, loader
        """,
        "data/__init__.py": """
            from .build import build_loader as _build_loader

            def build_loader(config, simmim=False):
                if not simmim:
                    return _build_loader(config)
                return None
        """,
        "main.py": """
            import torch
            from data import build_loader

            model = torch.nn.Linear(4, 4).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            dataset, loader = build_loader(config)
            for epoch in range(100):
                for x in loader:
                    model(x.cuda(non_blocking=True)).sum().backward()
                    optimizer.step()
        """,
    },
    "a loader iterated through `with tqdm(...) as t:` (DeepCTR-Torch's fit)": {
        "basemodel.py": """
            import torch
            from torch.utils.data import DataLoader
            from tqdm import tqdm

            class BaseModel(torch.nn.Module):
                def fit(self, dataset, epochs, optimizer, verbose=1):
                    train_loader = DataLoader(dataset, batch_size=256, num_workers=4, persistent_workers=True)  # expect: LA201
                    for epoch in range(epochs):
                        with tqdm(enumerate(train_loader), disable=verbose != 1) as t:
                            for _, (x_train, y_train) in t:
                                x = x_train.to("cuda", non_blocking=True)
                                loss = self(x).sum()
                                loss.backward()
                                optimizer.step()
        """,
    },
    "a function handed to a helper that calls it once per iteration runs per step (U-ViT's sample2dir)": {
        "train.py": """
            import torch
            from evaluate import evaluate, model

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                optimizer.step()
                if step % 10000 == 0:
                    evaluate(config)
        """,
        "utils.py": """
            def sample2dir(path, n_samples, batch_size, sample_fn):
                for _ in range(n_samples // batch_size):
                    samples = sample_fn(batch_size)
                    save(samples, path)
        """,
        "evaluate.py": """
            import torch
            import utils
            import solver

            model = torch.nn.Linear(4, 4).cuda()

            def evaluate(config):
                def sample_fn(n):
                    x = torch.randn(n, 4, device="cuda")
                    return solver.sample(model, x)
                utils.sample2dir(config.path, config.n_samples, 8, sample_fn)
        """,
        "solver.py": """
            import torch

            def sample(model_fn, x, orders=(3, 3, 2, 1), skip_type="logSNR"):
                timesteps = get_time_steps(skip_type, len(orders), x.device)
                for i, order in enumerate(orders):
                    vec = torch.ones((x.shape[0],)).to(x.device) * timesteps[i]  # expect: LA205
                    x = update(model_fn, x, vec, order)
                return x

            def update(model_fn, x, t, order):
                for _ in range(order):
                    x = x - model_fn(x + t[:, None])
                return x

            def get_time_steps(skip_type, n, device):
                if skip_type == "logSNR":
                    return torch.linspace(0.0, 1.0, n + 1).to(device)  # expect: LA205
                elif skip_type == "time_uniform":
                    return torch.linspace(1.0, 0.0, n + 1).to(device)
                else:
                    return torch.ones(n + 1).to(device)
        """,
    },
    "a function whose steps a CUDA script runs works on CUDA, though it never names a device": {
        "main.py": """
            import torch
            from engine import train_one_epoch

            model = torch.nn.Linear(4, 4).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                train_one_epoch(model, optimizer, steps=100)
        """,
        "engine.py": """
            import torch

            def train_one_epoch(model, optimizer, steps):
                for i in range(steps):
                    loss = model(torch.randn(8, 4)).sum()
                    loss.backward()
                    optimizer.step()
                    print(loss.item())  # expect: LA101
        """,
    },
    "only the arms that a caller's option (or its default) selects run per step": {
        "train.py": """
            import torch
            from schedule import NoiseSchedule, diffusion_loss

            model = torch.nn.Linear(4, 4).cuda()
            schedule = NoiseSchedule("discrete")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x = x.cuda(non_blocking=True)
                loss = diffusion_loss(model, schedule, x, adaptive=False)
                loss.backward()
                optimizer.step()
        """,
        "schedule.py": """
            import torch

            class NoiseSchedule:
                def __init__(self, kind="linear"):
                    self.kind = kind

                def lam(self, t):
                    if self.kind == "linear":
                        return torch.zeros((1,)).to(t)
                    elif self.kind == "discrete":
                        return torch.ones((1,)).to(t)  # expect: LA205
                    else:
                        return torch.full((1,), 2.0).to(t)

            def diffusion_loss(model, schedule, x, adaptive=True):
                t = torch.rand(x.shape[0], device=x.device)
                if adaptive:
                    t = t + torch.rand(1).to(x.device)
                return model(x).sum() * schedule.lam(t).sum()
        """,
    },
    "a loader a class keeps and a method hands back, iterated every epoch elsewhere (pix2pixHD)": {
        "data/loader.py": """
            import torch.utils.data

            class CustomDatasetDataLoader:
                def initialize(self, dataset):
                    self.dataloader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)  # expect: LA201, LA204

                def load_data(self):
                    return self.dataloader

            def create_loader(dataset):
                loader = CustomDatasetDataLoader()
                loader.initialize(dataset)
                return loader
        """,
        "train.py": """
            import torch
            from data.loader import create_loader

            model = torch.nn.Linear(4, 1).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            dataset = create_loader(make_dataset()).load_data()
            for epoch in range(100):
                for data in dataset:
                    loss = model(data.cuda(non_blocking=True)).sum()
                    loss.backward()
                    optimizer.step()
        """,
    },
    "an agent's act() whose callers in another module run it under no_grad, and one whose callers do not": {
        "agents.py": """
            import torch

            class DrQAgent:
                def __init__(self):
                    self.actor = torch.nn.Linear(4, 2).cuda()

                def act(self, obs):
                    return self.actor(torch.as_tensor(obs, device="cuda")).cpu().numpy()  # expect: LA102

                def explore(self, obs):
                    return self.actor(torch.as_tensor(obs, device="cuda")).cpu().numpy()  # expect: LA102, LA501

                def update(self, batch):
                    self.actor(batch).sum().backward()
        """,
        "train.py": """
            import torch
            from agents import DrQAgent

            agent = DrQAgent()
            for step in range(1000):
                with torch.no_grad():
                    action = agent.act(obs)
                noisy = agent.explore(obs)
                obs = env.step(action)
                agent.update(replay.sample())
        """,
    },
    "loader settings read from the YAML configurations the repository ships (ParallelWaveGAN)": {
        "conf/base.yaml": """
            batch_size: 8
            num_workers: 2              # Number of workers in Pytorch DataLoader.
            pin_memory: true
        """,
        "conf/large.yaml": """
            num_workers: 4
            pin_memory: true
        """,
        "conf/debug.yaml": """
            num_workers: 2
        """,
        "conf/cpu.yaml": """
            num_workers: 0
        """,
        "model.py": """
            import torch

            def build():
                return torch.nn.Linear(4, 1).cuda()
        """,
        "train.py": """
            import torch
            import yaml
            from torch.utils.data import DataLoader
            from model import build

            config = yaml.safe_load(open(args.config))
            model = build()
            loader = DataLoader(  # expect: LA204
                dataset, batch_size=config["batch_size"], num_workers=config["num_workers"],
                pin_memory=config["pin_memory"],
            )
            for epoch in range(100):
                for x in loader:
                    model(x.cuda(non_blocking=True)).sum().backward()
        """,
    },
    "a class named like a function, its forward inherited from a base class in another module (faster-rcnn.pytorch)": {
        "trainval_net.py": """
            import torch
            import torch.nn as nn
            from model.faster_rcnn.vgg16 import vgg16

            fasterRCNN = vgg16(21)
            fasterRCNN = nn.DataParallel(fasterRCNN)
            fasterRCNN.cuda()
            optimizer = torch.optim.SGD(fasterRCNN.parameters(), lr=0.01)
            for step in range(1000):
                im_data = torch.randn(1, 3, 600, 800, device="cuda")
                loss = fasterRCNN(im_data)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """,
        "model/__init__.py": "",
        "model/faster_rcnn/__init__.py": "",
        "model/faster_rcnn/faster_rcnn.py": """
            import torch.nn as nn
            from model.rpn.anchor_target_layer import _AnchorTargetLayer

            class _fasterRCNN(nn.Module):
                def __init__(self, classes):
                    super().__init__()
                    self.classes = classes
                    self.anchor_target = _AnchorTargetLayer()

                def forward(self, im_data):
                    return self.anchor_target(im_data, im_data.new(1, 20, 5).zero_())
        """,
        "model/faster_rcnn/vgg16.py": """
            from model.faster_rcnn.faster_rcnn import _fasterRCNN

            class vgg16(_fasterRCNN):
                def __init__(self, classes):
                    _fasterRCNN.__init__(self, classes)
        """,
        "model/rpn/__init__.py": "",
        "model/rpn/anchor_target_layer.py": """
            import torch
            import torch.nn as nn

            class _AnchorTargetLayer(nn.Module):
                def forward(self, scores, gt_boxes):
                    labels = self._sample(gt_boxes)
                    return scores.sum() + labels.sum()

                def _sample(self, gt_boxes):
                    # Two helpers deep from forward's input, through a chain of tensor methods.
                    labels = gt_boxes[:, :, 4].contiguous().view(-1).view(gt_boxes.size(0), -1)
                    labels_batch = labels.new(gt_boxes.size(0), 256).zero_()
                    return self._regression_labels(labels_batch)

                def _regression_labels(self, labels_batch):
                    clss = labels_batch
                    for b in range(clss.size(0)):  # expect: LA301
                        if clss[b].sum() == 0:  # expect: LA103
                            continue
                    return clss
        """,
    },
    "a rollout handed to the update function, converted and moved per iteration (PyTorch-RL)": {
        "ppo.py": """
            import numpy as np
            from utils import *

            dtype = torch.float64
            device = torch.device("cuda", index=0) if torch.cuda.is_available() else torch.device("cpu")
            policy = torch.nn.Linear(4, 2).to(device)
            optimizer = torch.optim.Adam(policy.parameters())

            def update_params(batch):
                states = torch.from_numpy(np.stack(batch.state)).to(dtype).to(device)  # expect: LA202
                loss = policy(states).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            for i_iter in range(500):
                batch, log = agent.collect_samples(2048)
                update_params(batch)
        """,
        "utils/__init__.py": """
            from utils.torch_utils import *
        """,
        "utils/torch_utils.py": """
            import torch

            LongTensor = torch.LongTensor
        """,
    },
    "a step that computes its gradients with torch.autograd.grad (TRPO)": {
        "trpo.py": """
            import torch

            device = torch.device("cuda")
            policy = torch.nn.Linear(4, 2).to(device)
            for i_iter in range(500):
                states = torch.randn(64, 4, device=device)
                loss = policy(states).pow(2).mean()
                grads = torch.autograd.grad(loss, policy.parameters())
                flat = torch.cat([g.view(-1) for g in grads])
                print(flat.norm().item())  # expect: LA101
                with torch.no_grad():
                    for p, g in zip(policy.parameters(), grads):
                        p -= 0.01 * g
        """,
    },
    "loaders drawn with the iterator's own next() and re-made when they run out; meters named like losses (FixMatch)": {
        "train.py": """
            import torch
            from torch.utils.data import DataLoader
            from utils import AverageMeter

            def train(args, labeled_loader, model, optimizer):
                labeled_iter = iter(labeled_loader)
                losses = AverageMeter()
                for epoch in range(args.epochs):
                    for batch_idx in range(args.eval_step):
                        try:
                            inputs_x, targets_x = labeled_iter.next()
                        except StopIteration:
                            labeled_iter = iter(labeled_loader)
                            inputs_x, targets_x = labeled_iter.next()
                        targets_x = targets_x.to(args.device)  # expect: LA202
                        loss = model(inputs_x.to(args.device, non_blocking=True), targets_x)
                        loss.backward()
                        optimizer.step()
                        losses.update(loss.item())  # expect: LA101
                        print("Loss: {loss:.4f}".format(loss=losses.avg))

            def main(args):
                args.device = torch.device("cuda", args.gpu_id)
                labeled_loader = DataLoader(dataset, batch_size=64, num_workers=4, drop_last=True)  # expect: LA201, LA204
                model = Net().to(args.device)
                train(args, labeled_loader, model, torch.optim.SGD(model.parameters(), lr=0.03))
        """,
        "utils.py": """
            class AverageMeter:
                def update(self, val, n=1):
                    self.sum = getattr(self, "sum", 0) + val * n
                    self.count = getattr(self, "count", 0) + n
                    self.avg = self.sum / self.count
        """,
    },
    "loaders walked through a list of loaders; a batch handed on as *inputs, each picked by its position (Attention-Gated-Networks)": {
        "train_segmentation.py": """
            import torch
            from torch.utils.data import DataLoader
            from models.segmentation import Segmentation

            model = Segmentation()
            train_loader = DataLoader(train_set, num_workers=16, batch_size=8, shuffle=True)  # expect: LA201, LA204
            valid_loader = DataLoader(valid_set, num_workers=16, batch_size=8)  # expect: LA201, LA204
            for epoch in range(100):
                for images, labels in train_loader:
                    model.set_input(images, labels)
                    model.optimize_parameters()
                for loader, split in zip([valid_loader], ["validation"]):
                    for images, labels in loader:
                        model.set_input(images, labels)
                        model.validate()
        """,
        "models/__init__.py": "",
        "models/segmentation.py": """
            import torch
            from torch.autograd import Variable

            class Segmentation:
                def __init__(self):
                    self.net = torch.nn.Conv2d(3, 2, 1).cuda()
                    self.optimizer = torch.optim.Adam(self.net.parameters())

                def set_input(self, *inputs):
                    for idx, _input in enumerate(inputs):
                        if idx == 0:
                            self.input = _input.cuda()  # expect: LA202
                        elif idx == 1:
                            self.target = Variable(_input.cuda())  # expect: LA202

                def optimize_parameters(self):
                    self.optimizer.zero_grad()
                    loss = (self.net(self.input) - self.target).abs().mean()
                    loss.backward()
                    self.optimizer.step()

                def validate(self):
                    with torch.no_grad():
                        self.prediction = self.net(self.input)
        """,
    },
    "a worker count passed ninth, from the command line; the parts of a model's output walked in an evaluation step; a helper given host tensors returns host tensors (stargan, pytorch-pose)": {
        "main.py": """
            import argparse
            import math
            import torch
            from data_loader import get_loader

            parser = argparse.ArgumentParser()
            parser.add_argument("--num_workers", type=int, default=1)
            config = parser.parse_args()
            device = torch.device("cuda")
            model = Net().to(device)

            def get_preds(scores):
                maxval, idx = torch.max(scores.view(scores.size(0), scores.size(1), -1), 2)
                return idx.view(scores.size(0), scores.size(1), 1).repeat(1, 1, 2).float()

            def validate(val_loader):
                model.eval()
                with torch.no_grad():
                    for input, target in val_loader:
                        output = model(input.to(device, non_blocking=True))
                        loss = 0
                        for o in output:
                            loss += criterion(o, target.to(device, non_blocking=True))
                        score_map = output.cpu()  # expect: LA102
                        coords = get_preds(score_map)
                        px = int(math.floor(coords[0][0][0]))

            def train(train_loader):
                for input, target in train_loader:
                    output = model(input.to(device, non_blocking=True))
                    preds = get_preds(output)
                    loss = criterion(output, target.to(device, non_blocking=True)) + preds.mean()
                    loss.backward()
                    optimizer.step()

            loader = get_loader("img", "attr", [], 178, 128, 16, "CelebA", "train", config.num_workers)
            for epoch in range(10):
                train(loader)
                validate(loader)
        """,
        "data_loader.py": """
            from torch.utils import data

            def get_loader(image_dir, attr_path, selected_attrs, crop_size, image_size, batch_size, dataset, mode, num_workers):
                return data.DataLoader(dataset=dataset, batch_size=batch_size, shuffle=True, pin_memory=True, num_workers=num_workers)  # expect: LA204
        """,
    },
    "the device a command-line option defaults to, declared in a module without torch (PyTorch-ENet)": {
        "args.py": """
            from argparse import ArgumentParser

            def get_arguments():
                parser = ArgumentParser()
                parser.add_argument("--device", default="cuda", help="Device to train on. Default: cuda")
                parser.add_argument("--workers", type=int, default=4)
                return parser.parse_args()
        """,
        "main.py": """
            import torch
            from args import get_arguments
            from train import Train

            args = get_arguments()
            device = torch.device(args.device)
            model = Net().to(device)
            train_loader = DataLoader(train_set, batch_size=10, num_workers=args.workers, pin_memory=True, persistent_workers=True)
            train = Train(model, train_loader, device)
            for epoch in range(300):
                train.run_epoch()
        """,
        "train.py": """
            class Train:
                def __init__(self, model, data_loader, device):
                    self.model, self.data_loader, self.device = model, data_loader, device

                def run_epoch(self):
                    for step, batch_data in enumerate(self.data_loader):
                        inputs = batch_data[0].to(self.device)  # expect: LA202
                        loss = self.model(inputs).mean()
                        loss.backward()
                        self.optim.step()
        """,
        "other_script.py": """
            import torch
            device = torch.device(DEVICE)
            model = Net().to(device)
            for step, (x, y) in enumerate(loader):
                loss = model(x.to(device)).mean()
                loss.backward()
                optimizer.step()
        """,
    },
    "a project's own datasets/ package, not the library of that name; the loader wrapped in tqdm (melgan)": {
        "datasets/dataloader.py": """
            from torch.utils.data import DataLoader

            def create_dataloader(hp, train):
                dataset = MelFromDisk(hp, train)
                return DataLoader(dataset=dataset, batch_size=16, shuffle=True, num_workers=4, pin_memory=True)  # expect: LA204
        """,
        "trainer.py": """
            from datasets.dataloader import create_dataloader
            from utils.train import train

            trainloader = create_dataloader(hp, True)
            train(hp, trainloader)
        """,
        "utils/train.py": """
            import itertools
            import tqdm

            def train(hp, trainloader):
                model_g = Generator().cuda()
                for epoch in itertools.count(1):
                    loader = tqdm.tqdm(trainloader, desc="Loading train data")
                    for mel, audio in loader:
                        mel = mel.cuda(non_blocking=True)
                        loss = model_g(mel).mean()
                        loss.backward()
                        optimizer.step()
        """,
    },
    "a worker count in a settings module, a loader read back from **kwargs (WS-DAN)": {
        "config.py": """
            GPU = '0'
            workers = 4
            epochs = 160
            batch_size = 12
        """,
        "train.py": """
            import torch
            from torch.utils.data import DataLoader
            import config

            def main():
                train_loader, validate_loader = DataLoader(train_dataset, batch_size=config.batch_size, shuffle=True,  # expect: LA204
                                                           num_workers=config.workers, pin_memory=True), \\
                                                DataLoader(validate_dataset, batch_size=config.batch_size * 4,  # expect: LA204
                                                           num_workers=config.workers, pin_memory=True)
                net = WSDAN().to(torch.device("cuda"))
                for epoch in range(config.epochs):
                    train(data_loader=train_loader, net=net)
                    validate(data_loader=validate_loader, net=net)

            def train(**kwargs):
                data_loader = kwargs['data_loader']
                net = kwargs['net']
                for i, (X, y) in enumerate(data_loader):
                    X = X.to(torch.device("cuda"), non_blocking=True)
                    net(X).sum().backward()
                    optimizer.step()

            def validate(**kwargs):
                data_loader = kwargs.get('data_loader')
                net = kwargs['net']
                with torch.no_grad():
                    for i, (X, y) in enumerate(data_loader):
                        net(X.to(torch.device("cuda"), non_blocking=True))
        """,
    },
    "a worker count declared as an absl flag (pytorch-ddpm)": {
        "main.py": """
            import torch
            from absl import flags

            FLAGS = flags.FLAGS
            flags.DEFINE_integer('num_workers', 4, help='workers of Dataloader')
            flags.DEFINE_bool('parallel', False, help='multi gpu training')

            def train():
                dataloader = torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True,  # expect: LA204
                                                         num_workers=FLAGS.num_workers, pin_memory=True)
                net = UNet().cuda()
                for epoch in range(100):
                    for x, _ in dataloader:
                        net(x.cuda(non_blocking=True)).mean().backward()
                        optimizer.step()
        """,
    },
    "a loader a method makes, handed straight to a trainer that restarts its iterator (SAGAN)": {
        "data_loader.py": """
            import torch

            class Data_Loader():
                def __init__(self, path, batch_size):
                    self.path, self.batch = path, batch_size

                def loader(self):
                    dataset = ImageFolder(self.path)
                    loader = torch.utils.data.DataLoader(dataset=dataset, batch_size=self.batch, shuffle=True,  # expect: LA201, LA204
                                                         num_workers=2, drop_last=True)
                    return loader
        """,
        "main.py": """
            from data_loader import Data_Loader
            from trainer import Trainer

            data_loader = Data_Loader(config.image_path, config.batch_size)
            trainer = Trainer(data_loader.loader(), config)
            trainer.train()
        """,
        "trainer.py": """
            import torch

            class Trainer(object):
                def __init__(self, data_loader, config):
                    self.data_loader = data_loader
                    self.D = Discriminator().cuda()

                def train(self):
                    data_iter = iter(self.data_loader)
                    for step in range(1000000):
                        try:
                            real_images, _ = next(data_iter)
                        except StopIteration:
                            data_iter = iter(self.data_loader)
                            real_images, _ = next(data_iter)
                        d_loss = self.D(real_images.cuda(non_blocking=True)).mean()
                        d_loss.backward()
                        self.d_optimizer.step()
        """,
    },
    "a batch handed on as `*items` to a method that moves each element (edge-connect)": {
        "edge_connect.py": """
            import torch
            from torch.utils.data import DataLoader

            class EdgeConnect():
                def __init__(self, config):
                    self.config = config
                    self.edge_model = EdgeModel(config).to(config.DEVICE)

                def train(self):
                    train_loader = DataLoader(dataset=self.train_dataset, batch_size=8, num_workers=4,
                                              pin_memory=True, persistent_workers=True)
                    for epoch in range(100):
                        for items in train_loader:
                            images, edges, masks = self.cuda(*items)
                            loss = self.edge_model(images, edges, masks).mean()
                            loss.backward()
                            self.optimizer.step()

                def cuda(self, *args):
                    return (item.to(self.config.DEVICE) for item in args)  # expect: LA202
        """,
    },
    "a loss function handed to another module's trainer, which calls it per step (pytorchic-bert)": {
        "pretrain.py": """
            import torch
            import train

            def main():
                model = Net()
                trainer = train.Trainer(model, data_iter, optimizer, torch.device("cuda"))

                def get_loss(model, batch, global_step):
                    x, y = batch
                    loss = criterion(model(x), y)
                    writer.add_scalar("loss", loss.item(), global_step)  # expect: LA101
                    return loss

                trainer.train(get_loss, 10)
        """,
        "train.py": """
            import torch

            class Trainer:
                def __init__(self, model, data_iter, optimizer, device):
                    self.model, self.data_iter, self.optimizer, self.device = model, data_iter, optimizer, device

                def train(self, get_loss, n_epochs):
                    self.model.to(self.device)
                    for e in range(n_epochs):
                        for i, batch in enumerate(self.data_iter):
                            batch = [t.to(self.device, non_blocking=True) for t in batch]
                            self.optimizer.zero_grad()
                            loss = get_loss(self.model, batch, i).mean()
                            loss.backward()
                            self.optimizer.step()
        """,
    },
    "a settings module names the CUDA device the trainer moves to (Precipitation-Nowcasting's cfg)": {
        "config.py": """
            import os
            import torch
            from easydict import EasyDict as edict

            __C = edict()
            cfg = __C
            __C.GLOBAL = edict()
            __C.GLOBAL.DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            __C.GLOBAL.BATCH_SIZE = 4
            for folder in ["/data/radar", "/mnt/radar"]:
                if os.path.exists(folder):
                    __C.GLOBAL.DATA_DIR = folder
        """,
        "train.py": """
            import torch
            from config import cfg

            def train(model, optimizer, batches):
                for batch in batches:
                    x = torch.from_numpy(batch).to(cfg.GLOBAL.DEVICE)
                    loss = model(x).mean()
                    loss.backward()
                    optimizer.step()
                    total = loss.item()  # expect: LA101
        """,
    },
}


@pytest.mark.parametrize("named", [True, False], ids=["files named", "folder walked"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reach(tmp_path, name, named):
    assert_marked_findings(tmp_path, CASES[name], named)


def test_a_call_resolved_by_method_name_says_so(tmp_path):
    write_project(
        tmp_path, CASES["a method called on an object a config builds: every project method of that name the call fits"]
    )
    (finding,) = scan(tmp_path)
    assert finding.context.endswith("resolved by name to `DrQAgent.update`")
