"""Multi-process training with DistributedDataParallel (docs/scale.md#ddp-training).

A run is distributed when a launcher starts several processes and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``
(and ``MASTER_ADDR``/``MASTER_PORT``): ``torchrun --nproc_per_node N -m service.cli train ...`` or
``jointspace train --nproc N ...`` (which runs torchrun's launcher in its own process, :func:`launch`). The trainer
(trainer.py) then

* joins the process group: gloo on CPU, nccl on CUDA (rank ``r`` on ``cuda:LOCAL_RANK``);
* reads the same global batches as one process would (``train.batch_size`` is the global batch) and takes
  its slice of each: rank ``r`` of ``W`` reads items ``[r·B/W, (r+1)·B/W)`` (:class:`ShardedBatches`);
* computes the batch loss inside a :class:`~torch.nn.parallel.DistributedDataParallel` module
  (:class:`BatchLoss`), which averages the gradients over the ranks;
* with ``train.gather_negatives`` all-gathers the embeddings (gradients flow back to each rank's own part), so
  every rank's ranking loss is the loss of the whole global batch (:meth:`Distributed.gather`);
* validates and writes ``model.pt``, ``last.pt``, ``log.jsonl`` and ``config.yaml`` on rank 0 only.

This module is imported only by a multi-process run: one process trains exactly as without it.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import sys
from dataclasses import dataclass
from typing import Sized, cast

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Sampler

from training.models.config_schema import RunConfig

# rank 0 may compute a feature cache (or validate a large split) while the others wait at a barrier
TIMEOUT = datetime.timedelta(hours=4)


def env_world_size() -> int:
    """The number of processes a launcher started (``WORLD_SIZE``; 1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


class ShardedBatches(Sampler):
    """Rank ``rank``'s slice of every global batch of ``batches`` (a :class:`BatchSampler` with ``drop_last``,
    whose batch size is a multiple of ``world_size``): the ranks' slices, concatenated in rank order, are
    exactly the batch one process reads."""

    def __init__(self, batches: BatchSampler, rank: int, world_size: int):
        if batches.batch_size % world_size or not batches.drop_last:
            raise ValueError("ShardedBatches needs full batches whose size is a multiple of the processes")
        self.batches, self.rank, self.world_size = batches, rank, world_size
        self.local = batches.batch_size // world_size

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        lo = self.rank * self.local
        for batch in self.batches:
            yield batch[lo:lo + self.local]


class BatchLoss(torch.nn.Module):
    """The trainer's batch loss as a module's ``forward``, so that DistributedDataParallel wraps the whole loss
    computation (the model is reached through several of its methods, not one ``forward``)."""

    def __init__(self, model: torch.nn.Module, batch_loss):
        super().__init__()
        self.model = model
        self.batch_loss = batch_loss

    def forward(self, batch, kind: str, warm: bool) -> torch.Tensor:
        return self.batch_loss(batch, kind, warm)


@dataclass
class Distributed:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool        # this object initialised the process group (and destroys it in close())

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        return dist.get_backend()

    def barrier(self) -> None:
        dist.barrier()

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 runs the block first (downloads, feature and state caches), then the others (cache hits)."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (e.g. the validation result, so that every rank takes the same
        schedule, best-checkpoint and early-stopping decisions)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_objects(self, obj) -> list:
        """Every rank's ``obj``, in rank order."""
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def mean(self, value: float) -> float:
        """The mean over the ranks of a float."""
        t = torch.tensor([float(value)], dtype=torch.float64,
                         device=self.device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t)
        return float(t.item()) / self.world_size

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The global batch's rows of ``x`` (every rank's shard, in rank order). Differentiable: the gradient
        that reaches this rank's rows is the sum of every rank's gradient for them (a reduce-scatter)."""
        from torch.distributed._functional_collectives import all_gather_single

        return all_gather_single(x.contiguous(), 0, cast(dist.ProcessGroup, dist.group.WORLD))   # initialised

    def gather_ids(self, x: torch.Tensor) -> torch.Tensor:
        """Like :meth:`gather` for tensors without gradients (image indices)."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, 0)

    def shard_loader(self, loader: DataLoader) -> DataLoader:
        """``loader`` (one process's loader, ``batch_size`` = the global batch) reading only this rank's slice
        of each batch: the same sampler, so the same global batches in the same order."""
        size, n = cast(int, loader.batch_size), len(cast(Sized, loader.sampler))   # a batched map-style loader
        if size % self.world_size:
            raise ValueError(f"the global batch size {size} (train.batch_size, or finetune_batch_size) must be a "
                             f"multiple of the {self.world_size} processes")
        if n < size:
            raise ValueError(f"{n} training items are fewer than one global batch of {size}: lower the batch "
                             f"size or run one process")
        batches = ShardedBatches(BatchSampler(loader.sampler, size, drop_last=True), self.rank, self.world_size)
        return DataLoader(loader.dataset, batch_sampler=batches, collate_fn=loader.collate_fn,
                          num_workers=loader.num_workers)

    def wrap(self, model: torch.nn.Module, batch_loss) -> torch.nn.Module:
        """A DistributedDataParallel module whose ``forward(batch, kind, warm)`` is ``batch_loss``. Built once a
        stage has set which parameters train (DDP synchronises those that require gradients when it is
        built); it broadcasts rank 0's parameters and buffers. Buffers are not synchronised at each step:
        validation and the saved weights are rank 0's, and BatchNorm in training mode normalises with each rank's
        share of the batch anyway. ``static_graph``: the same parameters take part in every step (trainable
        ones that a model never uses, e.g. a decoder whose loss weights are 0, are found in the first step)."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(BatchLoss(model, batch_loss), device_ids=ids, forward_sync_buffers=False,
                                       static_graph=True)

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def check_config(cfg: RunConfig, world_size: int) -> None:
    """What ``world_size`` processes cannot train, refused before any process waits on another."""
    train = cfg.train
    sizes = [("train.batch_size", train.batch_size)]
    if train.finetune_epochs > 0:
        sizes.append(("train.finetune_batch_size", train.finetune_batch_size))
    for key, size in sizes:
        if size % world_size:
            raise ValueError(f"{key} {size} is the global batch: it must be a multiple of the {world_size} processes")
    if cfg.scst.steps > 0:
        raise ValueError("the self-critical stage (scst.steps > 0) runs in one process: train the eq. 12 stages with "
                         "several processes and scst.steps=0, then continue with --resume in one")
    if cfg.loss.distill_from:
        raise ValueError("loss.distill_from runs in one process (the teachers' tables are read by the one trainer)")
    if train.gather_negatives and (cfg.decoder.enabled or cfg.attention.enabled):
        raise ValueError("train.gather_negatives is implemented for the retrieval trainer: not with decoder.enabled "
                         "or attention.enabled")


def start(device_name: str) -> Distributed:
    """Joins the process group the launcher's environment describes (``train.device``: auto | cpu | cuda);
    a group that is already initialised is used as it is."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError as err:
        raise RuntimeError(f"multi-process training needs {err.args[0]} in the environment (start it with "
                           f"torchrun or `jointspace train --nproc N`)") from None
    local = int(os.environ.get("LOCAL_RANK", rank))
    cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if cuda:
        if not torch.cuda.is_available():
            raise RuntimeError("train.device=cuda but no CUDA device is available")
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local} has no GPU ({torch.cuda.device_count()} visible): start at "
                               f"most one process per GPU")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT, device_id=device if cuda else None)
    if dist.get_rank() != rank or dist.get_world_size() != world:
        raise RuntimeError(f"the process group (rank {dist.get_rank()} of {dist.get_world_size()}) is not the "
                           f"environment's (RANK={rank}, WORLD_SIZE={world})")
    return Distributed(rank, world, local, device, owns)


def launch(nproc: int, argv: list[str]) -> int:
    """Runs ``jointspace <argv>`` in ``nproc`` processes on this host under torchrun's elastic launcher, in this
    process (``--standalone``: rendezvous on a free local port; if one process fails the launcher stops the
    others). On CPU each process gets an equal share of the cores for its threads unless ``OMP_NUM_THREADS`` is
    set. Returns 0, or 1 when a process failed (the launcher prints which and why)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(["--standalone", f"--nproc_per_node={nproc}", "-m", "service.cli", *argv])
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads is None:     # the processes inherit this environment
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    try:
        run(args)
    except ChildFailedError as err:
        print(err, file=sys.stderr)
        return 1
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return 0
