#!/usr/bin/env python3
"""kiln against PyTorch on one GPU: the training step of the three reference networks.

For each network and batch, times PyTorch eager, PyTorch with the whole step captured as a CUDA
graph, torch.compile with CUDA graphs (mode="reduce-overhead"), and kiln (step_bench --device
cuda, a process per block), the four alternating block by block so that they share the machine's
state. Same networks, initialisation scheme, batch, SGD (lr 0.01, momentum 0.9) and FP32 without
TF32; random data. Prints one table (ms per step, images/s, PyTorch's time over kiln's) and, with
--json, writes the rows.

  benchmarks/vs_torch_cuda.py --step-bench build/benchmarks/step_bench [--batches 64 1024]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn


def mnist_cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def lenet5():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))


class Residual(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


def small_resnet():
    def block(c):
        return Residual(nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c),
                                      nn.ReLU(), nn.Conv2d(c, c, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(c)))
    return nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         block(16), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1, bias=False),
                         nn.BatchNorm2d(32), nn.ReLU(), block(32), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


NETWORKS = {"mnist_cnn": mnist_cnn, "lenet5": lenet5, "small_resnet": small_resnet}


def torch_runners(make, batch):
    """The three PyTorch modes' step functions, each on its own copy of the network."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.rand(batch, 1, 28, 28, device="cuda", generator=gen) * 3.2 - 0.4
    y = torch.randint(0, 10, (batch,), device="cuda", generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    runners = {}

    model = make().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def eager():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    runners["torch eager"] = eager

    g_model = make().cuda()
    g_opt = torch.optim.SGD(g_model.parameters(), lr=0.01, momentum=0.9)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            g_opt.zero_grad(set_to_none=True)
            loss_fn(g_model(x), y).backward()
            g_opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    g_opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_fn(g_model(x), y).backward()
        g_opt.step()
    runners["torch CUDA graph"] = graph.replay

    c_model = make().cuda()
    c_opt = torch.optim.SGD(c_model.parameters(), lr=0.01, momentum=0.9)
    compiled = torch.compile(c_model, mode="reduce-overhead")

    def compiled_step():
        c_opt.zero_grad(set_to_none=True)
        loss_fn(compiled(x), y).backward()
        c_opt.step()
    for _ in range(5):  # compiles and records its graphs
        compiled_step()
    runners["torch.compile"] = compiled_step
    return runners


def time_torch(step, steps):
    step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return 1000.0 * (time.perf_counter() - t0) / steps


def time_kiln(step_bench, network, batch, steps):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([step_bench, "--device", "cuda", "--model", network, "--batch", str(batch),
                        "--rounds", "1", "--steps", str(steps), "--json", out.name],
                       check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out.name))["results"][0]["ms_per_step"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-bench", required=True, help="kiln's step_bench program")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    device = torch.cuda.get_device_name()
    rows = []
    print(f"training step, SGD momentum 0.9, FP32 (no TF32), {device}, PyTorch {torch.__version__}, "
          f"best of {args.rounds} blocks of {args.steps} steps")
    print(f"{'network':13} {'batch':>5} {'mode':17} {'ms/step':>8} {'images/s':>10} {'vs kiln':>8}")
    for network in args.networks:
        for batch in args.batches:
            runners = torch_runners(NETWORKS[network], batch)
            best = {name: float("inf") for name in list(runners) + ["kiln"]}
            for _ in range(args.rounds):
                for name, step in runners.items():
                    best[name] = min(best[name], time_torch(step, args.steps))
                best["kiln"] = min(best["kiln"],
                                   time_kiln(args.step_bench, network, batch, args.steps))
            for name, ms in best.items():
                ratio = ms / best["kiln"]
                print(f"{network:13} {batch:5} {name:17} {ms:8.3f} {1000.0 * batch / ms:10.0f} "
                      f"{ratio:7.2f}x")
                rows.append({"network": network, "batch": batch, "mode": name, "ms_per_step": ms,
                             "images_per_s": 1000.0 * batch / ms, "time_over_kiln": ratio,
                             "device": device, "torch": torch.__version__})
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
