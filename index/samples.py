"""A sample gallery of real photos for the demo, taken from packages the project installs (nothing is
downloaded, nothing is committed): the public-domain / CC0 sample photos of scikit-image and the two CC BY 2.0
photos of scikit-learn, each with its source and licence, plus a corpus of captions written for this project.

``jointspace index samples --out DIR`` copies them to ``DIR/photos`` (JPEG) and writes ``DIR/captions.txt`` and
``DIR/ATTRIBUTION.md``.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from training.data.fileio import write_text


@dataclass(frozen=True)
class Sample:
    package: str          # the installed package that ships the file
    relative: str         # its path inside the package
    name: str             # the file name in the gallery
    credit: str           # author / source and licence, as the package states them


SAMPLES = [
    Sample("skimage", "data/astronaut.png", "astronaut.jpg",
           "Eileen Collins, NASA; no known copyright restrictions, public domain (scikit-image data)"),
    Sample("skimage", "data/chelsea.png", "cat.jpg", "Stefan van der Walt; CC0 (scikit-image data)"),
    Sample("skimage", "data/coffee.png", "coffee.jpg", "Rachel Michetti; CC0 (scikit-image data)"),
    Sample("skimage", "data/rocket.jpg", "rocket.jpg", "SpaceX; public domain (scikit-image data)"),
    Sample("skimage", "data/camera.png", "cameraman.jpg", "Lav Varshney; CC0 (scikit-image data)"),
    Sample("skimage", "data/hubble_deep_field.jpg", "galaxies.jpg", "NASA; public domain (scikit-image data)"),
    Sample("skimage", "data/coins.png", "coins.jpg", "no known copyright restrictions (scikit-image data)"),
    Sample("skimage", "data/grass.png", "grass.jpg", "CC0 Textures; CC0 (scikit-image data)"),
    Sample("skimage", "data/gravel.png", "gravel.jpg", "CC0 Textures; CC0 (scikit-image data)"),
    Sample("skimage", "data/brick.png", "brick_wall.jpg", "CC0 Textures; CC0 (scikit-image data)"),
    Sample("skimage", "data/clock_motion.png", "clock.jpg",
           "Stefan van der Walt; public domain (scikit-image data)"),
    Sample("skimage", "data/text.png", "text.jpg", "no known copyright restrictions, public domain (scikit-image data)"),
    Sample("sklearn", "datasets/images/china.jpg", "temple.jpg",
           "danielbuechele on Flickr; CC BY 2.0 (scikit-learn sample images)"),
    Sample("sklearn", "datasets/images/flower.jpg", "flower.jpg",
           "vultilion on Flickr; CC BY 2.0 (scikit-learn sample images)"),
]

# written for this project (no licence restrictions): the corpus that image → caption search ranks
CAPTIONS = """\
a woman in a space suit smiles in front of a flag
an astronaut poses for a portrait
a cat sits on a mat and looks at the camera
a tabby cat with green eyes
a cup of coffee on a saucer
a white mug of coffee with foam on top
a rocket lifts off into the sky trailing smoke
a space launch seen from a distance
a man stands outside with a camera on a tripod
a black and white photo of a photographer
many galaxies in the dark night sky
a field of stars and galaxies
old coins on a grey background
a close up of green grass
a patch of gravel and small stones
a red brick wall
a clock on a wall
a page of printed text
an ornate temple with a tiled roof under a blue sky
a pink flower in bloom
a dog runs through the grass
two children play on the beach
a man rides a bicycle down the street
a group of people stand in front of a building
a brown dog jumps to catch a ball
a girl in a pink dress climbs the stairs
a skier goes down a snowy hill
a surfer rides a wave
a boy jumps into a swimming pool
people walk along a busy city street
"""


def _package_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the sample photos need the installed package '{name}'")
    return Path(spec.origin).parent


def write_samples(out: str | Path) -> Path:
    """Copies the sample photos to ``out/photos`` as RGB JPEGs; writes ``out/captions.txt`` and
    ``out/ATTRIBUTION.md``. Returns the photo folder."""
    out = Path(out)
    photos = out / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    lines = ["# Sample photos", "", "Copied from installed packages; sources and licences as those packages state "
             "them.", "", "| file | source and licence |", "|---|---|"]
    for sample in SAMPLES:
        source = _package_root(sample.package) / sample.relative
        with Image.open(source) as im:
            rgb = im.convert("RGB")
        target = photos / sample.name
        tmp = target.with_suffix(".tmp.jpg")
        rgb.save(tmp, format="JPEG", quality=92)
        tmp.replace(target)
        lines.append(f"| `{sample.name}` | {sample.credit} |")
    write_text(out / "ATTRIBUTION.md", "\n".join(lines) + "\n")
    write_text(out / "captions.txt", CAPTIONS)
    return photos
