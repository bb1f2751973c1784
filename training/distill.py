"""Distilling trained models into the one being trained (``loss.distill_from``): the student's in-batch
similarities are pulled towards the teachers' mean cosine, as the ensemble of those teachers
(``jointspace ensemble``) would rank the same batch.

The teachers are read once, before the first step: each training image's embedding as every teacher sees it
before its concept head (the views of a ``views`` source averaged, as ``index build --tta`` averages them), and each
training caption's. For ``T`` teachers the two tables hold the teachers' unit vectors side by side, each scaled by
``1/sqrt(T)``, so that one product gives the mean of the teachers' cosines: the similarity of their ensemble
(training/models/ensemble.py, equal weights). The caption table is cached under the feature cache, keyed by the
teacher's fingerprint and the captions, so that a second run with the same teachers embeds nothing.

The loss (Hinton et al., 2015, over the batch's similarity matrix in both directions, as CLIP-KD and
TinyCLIP distil a CLIP): with ``P = softmax(S_teacher / tau)`` and ``Q = softmax(S_student / tau)`` over each
image's captions (rows) and each caption's images (columns), ``tau * sum_anchors KL(P || Q)``, halved over the
two directions. Scaled by ``tau``, its gradient on one cosine is the mean of ``Q - P`` over its row and its
column (each softmax's share of that pair), of the order of the ranking loss's hinge gradients (1 per violating
pair), so that ``loss.distill_weight`` 1 weighs the two alike.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence, cast

import torch
import torch.nn.functional as F

from training.data.fileio import atomic_path
from training.batches import embed_views
from training.data.sources import ImageSource
from training.inference.embedding import device_of, embed_texts
from training.models.checkpoint import load_checkpoint, load_model
from training.models.config_schema import ConfigError
from training.models.ensemble import KIND as ENSEMBLE_KIND
from training.models.model import JointEmbedding

TEXT_CACHE = "distill"          # folder of the teachers' caption tables under the feature cache


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, tau: float,
                      reduction: str = "sum") -> torch.Tensor:
    """``tau * KL(softmax(teacher / tau) || softmax(student / tau))`` over the rows (image → captions) and the
    columns (caption → images) of two ``(B, B)`` similarity matrices, halved over the two directions, summed or
    averaged over the anchors (``reduction``, as the ranking loss's)."""
    if student.shape != teacher.shape or student.dim() != 2:
        raise ValueError(f"similarity matrices of one shape expected, got {tuple(student.shape)} and "
                         f"{tuple(teacher.shape)}")
    teacher = teacher.detach().float()
    student = student.float()
    parts = []
    for dim in (1, 0):          # each image over the captions, each caption over the images
        target = F.log_softmax(teacher / tau, dim=dim)
        log_q = F.log_softmax(student / tau, dim=dim)
        parts.append((target.exp() * (target - log_q)).sum(dim))     # KL(P || Q) per anchor
    per_anchor = (parts[0] + parts[1]) / 2
    total = per_anchor.sum() if reduction == "sum" else per_anchor.mean()
    return tau * total


def _check_features(source: ImageSource) -> None:
    """ConfigError unless ``source`` holds precomputed backbone features (one view or several)."""
    if source.kind not in ("features", "views"):
        raise ConfigError(f"loss.distill_from: distilling reads the teachers' embeddings of precomputed backbone "
                          f"features (a frozen pretrained image.backbone); this run trains on {source.kind}")


def teacher_images(teacher, source: ImageSource) -> torch.Tensor:
    """Each image of ``source`` embedded by ``teacher`` before its concept head ``(N, E)``, unit length; a
    ``views`` source's views embedded one by one and averaged, then normalised again."""
    _check_features(source)

    def before_head(features: torch.Tensor) -> torch.Tensor:
        return teacher.similarity.normalize(teacher.project_features(features).float())
    return F.normalize(embed_views(teacher, source, batch_size=512, embed=before_head).mean(1), dim=-1).cpu()


def _caption_key(teacher, captions: Sequence[str]) -> str:
    digest = hashlib.sha256(json.dumps([teacher.fingerprint, list(captions)]).encode()).hexdigest()
    return digest[:32]


@torch.no_grad()
def teacher_captions(teacher, captions: Sequence[str], cache_dir: str | Path | None = None,
                     progress: bool = False) -> torch.Tensor:
    """``captions`` embedded by ``teacher`` ``(M, E)``, unit length; read from (or written to) ``cache_dir``."""
    path = Path(cache_dir) / TEXT_CACHE / f"{_caption_key(teacher, captions)}.pt" if cache_dir else None
    if path is not None and path.exists():
        cached = torch.load(path, map_location="cpu", weights_only=True)
        if cached.shape[0] == len(captions):
            return cached.float()
    emb = F.normalize(embed_texts(teacher, list(captions), batch_size=256, progress=progress).float().cpu(), dim=-1)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            torch.save(emb.half(), tmp)
        emb = emb.half().float()     # what a second run reads
    return emb


def load_teacher(path: str | Path, student, device: str | torch.device = "cpu"):
    """A teacher model file, refused when it cannot teach ``student``: an ensemble file (name its members), or
    a model that reads other backbone features than the student's cache holds."""
    if not Path(path).is_file():
        raise ConfigError(f"loss.distill_from: no model file {str(path)!r}")
    payload = load_checkpoint(path)
    if payload.get("kind") == ENSEMBLE_KIND:
        raise ConfigError(f"loss.distill_from: {str(path)!r} is an ensemble; name its member files instead")
    teacher = cast(JointEmbedding, load_model(path, device=device, payload=payload))
    mine, theirs = student.cfg.image, teacher.cfg.image
    fields = ("backbone", "image_size", "resize", "crops", "extra_backbones")
    differ = [f for f in fields if getattr(mine, f) != getattr(theirs, f)]
    if differ or teacher.cached_dim != student.cached_dim:
        raise ConfigError(f"loss.distill_from: {str(path)!r} reads other image features than this run "
                          f"(image.{', image.'.join(differ) or 'backbone'} differ)")
    return teacher.eval()


class Teachers:
    """The teachers' image and caption tables; :meth:`similarity` is their ensemble's cosine for a batch."""

    def __init__(self, images: torch.Tensor, captions: torch.Tensor):
        self.images, self.captions = images, captions

    @classmethod
    def read(cls, paths: Sequence[str | Path], student, source: ImageSource, captions: Sequence[str],
             cache_dir: str | Path | None = None, log=print, progress: bool = False) -> Teachers:
        _check_features(source)
        images, texts = [], []
        scale = len(paths) ** -0.5
        for path in paths:
            teacher = load_teacher(path, student, device=device_of(student))
            log(f"distilling from {path}: embedding {len(source)} training images and {len(captions)} captions")
            images.append(teacher_images(teacher, source) * scale)
            texts.append(teacher_captions(teacher, captions, cache_dir, progress=progress) * scale)
            del teacher
        return cls(torch.cat(images, 1), torch.cat(texts, 1))

    def similarity(self, img_idx: torch.Tensor, cap_idx: torch.Tensor) -> torch.Tensor:
        """``(B, B)``: the teachers' mean cosine between the batch's images (rows) and captions (columns)."""
        device = img_idx.device
        return self.images[img_idx.cpu()].to(device) @ self.captions[cap_idx.cpu()].to(device).T
