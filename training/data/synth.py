"""A deterministic synthetic captioned-image data set ("synthetic"), written in Karpathy JSON form.

Scenes
    Each image shows 1–3 coloured shapes on a neutral background (plain, gradient, noise or stripes, all
    in grey/beige tones, so no object ever has the background's colour). Objects in one scene have
    distinct shapes *and* distinct colours, so "the red circle" always names one object. An object has a
    shape, a colour, a size (``small``/``big``, radii ~0.07 and ~0.12 of the image side) and a centre
    ``(x, y)`` in [0, 1] image coordinates (``y`` grows downwards, so "above" means a smaller ``y``), plus a
    little jitter in radius and rotation. Scene mix: 20 % one object (described by where it is: left,
    right, top, bottom, middle), 65 % two objects in one spatial relation, 15 % three objects — an anchor
    with one object on each of two different sides. Related objects are at least 0.31 apart along the
    relation's axis and at most ~0.08 apart across it, so "left of", "above", ... are never ambiguous.

Captions
    Five distinct captions per image, all true paraphrases: one of a few sentence templates per scene type
    ("{a} {rel} {b}", "{b} with {a} {side}", "{a} is next to {b} on its right", ...), an optional frame
    ("there is", "an image of", "a picture of"), either direction of the relation (A left of B ≡ B right of
    A) and synonyms (big/large, small/little/tiny, circle/disc, diamond/rhombus, under/below/beneath,
    "left of"/"to the left of"/"on the left of", ...). Sizes are mentioned for all objects of a caption or
    for none. Every choice is made by ``_Chooser``, which spends exactly one random draw per choice, and a
    caption is a pure function of (scene, caption seed).

Minimal pairs
    About 40 % of the two-object images come in pairs kept in the same split: B is A with the two objects'
    colours swapped (``colour_swap``) or with their positions swapped (``position_swap``). The objects keep
    their order in the scene list, and the partner's caption ``k`` is rendered with the same caption seed
    as caption ``k`` of A. The per-object words (size and shape synonyms) are drawn first, by object index,
    from option lists that depend only on what both members share (shape, size) — so both members draw the
    same words for each object and the same template, frame, direction and relation phrase. The captions
    then differ only in which object fills which slot (position swap) or in which colour word goes with
    which noun (colour swap): caption ``k`` of A and caption ``k`` of B are the same multiset of tokens,
    so a bag-of-words text model cannot tell the pair apart; word order (a sequence model) can.

Everything is drawn from ``numpy.random.default_rng(seed)`` (scenes, splits, caption seeds) and
``random.Random(caption_seed)`` (caption wording), so the same arguments give a byte-identical
``dataset.json`` and identical JPEG files.
"""
from __future__ import annotations

import io
import json
import math
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple, Sequence, cast

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from .fileio import write_text
from .vocab import tokenize

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 30),
    "purple": (140, 50, 180),
    "orange": (245, 130, 20),
}
_COLOUR_NAMES = tuple(COLOURS)
SHAPES = ("circle", "square", "triangle", "star", "diamond", "cross")
SIZES = ("small", "big")
RELATIONS = ("left", "right", "above", "below")   # "A <relation> B"
_RELATION_NAMES = {"left": "left of", "right": "right of", "above": "above", "below": "below"}   # in JSON

_LIGHT_TONES = ((245, 245, 245), (222, 222, 222), (232, 226, 212), (205, 210, 215))
_DARK_TONES = ((25, 25, 25), (55, 55, 60), (78, 72, 66), (40, 45, 55))
_BACKGROUND_KINDS = ("plain", "gradient", "noise", "stripes")

_RADIUS = {"small": 0.07, "big": 0.12}   # fraction of the image side; the largest shape reaches 1.15 radii
_MARGIN = 0.15                           # object centres stay in [_MARGIN, 1 - _MARGIN]
_MIN_SEPARATION, _MAX_SEPARATION = 0.31, 0.6
_ACROSS_JITTER = 0.04                    # each object's offset across a relation's axis
_SUPERSAMPLE = 2
_JPEG_QUALITY = 90
_CAPTIONS_PER_IMAGE = 5
_ONE, _TWO, _THREE = 0.20, 0.65, 0.15     # scene mix
PAIR_FRACTION = 0.4                       # default share of the two-object images that come as minimal pairs

_DIRECTION = {"left": (-1, 0), "right": (1, 0), "above": (0, -1), "below": (0, 1)}
_INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}
_LOCATIONS = {   # one-object scenes: ranges of x and y for each described location
    "left": ((0.15, 0.30), (0.35, 0.65)),
    "right": ((0.70, 0.85), (0.35, 0.65)),
    "top": ((0.35, 0.65), (0.15, 0.30)),
    "bottom": ((0.35, 0.65), (0.70, 0.85)),
    "middle": ((0.42, 0.58), (0.42, 0.58)),
}

# --- wording ------------------------------------------------------------------------------------------
_SIZE_WORDS = {"small": ("small", "little", "tiny"), "big": ("big", "large")}
_SHAPE_WORDS = {"circle": ("circle", "disc"), "square": ("square",), "triangle": ("triangle",),
                "star": ("star",), "diamond": ("diamond", "rhombus"), "cross": ("cross",)}
_RELATION_PHRASES = {"left": ("left of", "to the left of", "on the left of"),
                     "right": ("right of", "to the right of", "on the right of"),
                     "above": ("above", "over"),
                     "below": ("below", "under", "beneath")}
_SIDE_PHRASES = {"left": ("to its left", "on its left"), "right": ("to its right", "on its right"),
                 "above": ("above it", "over it"), "below": ("below it", "under it")}
_LOCATION_PHRASES = {"left": ("on the left", "on the left side", "at the left"),
                     "right": ("on the right", "on the right side", "at the right"),
                     "top": ("at the top", "near the top", "in the upper part"),
                     "bottom": ("at the bottom", "near the bottom", "in the lower part"),
                     "middle": ("in the middle", "in the centre", "at the centre")}
_FRAMES = ("", "there is ", "an image of ", "a picture of ")

# Fields: {a}/{b}/{c} indefinite noun phrases, {a_bare} without article, {b_def} "the <colour> <shape>",
# {rel*} relation phrases, {inv*} phrases of the inverse relation, {side*} "to its left"-style phrases.
_ONE_OBJECT_TEMPLATES = ("{frame}{a} {loc}", "{a} is {loc}", "{frame}a single {a_bare} {loc}",
                         "{loc} there is {a}")
_TWO_OBJECT_TEMPLATES = ("{frame}{a} {rel1} {b}", "{a} is {rel1} {b}", "{frame}{b} with {a} {side1}")
_HORIZONTAL_ONLY_TEMPLATES = ("{a} is next to {b} on its {opposite1}",)
_THREE_OBJECT_TEMPLATES = ("{frame}{a} {rel1} {b} and {c} {rel2} {b_def}",
                           "{frame}{b} with {a} {side1} and {c} {side2}",
                           "{b} is {inv1} {a} and {inv2} {c}",
                           "{frame}{a} {rel1} {b} which is {inv2} {c}")


# --- scene description ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    x: float
    y: float
    radius: float      # fraction of the image side
    rotation: float    # degrees


@dataclass(frozen=True)
class Relation:
    subject: int       # index into Scene.objects
    relation: str      # one of RELATIONS: subject is <relation> (of) object
    object: int


@dataclass(frozen=True)
class Background:
    kind: str                                  # one of _BACKGROUND_KINDS
    tones: tuple[tuple[int, int, int], ...]    # one tone (plain, noise) or two (gradient, stripes)
    angle: float                               # gradient / stripe direction, degrees
    period: float                              # stripe period, fraction of the image side
    noise_seed: int


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    relations: tuple[Relation, ...]
    location: str | None                       # one-object scenes only: a key of _LOCATIONS
    background: Background


def _sample_background(rng: np.random.Generator) -> Background:
    kind = _BACKGROUND_KINDS[rng.integers(len(_BACKGROUND_KINDS))]
    family = _LIGHT_TONES if rng.random() < 0.5 else _DARK_TONES
    if kind == "gradient":   # may run from a light tone to a dark one
        pool = _LIGHT_TONES + _DARK_TONES
        tones = tuple(pool[i] for i in rng.choice(len(pool), 2, replace=False))
    elif kind == "stripes":  # two tones of one family, so the stripes stay subtle
        tones = tuple(family[i] for i in rng.choice(len(family), 2, replace=False))
    else:
        tones = (family[rng.integers(len(family))],)
    return Background(kind=kind, tones=tones, angle=float(rng.choice([0.0, 45.0, 90.0, 135.0])),
                      period=float(rng.uniform(0.05, 0.12)), noise_seed=int(rng.integers(2**31)))


def _sample_objects(rng: np.random.Generator,
                    positions: Sequence[tuple[float, float]]) -> tuple[SceneObject, ...]:
    """Objects with distinct shapes and distinct colours at the given centres."""
    n = len(positions)
    shapes = rng.choice(len(SHAPES), n, replace=False)
    colours = rng.choice(len(COLOURS), n, replace=False)
    objects = []
    for (x, y), shape, colour in zip(positions, shapes, colours):
        size = SIZES[rng.integers(len(SIZES))]
        objects.append(SceneObject(shape=SHAPES[shape], colour=_COLOUR_NAMES[colour], size=size,
                                   x=round(float(x), 4), y=round(float(y), 4),
                                   radius=_RADIUS[size] * float(rng.uniform(0.92, 1.08)),
                                   rotation=float(rng.uniform(-15.0, 15.0))))
    return tuple(objects)


def _offset(centre: tuple[float, float], relation: str, distance: float,
            across: float) -> tuple[float, float]:
    """The point ``distance`` from ``centre`` in ``relation``'s direction, shifted ``across`` sideways."""
    dx, dy = _DIRECTION[relation]
    return centre[0] + dx * distance + dy * across, centre[1] + dy * distance + dx * across


def _one_object_scene(rng: np.random.Generator) -> Scene:
    location = list(_LOCATIONS)[rng.integers(len(_LOCATIONS))]
    (x_lo, x_hi), (y_lo, y_hi) = _LOCATIONS[location]
    position = (rng.uniform(x_lo, x_hi), rng.uniform(y_lo, y_hi))
    return Scene(_sample_objects(rng, [position]), (), location, _sample_background(rng))


def _two_object_scene(rng: np.random.Generator) -> Scene:
    """Object 0 is ``relation`` of object 1."""
    relation = RELATIONS[rng.integers(len(RELATIONS))]
    separation = rng.uniform(_MIN_SEPARATION, _MAX_SEPARATION)
    along = rng.uniform(_MARGIN + separation / 2, 1 - _MARGIN - separation / 2)
    across = rng.uniform(_MARGIN + _ACROSS_JITTER, 1 - _MARGIN - _ACROSS_JITTER)
    midpoint = (along, across) if _DIRECTION[relation][0] else (across, along)
    subject, obj = (_offset(midpoint, relation, sign * separation / 2,
                            rng.uniform(-_ACROSS_JITTER, _ACROSS_JITTER)) for sign in (1, -1))
    return Scene(_sample_objects(rng, [subject, obj]), (Relation(0, relation, 1),), None,
                 _sample_background(rng))


def _three_object_scene(rng: np.random.Generator) -> Scene:
    """Object 0 is the anchor near the centre; objects 1 and 2 sit on two different sides of it."""
    first, second = (RELATIONS[i] for i in rng.choice(len(RELATIONS), 2, replace=False))
    anchor = tuple(0.5 + rng.uniform(-0.02, 0.02, size=2))
    positions = [anchor] + [_offset(anchor, relation, rng.uniform(_MIN_SEPARATION, 0.33),
                                    rng.uniform(-0.03, 0.03)) for relation in (first, second)]
    return Scene(_sample_objects(rng, positions), (Relation(1, first, 0), Relation(2, second, 0)), None,
                 _sample_background(rng))


def _colour_swap(scene: Scene) -> Scene:
    a, b = scene.objects
    return replace(scene, objects=(replace(a, colour=b.colour), replace(b, colour=a.colour)))


def _position_swap(scene: Scene) -> Scene:
    a, b = scene.objects
    (relation,) = scene.relations
    return replace(scene, objects=(replace(a, x=b.x, y=b.y), replace(b, x=a.x, y=a.y)),
                   relations=(Relation(relation.object, relation.relation, relation.subject),))


_SCENE_SAMPLERS = {1: _one_object_scene, 2: _two_object_scene, 3: _three_object_scene}
_PAIR_MAKERS = {"colour_swap": _colour_swap, "position_swap": _position_swap}


# --- captions -----------------------------------------------------------------------------------------
class _Chooser:
    """Random choices that each consume exactly one draw, whatever the number of options."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def pick(self, options: Sequence[str]) -> str:
        return options[int(self._rng.random() * len(options))]

    def chance(self, p: float) -> bool:
        return self._rng.random() < p


class _Phrases(NamedTuple):
    indefinite: str    # "a big red circle"
    bare: str          # "big red circle"
    definite: str      # "the red circle"


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _object_phrases(scene: Scene, choose: _Chooser) -> list[_Phrases]:
    """Noun phrases per object; the words are drawn by object index (see the module docstring)."""
    words = [(choose.pick(_SIZE_WORDS[o.size]), choose.pick(_SHAPE_WORDS[o.shape])) for o in scene.objects]
    mention_size = choose.chance(0.5)
    phrases = []
    for o, (size_word, shape_word) in zip(scene.objects, words):
        bare = f"{size_word} {o.colour} {shape_word}" if mention_size else f"{o.colour} {shape_word}"
        phrases.append(_Phrases(_with_article(bare), bare, f"the {o.colour} {shape_word}"))
    return phrases


def _relation_fields(choose: _Chooser, relation: str, number: int) -> dict[str, str]:
    return {f"rel{number}": choose.pick(_RELATION_PHRASES[relation]),
            f"inv{number}": choose.pick(_RELATION_PHRASES[_INVERSE[relation]]),
            f"side{number}": choose.pick(_SIDE_PHRASES[relation]),
            f"opposite{number}": _INVERSE[relation]}


def _caption(scene: Scene, seed: int) -> str:
    """One caption of ``scene``: a pure function of (scene, seed)."""
    choose = _Chooser(seed)
    phrases = _object_phrases(scene, choose)
    fields = {"frame": choose.pick(_FRAMES)}
    if len(scene.objects) == 1:
        templates: tuple[str, ...] = _ONE_OBJECT_TEMPLATES
        fields.update(a=phrases[0].indefinite, a_bare=phrases[0].bare,
                      loc=choose.pick(_LOCATION_PHRASES[cast(str, scene.location)]))   # set for one object
    elif len(scene.objects) == 2:
        (r,) = scene.relations
        subject, relation, obj = r.subject, r.relation, r.object
        if choose.chance(0.5):   # say it the other way round: A left of B ≡ B right of A
            subject, relation, obj = obj, _INVERSE[relation], subject
        horizontal = _DIRECTION[relation][0] != 0
        templates = _TWO_OBJECT_TEMPLATES + (_HORIZONTAL_ONLY_TEMPLATES if horizontal else ())
        fields.update(a=phrases[subject].indefinite, b=phrases[obj].indefinite,
                      **_relation_fields(choose, relation, 1))
    else:
        first, second = scene.relations
        if choose.chance(0.5):   # mention the two sides of the anchor in the other order
            first, second = second, first
        templates = _THREE_OBJECT_TEMPLATES
        fields.update(a=phrases[first.subject].indefinite, b=phrases[first.object].indefinite,
                      b_def=phrases[first.object].definite, c=phrases[second.subject].indefinite,
                      **_relation_fields(choose, first.relation, 1),
                      **_relation_fields(choose, second.relation, 2))
    return choose.pick(templates).format(**fields)


def _sample_captions(scenes: Sequence[Scene], rng: np.random.Generator) -> list[list[str]]:
    """Five distinct captions for each scene; caption k of every scene uses the same caption seed."""
    captions: list[list[str]] = [[] for _ in scenes]
    for _ in range(1000):
        seed = int(rng.integers(2**31))
        candidates = [_caption(scene, seed) for scene in scenes]
        if all(c not in existing for c, existing in zip(candidates, captions)):
            for c, existing in zip(candidates, captions):
                existing.append(c)
            if len(captions[0]) == _CAPTIONS_PER_IMAGE:
                return captions
    raise RuntimeError("caption pool too small")   # cannot happen: every pool has hundreds of captions


# --- rendering ----------------------------------------------------------------------------------------
def _unit_polygon(shape: str) -> list[tuple[float, float]]:
    """Vertices around the origin for a shape of radius 1; every polygon contains its centre."""
    if shape == "square":
        return [(-0.85, -0.85), (0.85, -0.85), (0.85, 0.85), (-0.85, 0.85)]
    if shape == "triangle":
        return [(1.15 * math.cos(math.radians(a)), 1.15 * math.sin(math.radians(a))) for a in (-90, 30, 150)]
    if shape == "star":
        return [((1.15 if i % 2 == 0 else 0.5) * math.cos(math.radians(-90 + 36 * i)),
                 (1.15 if i % 2 == 0 else 0.5) * math.sin(math.radians(-90 + 36 * i))) for i in range(10)]
    if shape == "diamond":
        return [(0.0, -1.15), (0.8, 0.0), (0.0, 1.15), (-0.8, 0.0)]
    if shape == "cross":
        w = 0.35
        return [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w), (-1, w),
                (-1, -w), (-w, -w)]
    raise ValueError(f"no polygon for {shape!r}")


def _draw_object(draw: ImageDraw.ImageDraw, o: SceneObject, side: int) -> None:
    cx, cy, r = o.x * side, o.y * side, o.radius * side
    colour = COLOURS[o.colour]
    if o.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
        return
    cos, sin = math.cos(math.radians(o.rotation)), math.sin(math.radians(o.rotation))
    vertices = [(cx + r * (u * cos - v * sin), cy + r * (u * sin + v * cos))
                for u, v in _unit_polygon(o.shape)]
    draw.polygon(vertices, fill=colour)


def _background_array(background: Background, size: int) -> np.ndarray:
    """``size`` x ``size`` x 3 uint8 pixels of a background."""
    tones = np.array(background.tones, dtype=np.float32)
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size
    angle = math.radians(background.angle)
    t = math.cos(angle) * coords[None, :] + math.sin(angle) * coords[:, None]   # position along the angle
    if background.kind == "gradient":
        t = (t - t.min()) / (t.max() - t.min())
        pixels = tones[0] + (tones[1] - tones[0]) * t[..., None]
    elif background.kind == "stripes":
        pixels = tones[(np.floor(t / background.period).astype(np.int64) % 2)]
    else:
        pixels = np.broadcast_to(tones[0], (size, size, 3))
        if background.kind == "noise":   # grey noise: the same offset on all channels
            noise = np.random.default_rng(background.noise_seed).normal(0.0, 10.0, (size, size, 1))
            pixels = pixels + noise
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def render(scene: Scene, image_size: int) -> Image.Image:
    """The scene as an RGB image, drawn at twice the size and reduced (anti-aliased edges)."""
    side = image_size * _SUPERSAMPLE
    background = Image.fromarray(_background_array(scene.background, image_size))
    image = background.resize((side, side), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(image)
    for o in scene.objects:
        _draw_object(draw, o, side)
    return image.reduce(_SUPERSAMPLE)


def _write_jpeg_atomically(image: Image.Image, path: Path) -> None:
    """Encode, write to a temporary name beside ``path``, then rename it into place."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=_JPEG_QUALITY)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --- data set layout: scene mix, pairs, splits ----------------------------------------------------------
@dataclass
class _Unit:
    """One image, or a minimal pair (two images that always share a split)."""

    scenes: list[Scene]
    captions: list[list[str]]          # five per scene
    pair_kind: str | None
    split: str = "train"


def _split_sizes(n_images: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1):
        raise ValueError("val_fraction and test_fraction must be in [0, 1)")
    n_val, n_test = (max(1, round(n_images * f)) for f in (val_fraction, test_fraction))
    if n_images - n_val - n_test < 1:
        raise ValueError(f"{n_images} images leave none for train (val {n_val}, test {n_test})")
    return n_val, n_test


def _unit_plan(n_images: int, n_val: int, n_test: int, rng: np.random.Generator,
               pair_fraction: float = PAIR_FRACTION) -> list[tuple[int, str | None]]:
    """(objects per image, pair kind or None) for each unit, shuffled.

    Enough single images are kept (n_val + n_test + 1) that val and test can be filled exactly.
    """
    n_one, n_three = round(n_images * _ONE), round(n_images * _THREE)
    n_two = n_images - n_one - n_three
    n_pairs = min(round(n_two * pair_fraction / 2), (n_images - n_val - n_test - 1) // 2)
    kinds = [list(_PAIR_MAKERS)[i % 2] for i in range(n_pairs)]
    plan: list[tuple[int, str | None]] = []
    plan += [(1, None)] * n_one + [(3, None)] * n_three + [(2, None)] * (n_two - 2 * n_pairs)
    plan += [(2, kind) for kind in kinds]
    return [plan[i] for i in rng.permutation(len(plan))]


def _make_unit(n_objects: int, pair_kind: str | None, rng: np.random.Generator) -> _Unit:
    scene = _SCENE_SAMPLERS[n_objects](rng)
    scenes = [scene, _PAIR_MAKERS[pair_kind](scene)] if pair_kind else [scene]
    return _Unit(scenes, _sample_captions(scenes, rng), pair_kind)


def _assign_splits(units: list[_Unit], n_val: int, n_test: int, rng: np.random.Generator) -> None:
    """Fill test, then val, to their sizes with whole units in random order; the rest is train."""
    capacity = {"test": n_test, "val": n_val}
    for i in rng.permutation(len(units)):
        unit = units[i]
        unit.split = next((s for s, free in capacity.items() if free >= len(unit.scenes)), "train")
        if unit.split in capacity:
            capacity[unit.split] -= len(unit.scenes)


# --- output ---------------------------------------------------------------------------------------------
def _scene_json(scene: Scene) -> list[dict[str, Any]]:
    return [{"shape": o.shape, "colour": o.colour, "size": o.size, "x": o.x, "y": o.y} for o in scene.objects]


def _relations_json(scene: Scene) -> list[dict[str, Any]]:
    return [{"subject": r.subject, "relation": _RELATION_NAMES[r.relation], "object": r.object}
            for r in scene.relations]


def _record(imgid: int, scene: Scene, captions: list[str], split: str,
            partner: int | None, pair_kind: str | None) -> dict[str, Any]:
    sentids = [imgid * _CAPTIONS_PER_IMAGE + k for k in range(len(captions))]
    return {
        "filename": f"{imgid:06d}.jpg",
        "filepath": "images",
        "imgid": imgid,
        "split": split,
        "sentids": sentids,
        "sentences": [{"raw": raw, "tokens": tokenize(raw), "imgid": imgid, "sentid": sentid}
                      for raw, sentid in zip(captions, sentids)],
        "scene": _scene_json(scene),
        "relations": _relations_json(scene),
        "minimal_pair": partner,
        "minimal_pair_kind": pair_kind,
    }


def generate(out_dir: str | Path, n_images: int = 3000, seed: int = 0, image_size: int = 128,
             val_fraction: float = 0.1, test_fraction: float = 0.1, progress: bool = True,
             pair_fraction: float = PAIR_FRACTION) -> Path:
    """Writes out_dir/images/*.jpg and out_dir/dataset.json; returns the path of dataset.json.

    ``pair_fraction``: the share of the two-object images (65 % of all) generated as minimal pairs.

    Each record is a Karpathy record (filename, filepath, imgid, split, sentids, sentences) plus
    ``scene`` (objects: shape, colour, size, x, y), ``relations`` ({"subject": i, "relation": "left of",
    "object": j} — object i is left of object j), ``minimal_pair`` (the partner's imgid or null) and
    ``minimal_pair_kind`` ("colour_swap" | "position_swap" | null).
    """
    if n_images < 3:
        raise ValueError("n_images must be at least 3 (one image per split)")
    if image_size < 16:
        raise ValueError("image_size must be at least 16")
    if not 0 <= pair_fraction <= 1:
        raise ValueError(f"pair_fraction must be in [0, 1], got {pair_fraction}")
    n_val, n_test = _split_sizes(n_images, val_fraction, test_fraction)
    rng = np.random.default_rng(seed)
    plan = _unit_plan(n_images, n_val, n_test, rng, pair_fraction)
    units = [_make_unit(n_objects, pair_kind, rng) for n_objects, pair_kind in plan]
    _assign_splits(units, n_val, n_test, rng)

    out_dir = Path(out_dir)
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    with tqdm(total=n_images, desc="synthetic images", unit="img", disable=not progress) as bar:
        for unit in units:
            first = len(records)
            for k, (scene, captions) in enumerate(zip(unit.scenes, unit.captions)):
                partner = first + 1 - k if unit.pair_kind else None
                record = _record(len(records), scene, captions, unit.split, partner, unit.pair_kind)
                _write_jpeg_atomically(render(scene, image_size), image_dir / record["filename"])
                records.append(record)
                bar.update()

    dataset_path = out_dir / "dataset.json"
    write_text(dataset_path, json.dumps({"dataset": "synthetic", "images": records}))
    return dataset_path


def random_scenes(n: int, seed: int = 0) -> list[tuple[Scene, list[str]]]:
    """``n`` scenes drawn as :func:`generate` draws them (the same mix of one, two and three objects; no minimal
    pairs), each with its five captions: what other renderings of the synthetic world start from (the generated
    video clips of benchmarks/video_retrieval.py)."""
    rng = np.random.default_rng(seed)
    out = []
    for n_objects, _ in _unit_plan(n, 0, 0, rng, pair_fraction=0.0):
        unit = _make_unit(n_objects, None, rng)
        out.append((unit.scenes[0], unit.captions[0]))
    return out


def minimal_pairs(dataset: dict[str, Any]) -> list[tuple[int, int]]:
    """Each minimal pair of a loaded dataset.json once, as (imgid_a, imgid_b) with imgid_a < imgid_b."""
    return sorted((record["imgid"], record["minimal_pair"]) for record in dataset["images"]
                  if record.get("minimal_pair") is not None and record["imgid"] < record["minimal_pair"])
