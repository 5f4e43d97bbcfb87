#!/usr/bin/env python3
"""Data-parallel training with torch's DistributedDataParallel over softnic.

Each rank trains the same small regression network on its own shard of a
fixed synthetic data set; DDP averages the gradients every step through the
process group.  Run it on softnic and on gloo and compare the losses:

    softnic launch -n 2 examples/ddp_train.py --backend softnic
    softnic launch -n 2 examples/ddp_train.py --backend gloo

(needs the torch extra: pip install -e '.[torch]').  Rank 0 prints one line
per step: the step, rank 0's own loss and the mean loss over all ranks, both
with every digit (``repr``), and with ``--json PATH`` writes them there.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 16          # per rank per step
FEATURES = 32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="softnic", choices=("softnic", "gloo"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--json", help="rank 0 writes the losses here")
    args = ap.parse_args()
    if args.backend == "softnic":
        import softnic.collectives.torch_backend  # noqa: F401  registers the backend
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    # each rank starts from different weights: DDP broadcasts rank 0's at construction
    torch.manual_seed(100 + rank)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    data = torch.Generator().manual_seed(1234)
    w_true = torch.randn(FEATURES, 1, generator=data)
    x_all = torch.randn(args.steps, world * BATCH, FEATURES, generator=data)
    y_all = torch.sin(x_all @ w_true) + 0.1 * torch.randn(args.steps, world * BATCH, 1,
                                                          generator=data)
    losses = []
    for step in range(args.steps):
        x = x_all[step, rank * BATCH:(rank + 1) * BATCH]
        y = y_all[step, rank * BATCH:(rank + 1) * BATCH]
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        losses.append({"step": step, "loss": loss.item(), "mean_loss": mean.item()})
        if rank == 0:
            print(f"step {step}  loss {loss.item()!r}  mean loss {mean.item()!r}", flush=True)

    # the replicas must have stayed identical
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    if rank == 0:
        print(f"{args.backend}: {world} ranks, replicas identical after training: {same}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"backend": args.backend, "world": world, "losses": losses,
                           "replicas_identical": same}, f)
    dist.destroy_process_group()
    if not same:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
