"""A Hydra app of your own: its `-m` sweep runs each point as an hpctrain run, every rank calling
`main` with the point's config (hpctrain's Hydra launchers: hpctrain_local, hpctrain_slurm).

    python app.py                                                     # one process, as always
    python app.py -m hydra/launcher=hpctrain_local hydra.launcher.ranks=2 lr=0.01,0.1
"""

import os

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    model = torch.nn.Linear(cfg.features, 1)
    if world > 1:  # under the launcher: torch.distributed's variables are set on every rank
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(cfg.rows, cfg.features, generator=g)
    y = x.sum(1, keepdim=True)
    mine = slice(rank * cfg.rows // world, (rank + 1) * cfg.rows // world)  # this rank's share
    for _ in range(cfg.steps):
        optimizer.zero_grad()
        loss = ((model(x[mine]) - y[mine]) ** 2).mean()
        loss.backward()
        optimizer.step()
    print(f"rank {rank} of {world}: lr={cfg.lr} loss={loss.item():.4f}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    return loss.item()  # rank 0's comes back to Hydra as the job's return value


if __name__ == "__main__":
    main()
