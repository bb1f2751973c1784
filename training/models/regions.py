"""Image regions for STT-ATT (STT §3.3) as the cells of a CNN's last spatial feature map.

The paper's regions are the 36 best Faster R-CNN proposals, each cropped and encoded by ResNet-152. Region
detectors are not available offline, so jointspace uses the backbone's spatial grid instead: each cell of the
last convolutional map (7 × 7 for EfficientNet-Lite0 and ResNets at 224 px, 4 × 4 for the small CNN) is one
region, with that cell's channel vector as its feature. ``attention.grid`` optionally average-pools the map
to a coarser grid first.

:class:`GridRegions` wraps a backbone so that it returns the grid flattened to ``(B, R · C)``: to the rest of
the training package (the feature cache, the image sources) it is simply a backbone with a wider feature, so
grid features are cached exactly like pooled ones. Each backbone's feature map is one function below; the
backbone names map to them in factory.py (``REGION_GRIDS``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, cast

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from timm.models.efficientnet import EfficientNet
    from torchvision.models import VGG, ResNet

    from .backbones import SmallCNN

FeatureMap = Callable[[nn.Module, torch.Tensor], torch.Tensor]   # (network, images) → its last feature map


def timm_map(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return cast("EfficientNet", net).forward_features(x)   # (B, 1280, 7, 7) at 224 px (8, 8 for Lite2 at 260)


def resnet_map(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    res = cast("ResNet", net)
    x = res.maxpool(res.relu(res.bn1(res.conv1(x))))
    return res.layer4(res.layer3(res.layer2(res.layer1(x))))   # (B, 2048, 7, 7) for resnet50+ at 224 px


def vgg_map(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return cast("VGG", net).features(x)                          # (B, 512, 7, 7) at 224 px


def smallcnn_map(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return cast("SmallCNN", net).features(x)                          # (B, 4·width, 4, 4)


class GridRegions(nn.Module):
    """A backbone returning its feature-map cells as regions, flattened: images → ``(B, R · C)``."""

    def __init__(self, feature_map: FeatureMap, net: nn.Module, image_size: int, grid: int = 0):
        super().__init__()
        self.net = net
        self.feature_map = feature_map
        self.grid = int(grid)
        was_training = net.training
        net.eval()
        with torch.no_grad():
            shape = self.regions(torch.zeros(1, 3, image_size, image_size)).shape
        net.train(was_training)
        self.n_regions, self.region_dim = int(shape[1]), int(shape[2])

    def regions(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, 3, S, S)`` → regions ``(B, R, C)``, row-major over the grid."""
        fmap = self.feature_map(self.net, x)
        if self.grid:
            fmap = F.adaptive_avg_pool2d(fmap, self.grid)
        return fmap.flatten(2).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.regions(x).flatten(1)

    @property
    def dim(self) -> int:
        return self.n_regions * self.region_dim
