"""Data parallelism for one training run (lm/trainer.py) under ``torchrun`` (gloo on CPU, NCCL on GPU).

Every rank builds the whole batch of step t (a pure function of (seed, t), so this
costs no communication) and trains on its own contiguous slice of rows: rank r of
W owns rows ``r*B/W .. (r+1)*B/W - 1``, so an injected row ``row`` is in the
micro-batch of rank ``row // (B/W)`` (:meth:`World.rank_of_row`; the twins record it
in their run's ``config.json``).

Each rank's loss is its masked cross-entropy *sum* divided by ``B·T``, the target
positions of the whole batch (lm/trainer.py), and the gradients are summed across
ranks: the update is that of the whole batch's loss, as in one process, for any
split of the rows (including the injected row's padding mask).

Why not ``torch.nn.parallel.DistributedDataParallel``: it does the same all-reduce,
but re-buckets gradients after its first iteration and wraps the module. Forking a
run at the injection step is a deep copy of (model, optimizer); with one flat
all-reduce in parameter order the reduction is the same at every step of every
fork, which is what bitwise-identical twins need.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from seedlab.errors import SeedlabError
from seedlab.store import digest


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0 writes every file; the other ranks only compute."""
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a batch."""
        n = batch_size // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def rank_of_row(self, row: int, batch_size: int) -> int:
        return row // (batch_size // self.size)

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks: one flat buffer, in parameter order."""
        if self.size == 1:
            return
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def sum(self, value: torch.Tensor) -> float:
        if self.size > 1:
            value = value.detach().clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return float(value)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def check_same(self, hashes: dict[str, str], what: str) -> None:
        """Every rank holds bitwise the same weights (compares SHA-256 digests of the tensor hashes)."""
        if self.size == 1:
            return
        every: list[str | None] = [None] * self.size
        dist.all_gather_object(every, digest(hashes))
        if len(set(every)) != 1:
            bad = next(r for r, d in enumerate(every) if d != every[0])
            raise SeedlabError(f"{what}: rank {bad} holds different weights than rank 0 (data parallelism diverged)")

    def device(self, requested: str) -> torch.device:
        if requested != "auto":
            return torch.device(requested)
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")


def launched_size() -> int:
    """How many ranks torchrun launched (``WORLD_SIZE``; 1 for a plain process), read before any process group
    exists, so a config that cannot split over them is refused before the ranks wait for each other."""
    text = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(text)
    except ValueError:
        raise SeedlabError(f"WORLD_SIZE: must be a positive integer (torchrun sets it), got {text!r}") from None
    if size < 1:
        raise SeedlabError(f"WORLD_SIZE: must be a positive integer (torchrun sets it), got {text!r}")
    return size


def init_world() -> World:
    """The process group torchrun describes in the environment (RANK, WORLD_SIZE, ...);
    a plain ``python``/``seedlab`` process is a world of one and needs nothing."""
    size = launched_size()
    if size == 1:
        return World()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            # one all-reduce algorithm and protocol, whatever the message size: the same
            # reduction order at every step (NCCL otherwise picks per size and topology)
            os.environ.setdefault("NCCL_ALGO", "Ring")
            os.environ.setdefault("NCCL_PROTO", "Simple")
        dist.init_process_group(backend)
    return World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def check_divisible(batch_size: int, micro_batch: int | None, world: World) -> None:
    if batch_size % world.size:
        raise SeedlabError(f"batch_size: {batch_size} rows do not split over {world.size} ranks (torchrun --nproc-per-node)")
    share = batch_size // world.size
    if micro_batch is not None and share % micro_batch:
        raise SeedlabError(f"micro_batch: must divide each rank's {share} rows, got {micro_batch}")
