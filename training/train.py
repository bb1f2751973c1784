"""``train(cfg, data, out_dir)``: trains a config, with the trainer its sections call for — the retrieval
trainer (trainer.py), or Show, Translate and Tell's (stt.py: a sentence decoder and/or region attention).

The names tests and tools use from the training loop are importable from here as well.
"""
from __future__ import annotations

from pathlib import Path

from training.data.features import Compute
from training.inference.backend import extraction_tower
from training.inference.querybank import BankDraw, attach, describe, make_bank
from training.models.config_schema import RunConfig
from .stt import STTTrainer
from .optim import build_optimizer, build_scheduler, cosine_factor, param_groups
from .run_state import load_train_state
from .trainer import Stage, Trainer, plan_stages

__all__ = ["Stage", "Trainer", "attach_from_training", "build_optimizer", "build_scheduler", "cosine_factor",
           "load_train_state", "param_groups", "plan_stages", "train"]


def train(cfg: RunConfig, data, out_dir, progress: bool = True, log=print, resume: bool = False) -> dict:
    """Trains ``cfg`` on ``data`` into ``out_dir``; ``resume`` continues the run's ``last.pt``. Under a launcher
    with several processes (torchrun: ``WORLD_SIZE`` > 1) every process calls this and they train as one."""
    stt = cfg.decoder.enabled or cfg.attention.enabled
    trainer = (STTTrainer if stt else Trainer)(cfg, data, out_dir, progress=progress, log=log)
    try:
        summary = trainer.run(resume=resume)
        kept = trainer.out_dir / "model.pt"
        if trainer.is_main and cfg.concepts.enabled and kept.is_file():   # the concept head, fitted after training
            from .fit_concepts import fit_file

            summary["concepts"] = fit_file(kept, trainer.train_set, device=trainer.device, workers=cfg.train.workers,
                                           progress=progress, log=log)
        if trainer.is_main:         # the query bank the kept checkpoint carries (config section querybank)
            bank = attach_from_training(cfg, trainer.out_dir / "model.pt", trainer.train_set, device=trainer.device,
                                        progress=progress, log=log)
            summary["querybank"] = None if bank is None else {"captions": len(bank["captions"]),
                                                              "images": len(bank["images"])}
        return summary
    finally:
        if trainer.dist is not None:    # a multi-process run (distributed.py) leaves its process group
            trainer.dist.close()


def attach_from_training(cfg: RunConfig, model_file: Path, train_set, device="cpu", progress: bool = False,
                         log=print) -> dict | None:
    """After ``jointspace train``: the ``querybank`` section's bank from the training split, attached to
    ``model_file`` (the kept checkpoint). None (and nothing written) when the section turns it off, the model
    is not a cosine one, or there is no checkpoint."""
    from training.models.checkpoint import load_model

    section = cfg.querybank
    if not section.enabled or not model_file.is_file():
        return None
    if cfg.model.similarity != "cosine":
        log(f"querybank: none attached ({cfg.model.similarity} similarity; QB-Norm corrects cosine scores)")
        return None
    if not section.captions and not section.images:
        return None
    model = load_model(model_file, device)
    bank = make_bank(model, train_set, BankDraw(section.captions, section.images, section.beta, seed=cfg.train.seed),
                     Compute(device=device, workers=cfg.train.workers, progress=progress, tower=extraction_tower))
    attach(model_file, bank)
    log(f"querybank: {describe(bank)} attached to {model_file}")
    return bank
