"""The joint embedding model (its file, ``model.pt``, is written and read by ``checkpoint.py``).

``JointEmbedding`` = image backbone → image projection, text encoder → text projection, and a similarity
that also decides the normalisation (STT §3.1, Fig. 10). Optional parts: ``decoder`` (STT §3.2, a sentence
decoder reading the common space; ``None`` unless ``decoder.enabled``) and ``attention`` (STT-ATT §3.3:
grid-cell regions, region-word attention; ``None`` unless ``attention.enabled``).
"""
from __future__ import annotations

from typing import Sequence, cast

import torch
from torch import nn

from training.data.preprocess import ImagePreprocess
from training.data.vocab import Vocabulary
from .attention import RegionWordAttention
from .backbones import Backbone, SplitCNN
from .concepts import ConceptHead
from .config_schema import RunConfig
from .decoder import build_decoder
from .ensemble import CommonSpace
from .factory import build_backbone, build_similarity, build_text_encoder, region_grid
from .pooling import Pool
from .projection import build_projection
from .regions import GridRegions
from .text_protocol import TextEncoder



class JointEmbedding(CommonSpace):
    def __init__(self, cfg: RunConfig, vocab: Vocabulary, backbone: Backbone):
        super().__init__()
        self.cfg = cfg
        self.vocab = vocab
        self.backbone_name = backbone.name
        self.backbone: nn.Module = backbone.module
        self.backbone_pretrained = backbone.pretrained
        self.feature_dim = backbone.dim
        self.preprocess: ImagePreprocess = backbone.preprocess
        att = cfg.attention
        self.attention = None
        # the regions its cached features hold (number, width, grid side), or None for pooled features
        self.region_layout: tuple[int, int, int] | None = None
        region_dim = backbone.dim
        if att.enabled:   # STT-ATT §3.3: the backbone yields grid-cell regions, (B, R·C) flattened
            grid = GridRegions(region_grid(backbone.name), backbone.module, cfg.image.image_size, att.grid)
            self.backbone = grid
            self.feature_dim, region_dim = grid.dim, grid.region_dim
            self.region_layout = (grid.n_regions, grid.region_dim, grid.grid)
            self.attention = RegionWordAttention(att.temperature)
        # partial fine-tuning / learned pooling of the CNN's grid: the cached "features" are then the frozen
        # bottom's activations, flattened, and the trained top + pooling run in project_features
        image = cfg.image
        self.image_split: SplitCNN | None = None
        self.image_pool: Pool | None = None
        if image.train_blocks or image.pooling != "mean":
            self.image_split = SplitCNN(self.backbone, image.train_blocks)
            self.image_pool = Pool(image.pooling)
            self.bottom_shape = self.image_split.bottom_shape(image.image_size)
            self.feature_dim = region_dim = cast(int, backbone.module.num_features)   # an EfficientNet's
            self.cache_dim = int(torch.tensor(self.bottom_shape).prod())
        # dropout on the pooled features in training (image.feature_dropout): a frozen backbone gives each training
        # image one fixed vector, which the projection could otherwise learn by heart
        self.feature_dropout = nn.Dropout(image.feature_dropout)
        self.image_proj = build_projection(cfg.model, region_dim)
        self.text_encoder: TextEncoder = build_text_encoder(cfg.text, len(vocab))
        self.text_proj = build_projection(cfg.model, self.text_encoder.out_dim,
                                          cfg.model.text_projection or cfg.model.projection)
        self.similarity = build_similarity(cfg.model.similarity)
        # STT §3.2: the sentence decoder (captions from images, paraphrases from sentences)
        self.decoder = build_decoder(cfg, len(vocab)) if cfg.decoder.enabled else None
        # what the backbones know (ConSE, concepts.py): fitted after training, the identity until then
        self.concepts = ConceptHead(cfg.concepts, backbone.classifiers, backbone.part_dims, cfg.model.embed_dim) \
            if cfg.concepts.enabled else None
        if image.channels_last:
            self.backbone.to(memory_format=torch.channels_last)

    # --- image side -------------------------------------------------------------------------------
    def image_features(self, images: torch.Tensor, pool: bool = True) -> torch.Tensor:
        """Normalised images ``(B, 3, S, S)`` or multi-crop ``(B, C, 3, S, S)`` → backbone features ``(B, D)``
        (crop features averaged), or ``(B, C, D)`` with ``pool=False``."""
        crops = images.shape[1] if images.dim() == 5 else 1
        flat = images.flatten(0, 1) if images.dim() == 5 else images
        if self.cfg.image.channels_last:
            flat = flat.contiguous(memory_format=torch.channels_last)
        feats = self.backbone(flat) if self.image_split is None else self.image_split.bottom(flat).flatten(1)
        feats = feats.view(-1, crops, feats.shape[-1])
        return feats.mean(1) if pool else feats

    @property
    def cached_dim(self) -> int:
        """Width of what ``image_features`` returns (and the feature cache stores) per view."""
        return self.feature_dim if self.image_split is None else self.cache_dim

    def pooled_features(self, features: torch.Tensor) -> torch.Tensor:
        """``image_features`` output → the pooled backbone vector ``(B, D)``: the trained top units over the
        cached activations, then mean or GPO pooling over the grid (VSE∞ §3.2); as is for a plain backbone."""
        if self.image_split is None:
            return features.float()
        x = features.view(features.shape[0], *self.bottom_shape)
        x = x.to(next(self.backbone.parameters()).dtype)
        if self.cfg.image.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        grid = self.image_split.top(x).flatten(2).transpose(1, 2).float()        # (B, h*w, D)
        pool = cast(Pool, self.image_pool)   # set with image_split
        return pool(grid, torch.ones(grid.shape[:2], dtype=torch.bool, device=grid.device))

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """Backbone features → the common space, before the similarity's normalisation."""
        return self.image_proj(self.feature_dropout(self.pooled_features(features)))

    def embed_features(self, features: torch.Tensor) -> torch.Tensor:
        """Backbone features → common space."""
        if self.attention is not None:   # STT-ATT §3.3: average pooling of the region embeddings
            return self.similarity.normalize(self.embed_regions(features).mean(1))
        if self.concepts is not None:    # ConSE eq. 1, gated (concepts.py)
            return self.similarity.normalize(self.concepts(features, self.project_features(features)))
        return self.similarity.normalize(self.project_features(features))

    def person_discount(self) -> float:
        """λ of the concept head's person discount (concepts.py, ``person_discount``); 0 without one."""
        head = self.concepts
        return float(head.cfg.person_discount) if head is not None and head.discounts_people else 0.0

    def unfamiliarity(self, features: torch.Tensor) -> torch.Tensor:
        """a(x) ``(B,)`` of backbone features for the person discount (concepts.py); zeros without one."""
        if self.concepts is None:
            return torch.zeros(features.shape[0], device=features.device)
        return self.concepts.unfamiliarity(features)

    def embed_regions(self, features: torch.Tensor) -> torch.Tensor:
        """STT-ATT: flattened grid features ``(B, R·C)`` → region embeddings ``(B, R, E)`` (not normalised)."""
        backbone = cast(GridRegions, self.backbone)   # with attention enabled
        regions = features.float().view(features.shape[0], backbone.n_regions, backbone.region_dim)
        return self.image_proj(regions.flatten(0, 1)).view(regions.shape[0], regions.shape[1], -1)

    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        return self.embed_features(self.image_features(images))

    # --- text side --------------------------------------------------------------------------------
    def encode_text_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Texts → the id lists the text encoder reads (its ``encode_text``): word ids of ``vocab``, unless the
        encoder tokenises itself (n-gram features, WordPiece; see text_encoders.py)."""
        encoder, max_len = self.text_encoder, self.cfg.data.max_caption_len
        return encoder.encode_texts(list(texts), self.vocab, max_len)

    def encode_word_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Texts → word ids of ``vocab``: what the sentence decoder writes, whatever the text encoder reads."""
        return [self.vocab.encode(t, max_len=self.cfg.data.max_caption_len) for t in texts]

    def project_texts(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Padded ids → the common space, before the similarity's normalisation."""
        return self.text_proj(self.text_encoder(ids, lengths))


    # --- training helpers -------------------------------------------------------------------------
    def set_backbone_trainable(self, trainable: bool) -> None:
        """All of the backbone, or (``False``) only its top units under partial fine-tuning."""
        for p in self.backbone.parameters():
            p.requires_grad_(trainable)
        if self.image_split is not None:
            for module in self.image_split.top_modules():
                module.requires_grad_(True)


def build_model(cfg: RunConfig, vocab: Vocabulary, load_weights: bool = True) -> JointEmbedding:
    return JointEmbedding(cfg, vocab, build_backbone(cfg.image, load_weights=load_weights))


def freeze_modules(model: JointEmbedding, names) -> None:
    """``train.freeze``: the named top-level modules (e.g. ``image_proj``, ``text_encoder``, ``text_proj``)
    get no gradients (the trainer also keeps them in eval mode: no dropout)."""
    known = {name for name, _ in model.named_children()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"train.freeze: no module {', '.join(unknown)} (modules: {', '.join(sorted(known))})")
    for name in names:
        getattr(model, name).requires_grad_(False)
