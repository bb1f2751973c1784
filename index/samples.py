"""A sample gallery of real photos for the demo, taken from packages the project installs (nothing is
downloaded, nothing is committed): the public-domain / CC0 sample photos of scikit-image and the two CC BY 2.0
photos of scikit-learn, each with its source and licence, plus a corpus of captions written for this project.

Two short video clips are made from those photos (:data:`CLIPS`: each photo a 5-second scene, slowly zoomed in),
so the demo gallery has video moments too.

Each sample carries a fixed capture date, written into the copy's EXIF DateTimeOriginal (a clip's: its file's
modification time), so the page's date filters have dates to filter rather than the day of the copy. Two files
record when they were made (XMP CreateDate of ``cat.jpg`` and ``galaxies.jpg``): those dates are kept; the others
record none, and theirs are dates chosen for the demo, spread over several years, not the day they were taken.

One photo is also copied a second time, smaller and saved again at a lower JPEG quality (:data:`NEAR_DUPLICATE`),
so the gallery holds a pair of near-duplicates for ``index duplicates`` and the page's Duplicates view to find.

``jointspace index samples --out DIR`` copies them to ``DIR/photos`` (JPEG), writes the clips to
``DIR/photos/videos`` (H.264 MP4, by PyAV) and ``DIR/captions.txt`` and ``DIR/ATTRIBUTION.md``.
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
from PIL import Image

from training.data.fileio import write_text


@dataclass(frozen=True)
class Sample:
    package: str          # the installed package that ships the file
    relative: str         # its path inside the package
    name: str             # the file name in the gallery
    credit: str           # author / source and licence, as the package states them
    taken: str            # capture date written into the copy (EXIF form, read as UTC): see the module's docstring


SAMPLES = [
    Sample("skimage", "data/astronaut.png", "astronaut.jpg",
           "Eileen Collins, NASA; no known copyright restrictions, public domain (scikit-image data)",
           "2015:03:14 10:00:00"),
    Sample("skimage", "data/chelsea.png", "cat.jpg", "Stefan van der Walt; CC0 (scikit-image data)",
           "2009:02:09 11:11:30"),                                                   # the file's XMP CreateDate
    Sample("skimage", "data/coffee.png", "coffee.jpg", "Rachel Michetti; CC0 (scikit-image data)",
           "2019:11:02 08:30:00"),
    Sample("skimage", "data/rocket.jpg", "rocket.jpg", "SpaceX; public domain (scikit-image data)",
           "2018:02:06 20:45:00"),
    Sample("skimage", "data/camera.png", "cameraman.jpg", "Lav Varshney; CC0 (scikit-image data)",
           "2011:05:21 14:00:00"),
    Sample("skimage", "data/hubble_deep_field.jpg", "galaxies.jpg", "NASA; public domain (scikit-image data)",
           "2012:06:29 13:29:00"),                                     # the file's XMP CreateDate, 09:29 -04:00
    Sample("skimage", "data/coins.png", "coins.jpg", "no known copyright restrictions (scikit-image data)",
           "2013:09:07 16:20:00"),
    Sample("skimage", "data/grass.png", "grass.jpg", "CC0 Textures; CC0 (scikit-image data)",
           "2021:06:12 12:00:00"),
    Sample("skimage", "data/gravel.png", "gravel.jpg", "CC0 Textures; CC0 (scikit-image data)",
           "2021:06:12 12:05:00"),
    Sample("skimage", "data/brick.png", "brick_wall.jpg", "CC0 Textures; CC0 (scikit-image data)",
           "2021:06:13 09:40:00"),
    Sample("skimage", "data/clock_motion.png", "clock.jpg",
           "Stefan van der Walt; public domain (scikit-image data)", "2016:10:30 02:00:00"),
    Sample("skimage", "data/text.png", "text.jpg", "no known copyright restrictions, public domain (scikit-image data)",
           "2010:01:18 15:00:00"),
    Sample("sklearn", "datasets/images/china.jpg", "temple.jpg",
           "danielbuechele on Flickr; CC BY 2.0 (scikit-learn sample images)", "2017:04:22 11:15:00"),
    Sample("sklearn", "datasets/images/flower.jpg", "flower.jpg",
           "vultilion on Flickr; CC BY 2.0 (scikit-learn sample images)", "2020:05:03 17:30:00"),
]

class NearDuplicate(NamedTuple):
    """A resized, recompressed copy of one sample photo: the demo's near-duplicate pair."""
    source: str               # the sample's file name in the gallery
    name: str                 # the copy's
    scale: float              # its sides, as a fraction of the source's
    quality: int              # its JPEG quality (the samples: 92)
    taken: str                # its capture date (EXIF form): the same scene, re-saved later


NEAR_DUPLICATE = NearDuplicate("flower.jpg", "flower_small.jpg", 0.5, 70, "2020:05:03 17:30:00")


class Clip(NamedTuple):
    """A clip made from the sample photos."""
    name: str                 # the file name in the gallery's videos/ folder
    scenes: tuple[str, ...]   # the photos of its scenes, in order
    taken: str                # capture date (EXIF form, read as UTC), set as the file's modification time


CLIPS = [Clip("space.mp4", ("astronaut.jpg", "rocket.jpg", "galaxies.jpg"), "2022:07:20 10:00:00"),
         Clip("at_home.mp4", ("cat.jpg", "coffee.jpg", "flower.jpg"), "2023:12:24 18:00:00")]
_EXIF_IFD, _DATETIME_ORIGINAL = 0x8769, 0x9003
SCENE_SECONDS = 5          # one moment of the index's default window (index.choices.DEFAULT_WINDOW) per scene
CLIP_FPS = 8
CLIP_SIZE = (640, 480)
ZOOM = 1.15                # each scene zooms in from the whole photo to 1/ZOOM of it, about its centre

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


def _unix(taken: str) -> float:
    """An EXIF date-time (``YYYY:MM:DD HH:MM:SS``) read as UTC, as Unix seconds."""
    return dt.datetime.strptime(taken, "%Y:%m:%d %H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()


def _package_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the sample photos need the installed package '{name}'")
    return Path(spec.origin).parent


def _scene(photo: Image.Image) -> Iterator[np.ndarray]:
    """The frames of one scene: a ``CLIP_SIZE`` window (the photo's largest centred crop of that shape) zooming in
    from 1 to ``ZOOM`` over ``SCENE_SECONDS``."""
    width, height = photo.size
    aspect = CLIP_SIZE[0] / CLIP_SIZE[1]
    crop_w, crop_h = (width, width / aspect) if width / height < aspect else (height * aspect, height)
    n = SCENE_SECONDS * CLIP_FPS
    for i in range(n):
        scale = 1 + (ZOOM - 1) * i / (n - 1)
        w, h = crop_w / scale, crop_h / scale
        box = ((width - w) / 2, (height - h) / 2, (width + w) / 2, (height + h) / 2)
        yield np.asarray(photo.resize(CLIP_SIZE, Image.Resampling.BILINEAR, box=box))


def write_clips(photos: Path) -> list[Path]:
    """The :data:`CLIPS`, made from the photos in ``photos``, written to ``photos/videos``."""
    from .video_writer import write_video

    folder = photos / "videos"
    folder.mkdir(exist_ok=True)
    out = []
    for name, scenes, taken in CLIPS:
        def frames(scenes=scenes):
            for scene in scenes:
                with Image.open(photos / scene) as im:
                    yield from _scene(im.convert("RGB"))
        target = folder / name
        tmp = target.with_name(f".{name}.tmp.mp4")       # a hidden name: never indexed half-written
        write_video(tmp, frames(), fps=CLIP_FPS, faststart=True)
        when = _unix(taken)
        os.utime(tmp, (when, when))                     # the clip's capture time (it has no creation_time)
        tmp.replace(target)
        out.append(target)
    return out


def _write_jpeg(rgb: Image.Image, target: Path, taken: str, quality: int) -> None:
    """``rgb`` as a JPEG at ``target`` with ``taken`` as its EXIF DateTimeOriginal (written under a temporary name,
    then renamed: never half-written)."""
    exif = Image.Exif()
    exif.get_ifd(_EXIF_IFD)[_DATETIME_ORIGINAL] = taken
    tmp = target.with_suffix(".tmp.jpg")
    rgb.save(tmp, format="JPEG", quality=quality, exif=exif)
    tmp.replace(target)


def write_near_duplicate(photos: Path) -> Path:
    """The :data:`NEAR_DUPLICATE` copy of a photo in ``photos``: resized (Lanczos) and saved again."""
    copy = NEAR_DUPLICATE
    with Image.open(photos / copy.source) as im:
        rgb = im.convert("RGB")
    size = (round(rgb.width * copy.scale), round(rgb.height * copy.scale))
    target = photos / copy.name
    _write_jpeg(rgb.resize(size, Image.Resampling.LANCZOS), target, copy.taken, copy.quality)
    return target


def write_samples(out: str | Path, near_duplicate: bool = True) -> Path:
    """Copies the sample photos to ``out/photos`` as RGB JPEGs (with the :data:`NEAR_DUPLICATE` copy unless
    ``near_duplicate`` is false: the benchmarks that rank the samples against their captions leave it out), makes
    the :data:`CLIPS` from them in ``out/photos/videos``; writes ``out/captions.txt`` and ``out/ATTRIBUTION.md``.
    Returns the photo folder."""
    out = Path(out)
    photos = out / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    lines = ["# Sample photos", "", "Copied from installed packages; sources and licences as those packages state "
             "them.", "", "| file | source and licence |", "|---|---|"]
    for sample in SAMPLES:
        source = _package_root(sample.package) / sample.relative
        with Image.open(source) as im:
            rgb = im.convert("RGB")
        _write_jpeg(rgb, photos / sample.name, sample.taken, 92)
        lines.append(f"| `{sample.name}` | {sample.credit} |")
    if near_duplicate:
        copy = NEAR_DUPLICATE
        write_near_duplicate(photos)
        lines.append(f"| `{copy.name}` | a copy of `{copy.source}` at {copy.scale:g} × its size, JPEG quality "
                     f"{copy.quality} (a near-duplicate pair for the Duplicates view): its source and licence as "
                     f"above |")
    write_clips(photos)
    for name, scenes, _ in CLIPS:
        lines.append(f"| `videos/{name}` | made for this project from {', '.join(f'`{s}`' for s in scenes)} "
                     f"({SCENE_SECONDS} s each, zooming in): their sources and licences as above |")
    write_text(out / "ATTRIBUTION.md", "\n".join(lines) + "\n")
    write_text(out / "captions.txt", CAPTIONS)
    return photos
