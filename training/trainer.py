"""The training loop (STT §4.2): Adam, a learning-rate step, gradient clipping, early stopping on
validation R-sum, the best checkpoint kept as ``RUN_DIR/model.pt`` and per-epoch metrics in ``log.jsonl``.

Stage 1 trains the projections and the text encoder on precomputed features of a frozen pretrained
backbone (or, for a backbone trained from scratch, everything on pixels). Optional stage 2
(``train.finetune_epochs``) unfreezes the pretrained backbone and trains end to end at ``finetune_lr``.
Training reads only the train split and selects on val; the test split is never touched here. The final fit
(``train.fit_on: train+val``, once the recipe was chosen with val held out) trains on both and keeps its last epoch.
After every epoch ``RUN_DIR/last.pt`` holds the whole training state, so ``jointspace train --resume``
continues an interrupted run exactly where it stopped (:func:`load_train_state`).

Started by a launcher with more than one process (``torchrun``, ``jointspace train --nproc N``: ``WORLD_SIZE`` > 1)
the same loop runs DistributedDataParallel over the processes (distributed.py); ``train.batch_size`` is then
the global batch. Without a launcher nothing of torch.distributed is set up.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Sized, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from training.data.datasets import CaptionDataset, load_dataset
from training.data.features import Compute
from training.data.fileio import atomic_path, write_text
from training.data.sources import ImageSource, image_source, view_source
from training.data.vocab import SPECIALS, Vocabulary, pad_batch
from training.inference.backend import extraction_tower
from training.inference.device import resolve_device
from training.inference.embedding import autocast, embed_split, view_preprocess
from training.models.factory import build_loss
from training.models.losses import CrossBatchMemory, MemoryScores
from training.models.model import build_model, freeze_modules
from training.models.checkpoint import init_from_checkpoint, save_model
from training.models.config_schema import RunConfig
from training.models.options import NoOptions
from .batches import batch_features, image_inputs_to_embedding
from .optim import WeightAverage, build_optimizer, build_scheduler, param_groups, use_sparse_gradients
from .run_state import STATE_FILE, STATE_FORMAT, load_train_state, rng_state, seed_rank, set_rng_state
from .config import dump_config
from .distill import Teachers, distillation_loss
from .evaluate import minimal_pairs_of, public, retrieval_metrics

if TYPE_CHECKING:
    from .distributed import Distributed


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


class PairDataset(Dataset):
    """Every (image, caption) pair of the split; an epoch visits each caption once."""

    def __init__(self, source: ImageSource, caption_ids: list[list[int]], cap_to_img: list[int]):
        self.source, self.caption_ids, self.cap_to_img = source, caption_ids, cap_to_img

    def __len__(self) -> int:
        return len(self.caption_ids)

    def __getitem__(self, i: int):
        img = self.cap_to_img[i]
        image = self.source.data[img][1] if self.source.kind == "files" else self.source.data[img]
        return image, self.caption_ids[i], img, i


class OneCaptionPerImage(torch.utils.data.Sampler):
    """``train.sampling: image`` — each epoch visits every image once, with one of its captions at random.

    With ``groups`` (``train.sampling: minimal_pairs``) the images of a group — a minimal pair, two images
    whose captions differ only in word order or attribute binding — are visited one after the other, so
    they share a batch and each is the other's hard negative (composition-aware hard negatives, as in
    NegCLIP). Random batches almost never hold such a pair, and then nothing teaches the model binding.
    """

    def __init__(self, cap_to_img: list[int], generator: torch.Generator, groups: Sequence[tuple[int, ...]] = ()):
        self.generator = generator
        self.captions: dict[int, list[int]] = {}
        for cap, img in enumerate(cap_to_img):
            self.captions.setdefault(img, []).append(cap)
        grouped = {img for g in groups for img in g}
        self.units = [tuple(g) for g in groups] + [(img,) for img in self.captions if img not in grouped]

    def __len__(self) -> int:
        return sum(len(u) for u in self.units)

    def __iter__(self):
        order = torch.randperm(len(self.units), generator=self.generator).tolist()
        images = [img for i in order for img in self.units[i]]
        picks = torch.randint(0, 1 << 30, (len(images),), generator=self.generator).tolist()
        return iter(self.captions[img][p % len(self.captions[img])] for img, p in zip(images, picks))


def collate_pairs(batch):
    """``(images, caption ids, lengths, image index, caption index)``: the indices are the split's."""
    images, ids, img_idx, cap_idx = zip(*batch)
    padded, lengths = pad_batch(list(ids))
    return (torch.stack(images), padded, lengths, torch.tensor(img_idx, dtype=torch.long),
            torch.tensor(cap_idx, dtype=torch.long))


@dataclass
class Stage:
    name: str
    epochs: int
    lr: float
    batch_size: int
    backbone_trainable: bool


@dataclass
class Stepping:
    """What a stage steps with, kept in ``last.pt`` after every epoch so that a resumed run goes on as an unbroken
    one: the optimiser, its learning-rate schedule and the sampler's random generator."""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    generator: torch.Generator


def plan_stages(cfg: RunConfig, backbone_pretrained: bool) -> list[Stage]:
    train = cfg.train
    stages = [Stage("main", train.epochs, train.lr, train.batch_size,
                    backbone_trainable=not backbone_pretrained)]
    if train.finetune_epochs > 0 and backbone_pretrained:
        stages.append(Stage("finetune", train.finetune_epochs, train.finetune_lr, train.finetune_batch_size,
                            True))
    return stages


def distributed_requested() -> bool:
    """A launcher (torchrun, ``jointspace train --nproc N``) started more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def quiet(*_args) -> None:
    pass


class Trainer:
    def __init__(self, cfg: RunConfig, data: str | Path | CaptionDataset, out_dir: str | Path, progress: bool = True,
                 log=print):
        train = cfg.train
        self.dist = None            # a distributed.Distributed under a multi-process launcher
        if distributed_requested():
            from .distributed import env_world_size, start

            self.check_distributed(cfg, env_world_size())
            self.dist = start(train.device)
            if not self.dist.is_main:       # rank 0 logs and shows progress
                progress, log = False, quiet
        self.cfg, self.out_dir, self.progress, self.log = cfg, Path(out_dir), progress, log
        set_seed(train.seed)
        self.device = self.dist.device if self.dist is not None else resolve_device(train.device)
        self.amp = train.amp == "auto" and self.device.type == "cuda"
        dataset = data if isinstance(data, CaptionDataset) else load_dataset(data)
        # train.fit_on: train+val, the final fit, trains on val too (still scored each epoch, marked seen)
        self.val_seen = "val" in train.fit_splits
        self.train_set = dataset.splits(train.fit_splits)
        self.val_set = dataset.split("val")
        if self.train_set.n_images == 0 or self.val_set.n_images == 0:
            raise ValueError(f"{dataset.name}: training needs a train and a val split "
                             f"(found train={self.train_set.n_images}, val={self.val_set.n_images})")
        train_texts = [c for r in self.train_set.images for c in r.captions]
        max_words = cfg.data.max_words
        vocab = Vocabulary.build(train_texts, min_count=cfg.data.min_word_count,
                                 max_size=max_words + len(SPECIALS) if max_words else None)
        with self.main_first():     # downloads and caches: rank 0 fills them, the other ranks read them
            model = build_model(cfg, vocab)
            fit_start = time.time()
            # data-dependent encoder state (n-grams, word vectors, pretrained weights)
            model.text_encoder.fit(train_texts, vocab, log=log)
            self.fit_seconds = round(time.time() - fit_start, 1)
            if train.init_from:
                init_from_checkpoint(model, train.init_from, log=log)
            freeze_modules(model, train.freeze)
            # DDP reduces dense gradients (a sparse SGD update is the same update, only faster)
            sparse = use_sparse_gradients(model, train) if self.dist is None else []
            if sparse:
                log(f"sparse gradients for {sparse} (plain SGD updates only the rows a batch uses)")
            self.model = model.to(self.device)
            self.loss_fn = build_loss(cfg.loss)
            self.warmup_loss = build_loss(cfg.loss.model_copy(update={"name": "sum", "options": NoOptions()}))
            self.memory = CrossBatchMemory(cfg.loss.memory) if cfg.loss.memory else None
            self.teachers: Teachers | None = None       # loss.distill_from, read when the first stage starts
            self.distill_parts: list[float] = []
            if cfg.loss.distill_from:
                self.check_distillation(cfg)
            self.train_ids = [self.model.encode_text_ids([c])[0] for r in self.train_set.images for c in r.captions]
            # partial fine-tuning: the frozen bottom runs once (data/state_cache.py); a text encoder in train.freeze
            # runs whole in eval mode and never reads the cache (the STT decoder stages on a fixed space)
            if "text_encoder" not in train.freeze:
                from training.data.features import default_cache_dir

                self.model.text_encoder.cache_inputs(self.train_ids, cfg.image.cache_dir or default_cache_dir(),
                                                     dtype=train.cache_dtype, progress=progress, log=log)
        # every rank holds the global batch's embeddings when gathering negatives (DDP only)
        self.gather = self.dist is not None and train.gather_negatives
        if self.gather and self.loss_fn.on_pairs:
            raise ValueError(f"train.gather_negatives: loss {cfg.loss.name} compares each pair on its own "
                             f"(no negatives to gather)")
        if self.dist is not None:
            seed_rank(train.seed, self.dist.rank)    # dropout differs between ranks; rank 0 draws as one process
        self.train_cap_to_img = [r.image_id for r in self.train_set.images for _ in r.captions]
        self.best_score, self.best_rsum = float("-inf"), float("-inf")
        self.history: list[dict] = []
        self.resumed_state: dict | None = None     # the last.pt that run(resume=True) goes on from

    @property
    def is_main(self) -> bool:
        """Rank 0 of a multi-process run, or the only process: the one that validates and writes files."""
        return self.dist is None or self.dist.is_main

    def main_first(self):
        return self.dist.main_first() if self.dist is not None else contextlib.nullcontext()

    def check_distributed(self, cfg: RunConfig, world_size: int) -> None:
        """What a multi-process run cannot do, refused before the processes wait on each other."""
        from .distributed import check_config

        check_config(cfg, world_size)
        if cfg.train.gather_negatives and type(self).batch_loss is not Trainer.batch_loss:
            raise ValueError(f"train.gather_negatives: {type(self).__name__} computes its own batch loss; gathered "
                             f"negatives are implemented for the retrieval trainer (decoder and attention off)")

    def check_distillation(self, cfg: RunConfig) -> None:
        """What ``loss.distill_from`` cannot do, refused before any feature is extracted."""
        if type(self).batch_loss is not Trainer.batch_loss:
            raise ValueError(f"loss.distill_from: {type(self).__name__} computes its own batch loss; distillation is "
                             f"implemented for the retrieval trainer (decoder and attention off)")
        if self.loss_fn.on_pairs:
            raise ValueError(f"loss.distill_from: loss {cfg.loss.name} compares each pair on its own (no in-batch "
                             f"similarities to distil)")
        if cfg.model.similarity != "cosine":
            raise ValueError(f"loss.distill_from: the teachers' mean cosine is distilled into a cosine model, not "
                             f"model.similarity {cfg.model.similarity!r}")

    def read_teachers(self, train_source: ImageSource) -> None:
        """The teachers' tables for the training split (training/distill.py), once a run."""
        if not self.cfg.loss.distill_from or self.teachers is not None:
            return
        from training.data.features import default_cache_dir

        captions = [c for r in self.train_set.images for c in r.captions]
        with torch.random.fork_rng(devices=[]):     # building the teachers draws no number the run would have drawn
            self.teachers = Teachers.read(self.cfg.loss.distill_from, self.model, train_source, captions,
                                          cache_dir=self.cfg.image.cache_dir or default_cache_dir(), log=self.log,
                                          progress=self.progress)

    def source(self, dataset: CaptionDataset, trainable: bool, augment: bool = False) -> ImageSource:
        """Where ``dataset``'s images come from; ``augment`` (the training split) adds ``image.train_crops``
        views, or reads ``image.train_views``' in place of one view, with precomputed features (not with a
        trainable backbone's pixels)."""
        train, image = self.cfg.train, self.cfg.image
        paths = [r.path for r in dataset.images]
        compute = Compute(device=self.device, workers=train.workers, progress=self.progress, amp=self.amp,
                          tower=extraction_tower)
        source = image_source(self.model, paths, trainable=trainable, cache_dir=image.cache_dir, compute=compute)
        if augment and image.train_crops and source.kind == "features":
            source = view_source(self.model, paths, source,
                                 self.model.preprocess.views(image.train_crops, image.train_resize),
                                 cache_dir=image.cache_dir, compute=compute)
        elif augment and image.train_views != "none" and source.kind == "features":
            # the views index build averages, the evaluation view among them (embedding.view_preprocess)
            source = view_source(self.model, paths, source, view_preprocess(self.model, image.train_views),
                                 cache_dir=image.cache_dir, compute=compute, with_base=False)
        return source

    def selection_score(self, val: dict) -> float:
        """``train.select_on``: what the best checkpoint, early stopping and the plateau schedule follow (higher
        is better): the validation R-sum, or the decoder's teacher-forced validation NLL per word (negated;
        captioning and paraphrasing weighted by λ1 and λ2 of eq. 12)."""
        if self.val_seen:               # the final fit keeps its last epoch: a score that only grows
            return float(len(self.history))
        if self.cfg.train.select_on == "nll":
            decoder = self.cfg.decoder
            weights = {"ic": decoder.lambda_ic, "para": decoder.lambda_para}
            return -sum(w * val["nll"][k] for k, w in weights.items()) / sum(weights.values())
        return val["rsum"]

    def validate(self, source: ImageSource) -> dict:
        img, cap, cap_to_img = embed_split(self.model, self.val_set, device=self.device, amp=self.amp,
                                           workers=self.cfg.train.workers, source=source)
        return public(retrieval_metrics(img, cap, cap_to_img, self.model.similarity))

    def sampler(self, data: Dataset, item_to_img: list[int], generator: torch.Generator):
        """``train.sampling``: every item once (caption), or one item per image (image, minimal_pairs)."""
        train = self.cfg.train
        if train.sampling == "caption":
            return torch.utils.data.RandomSampler(cast(Sized, data), generator=generator)   # a map-style dataset
        groups = minimal_pairs_of(self.train_set) if train.sampling == "minimal_pairs" else []
        return OneCaptionPerImage(item_to_img, generator, groups)

    def make_loader(self, stage: Stage, train_source: ImageSource, generator: torch.Generator) -> DataLoader:
        """Batches of ``(images, caption ids, lengths, image index)`` for one epoch."""
        train = self.cfg.train
        pairs = PairDataset(train_source, self.train_ids, self.train_cap_to_img)
        sampler = self.sampler(pairs, self.train_cap_to_img, generator)
        return DataLoader(pairs, batch_size=stage.batch_size, sampler=sampler, collate_fn=collate_pairs,
                          drop_last=len(sampler) > stage.batch_size,
                          num_workers=train.workers if train_source.kind == "files" else 0)

    def ranking_loss(self, sim: torch.Tensor, img_idx: torch.Tensor, warm: bool,
                     memory: MemoryScores | None = None) -> torch.Tensor:
        return self.warmup_loss(sim, img_idx) if warm else self.loss_fn(sim, img_idx, memory=memory)

    def batch_loss(self, batch, kind: str, warm: bool) -> torch.Tensor:
        images, ids, lengths, img_idx, cap_idx = (x.to(self.device) for x in batch)
        model = self.model
        if self.loss_fn.on_pairs:
            # W2VV eqs. 8-9: the loss compares each caption's prediction with its image, un-normalised
            feats = batch_features(model, kind, images)
            loss = self.loss_fn(model.project_texts(ids, lengths), model.project_features(feats))
        else:
            img_emb = image_inputs_to_embedding(model, kind, images)
            cap_emb = model.embed_texts(ids, lengths)
            if self.gather:     # the global batch: every rank's loss is the whole batch's (distributed.py)
                dist = cast("Distributed", self.dist)      # set whenever self.gather is
                img_emb, cap_emb = dist.gather(img_emb), dist.gather(cap_emb)
                img_idx = dist.gather_ids(img_idx)
            memory = None
            if self.memory is not None and not warm:    # XBM: recent batches' embeddings as extra negatives
                memory = self.memory.scores(model.score, img_emb, cap_emb)
                self.memory.add(img_emb, cap_emb, img_idx)
            sim = model.score(img_emb, cap_emb)
            loss = self.ranking_loss(sim, img_idx, warm, memory)
            if self.teachers is not None:   # Hinton et al. 2015 over the batch's similarities (training/distill.py)
                kd = distillation_loss(sim, self.teachers.similarity(img_idx, cap_idx),
                                       self.cfg.loss.distill_temperature, self.cfg.loss.reduction)
                self.distill_parts.append(float(kd.detach()))
                loss = loss + self.cfg.loss.distill_weight * kd
        extra = model.text_encoder.regularizer()
        return loss if extra is None else loss + extra      # e.g. RCN eq. 15: L' = L + λV

    def epoch_log(self) -> dict:
        """Extra per-epoch entries for ``log.jsonl`` (subclasses log their loss terms here): the distillation
        term's mean when there is one."""
        parts, self.distill_parts = self.distill_parts, []
        return {"distill_loss": round(float(np.mean(parts)), 5)} if parts else {}

    def run(self, resume: bool = False) -> dict:
        """Trains every stage; ``resume`` continues from ``RUN_DIR/last.pt`` (written after every epoch) with the
        model, optimiser, schedule, sampler and random-number states it holds, so an interrupted run ends as
        the uninterrupted one would."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.out_dir / "log.jsonl"
        state = load_train_state(self.out_dir) if resume else None
        self.resumed_state = state          # subclasses' later stages (STT's self-critical one) go on from it
        if self.is_main:
            write_text(self.out_dir / "config.yaml", dump_config(self.cfg))
        if state is None:
            if self.is_main:
                log_path.write_text("")
        else:
            self.model.load_state_dict(state.pop("model"))      # not kept twice in memory for the whole run
            self.history, self.best_score, self.best_rsum = state["history"], state["best_score"], state["best_rsum"]
            if self.is_main:
                write_text(log_path, "".join(json.dumps(r) + "\n" for r in self.history))   # drop records after it
            unit = "update" if state["stage"] == "scst" else "epoch"
            self.log(f"resuming {self.out_dir} after {state['stage']} {unit} {state['epoch']}")
        start = time.time() - (state["elapsed_s"] if state else 0.0)
        for index, stage in enumerate(plan_stages(self.cfg, self.model.backbone_pretrained)):
            if state is not None and index < state["stage_index"]:
                continue
            here = state if state is not None and index == state["stage_index"] else None
            if not self.run_stage(stage, log_path, start, index, here):
                break
        seen = self.val_seen or self.best_rsum == float("-inf")     # a final fit's val R-sum measures nothing
        summary = {"best_val_rsum": None if seen else self.best_rsum, **({"val_seen": True} if self.val_seen else {}),
                   "epochs_run": len(self.history), "train_seconds": round(time.time() - start, 1),
                   "fit_seconds": self.fit_seconds, "model": str(self.out_dir / "model.pt")}
        self.log(json.dumps(summary))
        return summary

    def run_stage(self, stage: Stage, log_path: Path, start: float, index: int = 0, state: dict | None = None) -> bool:
        """Returns False when early stopping ended training. ``state``: a ``last.pt`` saved inside this stage."""
        if stage.epochs == 0:           # e.g. straight to the self-critical stage: no features, no optimiser
            return True
        train = self.cfg.train
        model = self.model
        model.set_backbone_trainable(stage.backbone_trainable)
        freeze_modules(model, train.freeze)
        with self.main_first():
            train_source = self.source(self.train_set, stage.backbone_trainable, augment=True)
            val_source = self.source(self.val_set, stage.backbone_trainable) if self.is_main else None
            self.read_teachers(train_source)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"nothing to train: train.freeze {train.freeze} leaves no trainable parameter")
        optimizer = build_optimizer(train, param_groups(model, train.encoder_lr_factor), stage.lr)
        generator = torch.Generator().manual_seed(train.seed + len(self.history))
        loader = self.make_loader(stage, train_source, generator)
        batch_loss = self.batch_loss
        if self.dist is not None:   # this rank's slice of each global batch; DDP averages the gradients
            loader = self.dist.shard_loader(loader)
            batch_loss = self.dist.wrap(model, self.batch_loss)
        steps = len(loader) if not train.max_steps_per_epoch else min(len(loader), train.max_steps_per_epoch)
        scheduler = build_scheduler(train, optimizer, stage.epochs * steps)
        per_step = train.lr_schedule == "cosine"
        average = WeightAverage(model, train.ema) if train.ema else None
        stepping = Stepping(optimizer, scheduler, generator)

        def kept_weights():
            """With train.ema the averaged weights are validated and kept (training goes on from the raw ones)."""
            return average.applied(model) if average is not None else contextlib.nullcontext()

        first, bad_epochs = 1, 0
        if state is not None:
            if state["stopped"]:
                return False
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            if average is not None and state.get("weight_average") is not None:
                average.load_state_dict(state["weight_average"])
            self.restore_rng(state, generator)
            first, bad_epochs = state["epoch"] + 1, state["bad_epochs"]
        for epoch in range(first, stage.epochs + 1):
            model.train()
            if not stage.backbone_trainable:
                model.backbone.eval()       # frozen: keep BatchNorm statistics fixed
            for name in train.freeze:
                getattr(model, name).eval()
            losses = []
            bar = tqdm(loader, desc=f"{stage.name} epoch {epoch}/{stage.epochs}", disable=not self.progress,
                       unit="batch", leave=False)
            warm = len(self.history) < self.cfg.loss.warmup_epochs
            if self.memory is not None:     # each epoch starts empty, so a resumed run mines as an unbroken one
                self.memory.clear()
            for step, batch in enumerate(bar):
                if train.max_steps_per_epoch and step >= train.max_steps_per_epoch:
                    break
                with autocast(self.device, self.amp):
                    loss = batch_loss(batch, train_source.kind, warm)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if train.grad_clip:
                    torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
                optimizer.step()
                if average is not None:
                    average.update(model)
                if per_step:
                    scheduler.step()
                losses.append(loss.item())
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if not per_step and not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step()
            mean_loss = float(np.mean(losses)) if losses else None
            if self.dist is not None and mean_loss is not None:
                mean_loss = self.dist.mean(mean_loss)       # every rank runs the same number of steps
            record = {"stage": stage.name, "epoch": epoch, "lr": optimizer.param_groups[0]["lr"],
                      "loss": round(mean_loss, 5) if mean_loss is not None else None,
                      "elapsed_s": round(time.time() - start, 1), **self.epoch_log()}
            if epoch % train.eval_every == 0 or epoch == stage.epochs:
                with kept_weights():
                    val = self.validate(cast(ImageSource, val_source)) if self.is_main else None
                if self.dist is not None:   # the others wait here; then every rank takes the same decisions
                    val = self.dist.broadcast(val)
                val = cast(dict, val)       # every rank's now
                record["val"] = {k: val[k] for k in ("i2t", "t2i", "rsum", "pooled", "nll") if k in val}
                if self.val_seen:
                    record["val_seen"] = True       # trained on: not a measure of the model
                score = self.selection_score(val)
                if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    scheduler.step(score)
                if score > self.best_score:
                    self.best_score, self.best_rsum, bad_epochs = score, val["rsum"], 0
                    record["best"] = True
                    if self.is_main:
                        with kept_weights():
                            save_model(model, self.out_dir / "model.pt",
                                       extra={"val": record["val"], "stage": stage.name, "epoch": epoch,
                                              **({"val_seen": True} if self.val_seen else {})})
                else:
                    bad_epochs += train.eval_every
            self.history.append(record)
            if self.is_main:
                with open(log_path, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
            stop = bad_epochs >= train.patience
            self.save_state(stage, index, epoch, stepping, bad_epochs, stop, start,
                            weight_average=average.state_dict() if average is not None else None)
            val_txt = f" val R-sum {record['val']['rsum']:.1f}" if "val" in record else ""
            self.log(f"[{stage.name} {epoch}/{stage.epochs}] loss {record['loss']}{val_txt}"
                     f"{' (best)' if record.get('best') else ''} {record['elapsed_s']}s")
            if stop:
                self.log(f"early stop: no validation {train.select_on} gain in {bad_epochs} epochs")
                return False
        return True

    def save_state(self, stage: Stage, index: int, epoch: int, stepping: Stepping, bad_epochs: int,
                   stopped: bool, start: float, **extra) -> None:
        """``RUN_DIR/last.pt``: everything ``run(resume=True)`` needs to go on after this epoch (atomic write).
        A multi-process run keeps every rank's random states (``rng_ranks``); rank 0 writes the file while the
        others wait."""
        rng = rng_state(stepping.generator)
        ranks = {} if self.dist is None else {"rng_ranks": self.dist.all_objects(rng),
                                              "world_size": self.dist.world_size}
        if self.is_main:
            self.write_state(stage.name, index, epoch, time.time() - start,
                             optimizer=stepping.optimizer.state_dict(), scheduler=stepping.scheduler.state_dict(),
                             rng=rng, bad_epochs=bad_epochs, stopped=stopped, **ranks, **extra)
        if self.dist is not None:
            self.dist.barrier()

    def restore_rng(self, state: dict, generator: torch.Generator) -> None:
        """The random states of ``state`` (a ``last.pt``): this rank's own when the run had as many processes;
        else rank 0's (the sampler's is the same on every rank), each other rank reseeding its own generators."""
        ranks = state.get("rng_ranks")
        if self.dist is None:
            set_rng_state(state["rng"], generator)
        elif ranks is not None and len(ranks) == self.dist.world_size:
            set_rng_state(ranks[self.dist.rank], generator)
        else:
            set_rng_state(state["rng"], generator)
            self.log(f"resuming with {self.dist.world_size} processes a run that had {state.get('world_size', 1)}: "
                     f"the random states of ranks other than 0 are reseeded")
            seed_rank(self.cfg.train.seed + state["epoch"], self.dist.rank)

    def write_state(self, stage: str, index: int, epoch: int, elapsed: float, **parts) -> None:
        """Writes ``RUN_DIR/last.pt`` atomically: the run's config, weights and history at ``epoch`` (or update)
        of stage ``index``, plus the stage's own ``parts`` (optimiser, random states, ...)."""
        state = {"format": STATE_FORMAT, "config": self.cfg.model_dump(), "stage": stage, "stage_index": index,
                 "epoch": epoch, "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                 "history": self.history, "best_score": self.best_score, "best_rsum": self.best_rsum,
                 "elapsed_s": elapsed, **parts}
        with atomic_path(self.out_dir / STATE_FILE) as tmp:
            torch.save(state, tmp)
