"""Test-time augmentation's views (``MirroredViews``, ``index build --tta flip`` / ``flip-crop``) resize each image
once per preprocessing and cut the mirror image's views from the resized image mirrored: bit for bit the views of
the mirrored image resized on its own, for every geometry (odd margins a centre crop cannot split evenly, five and
ten crops, stacked members of several sizes, the closer zoomed view, modes other than RGB)."""
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from training.data.preprocess import ZOOM, MirroredViews, Preprocess, StackedPreprocess, _rgb

HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
BASES = {
    "centre": Preprocess(image_size=24, resize=24),
    "resize above the crop": Preprocess(image_size=24, resize=29),
    "five crops": Preprocess(image_size=20, resize=27, crops=5),
    "ten crops": Preprocess(image_size=20, resize=27, crops=10),
    "stacked": StackedPreprocess((Preprocess(26, 26, *HALF), Preprocess(22, 22, *HALF), Preprocess(24, 24, *HALF))),
}


def mirrored_apart(views: MirroredViews, image: Image.Image) -> torch.Tensor:
    """The views as they were cut before: the image mirrored whole, then each image preprocessed on its own."""
    image = _rgb(image)
    mirror = ImageOps.mirror(image)
    return torch.cat([b.pixels(im) for b in views._bases for im in (image, mirror)])


@pytest.mark.parametrize("name", BASES)
@pytest.mark.parametrize("zoom", [None, ZOOM])
def test_one_resize_gives_the_mirror_images_views_bit_for_bit(name, zoom):
    views = MirroredViews(BASES[name], zoom=zoom)
    rng = np.random.default_rng(len(name))
    for width, height in [(64, 48), (48, 64), (101, 77), (77, 101), (333, 250), (40, 41), (257, 999)]:
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        got = views.pixels(image)
        assert got.shape[0] == views.crops
        assert torch.equal(got, mirrored_apart(views, image)), (name, zoom, width, height)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK"])
def test_other_modes_are_converted_once_then_mirrored(mode):
    views = MirroredViews(BASES["stacked"], zoom=ZOOM)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (61, 83, 3), dtype=np.uint8)).convert(mode)
    assert torch.equal(views.pixels(image), mirrored_apart(views, image))


def test_the_first_views_are_the_images_own_and_the_next_its_mirror_images():
    base = BASES["resize above the crop"]
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (50, 71, 3), dtype=np.uint8))
    px = MirroredViews(base).pixels(image)
    assert torch.equal(px[:1], base.pixels(image))
    assert torch.equal(px[1:], base.pixels(ImageOps.mirror(image)))
