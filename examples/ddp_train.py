#!/usr/bin/env python3
"""Data-parallel training with torch's DistributedDataParallel over softnic.

Each rank trains the same small regression network on its own shard of a
fixed synthetic data set; DDP averages the gradients every step through the
process group.  Run it on softnic and on gloo and compare the losses:

    softnic launch -n 2 examples/ddp_train.py --backend softnic
    softnic launch -n 2 examples/ddp_train.py --backend gloo
    softnic launch -n 2 examples/ddp_train.py --compare     # both, side by side

(needs the torch extra: pip install -e '.[torch]').  Rank 0 prints one line
per step: rank 0's own loss and the mean loss over all ranks, with every
digit (``repr``); ``--json PATH`` writes them there too.

``--overlap`` times what the backend's asynchronous work buys: a wider network
trained over softnic in the same processes, step by step in turn, once
with the gradient buckets reduced in the background while the backward pass
goes on (what DDP does with an asynchronous backend) and once with every
reduction completed before the backward pass resumes (``asynchronous =
False`` on that group); for reference also over gloo and with no
communication at all (the same model trained alone: the step's compute).  It
prints the median step time of each and checks that the losses of the two
softnic runs are the same bits:

    softnic launch -n 2 examples/ddp_train.py --overlap
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 16          # per rank per step
FEATURES = 32


def train(group, rank, world, steps, lr):
    """DDP training over ``group``; returns [(rank 0's loss, mean loss)] per step and
    the final parameters."""
    # each rank starts from different weights: DDP broadcasts rank 0's at construction
    torch.manual_seed(100 + rank)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 1))
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    data = torch.Generator().manual_seed(1234)
    w_true = torch.randn(FEATURES, 1, generator=data) / FEATURES ** 0.5
    x_all = torch.randn(steps, world * BATCH, FEATURES, generator=data)
    y_all = torch.sin(2 * x_all @ w_true) + 0.05 * torch.randn(steps, world * BATCH, 1,
                                                               generator=data)
    losses = []
    for step in range(steps):
        x = x_all[step, rank * BATCH:(rank + 1) * BATCH]
        y = y_all[step, rank * BATCH:(rank + 1) * BATCH]
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        mean /= world
        losses.append((loss.item(), mean.item()))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return losses, flat


def overlap(rank, world, args):
    """Train the same wide network twice, overlapped and synchronous, one step of each in
    turn; returns {mode: (losses, step times)}."""
    groups = {"overlapped": dist.new_group(backend="softnic"),
              "synchronous": dist.new_group(backend="softnic"),
              "gloo": dist.new_group(backend="gloo"),
              "no communication": None}
    groups["synchronous"].asynchronous = False
    sync_on = groups["gloo"]
    data = torch.Generator().manual_seed(99)
    x_all = torch.randn(args.steps, world * args.batch, args.width, generator=data)
    y_all = torch.randn(args.steps, world * args.batch, 1, generator=data)
    runs = {}
    for mode, group in groups.items():
        torch.manual_seed(7)
        layers = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.Tanh()]
        model = nn.Sequential(*layers, nn.Linear(args.width, 1))
        # "no communication": the same model trained alone, the step's compute only
        ddp = model if group is None else DDP(model, process_group=group,
                                              bucket_cap_mb=args.bucket_mb)
        runs[mode] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3), [], [])
    order = list(runs)
    for step in range(args.steps):
        x = x_all[step, rank * args.batch:(rank + 1) * args.batch]
        y = y_all[step, rank * args.batch:(rank + 1) * args.batch]
        for mode in (order if step % 2 == 0 else order[::-1]):
            ddp, opt, losses, times = runs[mode]
            dist.barrier(group=groups[mode] or sync_on)
            t0 = time.perf_counter()
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    return {mode: (losses, times) for mode, (_, _, losses, times) in runs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="softnic", choices=("softnic", "gloo"))
    ap.add_argument("--compare", action="store_true",
                    help="train twice, over softnic and over gloo, and print both losses")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--json", help="rank 0 writes the losses here")
    ap.add_argument("--overlap", action="store_true",
                    help="time overlapped against synchronous gradient reduction over softnic")
    ap.add_argument("--width", type=int, default=1024, help="--overlap: layer width (1024)")
    ap.add_argument("--layers", type=int, default=4, help="--overlap: hidden layers (4)")
    ap.add_argument("--batch", type=int, default=256, help="--overlap: batch per rank (256)")
    ap.add_argument("--bucket-mb", type=float, default=4.0,
                    help="--overlap: DDP bucket size in MB (4)")
    args = ap.parse_args()
    if args.backend == "softnic" or args.compare:
        import softnic.collectives.torch_backend  # noqa: F401  registers the backend
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("softnic" if args.compare or args.overlap else args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.overlap:
        runs = overlap(rank, world, args)
        if rank == 0:
            params = (args.layers * (args.width + 1) * args.width + args.width + 1)
            print(f"{world} ranks, {args.layers} x {args.width}-wide layers ({params * 4 / 1e6:.1f} "
                  f"MB of gradients, buckets of {args.bucket_mb:g} MB), batch {args.batch} per "
                  f"rank, {args.steps} steps; median time per step (rank 0):")
            for mode, (losses, times) in runs.items():
                print(f"  {mode:>16}: {statistics.median(times) * 1e3:8.1f} ms")
            t = {m: statistics.median(ts) for m, (_, ts) in runs.items()}
            print(f"  overlapped / synchronous: {t['overlapped'] / t['synchronous']:.2f}")
            print(f"  communication hidden: {max(0.0, t['synchronous'] - t['overlapped']) * 1e3:.1f}"
                  f" of {max(0.0, t['synchronous'] - t['no communication']) * 1e3:.1f} ms "
                  f"(synchronous minus no communication)")
            same = runs["overlapped"][0] == runs["synchronous"][0]
            print(f"losses equal step for step (every bit): {same}")
            if world == 2:
                print(f"  ... and equal to gloo's: {runs['overlapped'][0] == runs['gloo'][0]}")
            print("losses: " + " ".join(f"{v!r}" for v in runs["overlapped"][0]))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"world": world, "runs": runs, "same_losses": same}, f)
        dist.destroy_process_group()
        return
    runs = {dist.get_backend(): dist.group.WORLD}
    if args.compare:
        runs["gloo"] = dist.new_group(backend="gloo")
    results, same = {}, True
    for name, group in runs.items():
        losses, flat = train(group, rank, world, args.steps, args.lr)
        results[name] = losses
        # the replicas must have stayed identical
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat, group=group)
        same &= all(torch.equal(g, gathered[0]) for g in gathered)
    names = list(results)
    if rank == 0:
        print(f"{world} ranks; loss is rank 0's, mean is over all ranks (every digit)")
        print("step  " + "  ".join(f"{n + ' loss':>22} {n + ' mean':>22}" for n in names))
        for step in range(args.steps):
            print(f"{step:>4}  " + "  ".join(f"{results[n][step][0]!r:>22} "
                                             f"{results[n][step][1]!r:>22}" for n in names))
        print(f"replicas identical after training: {same}")
        if len(names) == 2:
            a, b = (results[n] for n in names)
            diff = max(abs(x - y) / abs(y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))
            print(f"softnic losses equal gloo's step for step: {a == b} "
                  f"(largest relative difference {diff:.1e})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world": world, "losses": results, "replicas_identical": same}, f)
    dist.destroy_process_group()
    if not same:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
