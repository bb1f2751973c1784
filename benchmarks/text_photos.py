"""Generated photos with rendered text, for benchmarks/ocr_keyword.py: street signs, receipts and screenshots, each
with known words, at several font sizes and small rotations, over a textured or photographic background. Fonts:
matplotlib's bundled DejaVu (installed with the project, no download)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

STREETS = ["SUNSET", "BOULEVARD", "MAPLE", "HARBOR", "QUARRY", "WILLOW", "FALCON", "ORCHARD", "BEACON", "CANYON",
           "MEADOW", "LANTERN", "GRANITE", "SPRUCE", "MARBLE", "PELICAN", "JUNIPER", "COBALT", "SAFFRON", "THISTLE"]
KINDS = ["AVENUE", "STREET", "ROAD", "LANE", "DRIVE", "PLAZA"]
ITEMS = ["COFFEE", "BAGEL", "ORANGES", "BUTTER", "NOODLES", "PEPPER", "YOGURT", "TOMATO", "CHEDDAR", "LEMONADE",
         "WALNUTS", "BISCUIT", "CELERY", "PAPRIKA", "HONEY"]
SCREEN = ["wifi password", "meeting agenda", "boarding pass", "invoice total", "delivery address",
          "booking reference", "train platform", "parking ticket", "library card", "museum opening"]


def font_path(bold: bool = True) -> str:
    import matplotlib

    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    return str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name)


@dataclass(frozen=True)
class TextPhoto:
    path: str
    kind: str            # sign | receipt | screenshot
    words: tuple[str, ...]
    size: int            # font size in pixels
    angle: float         # degrees


def _background(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    """A noisy colour gradient (a wall, a table): something besides the text to look at."""
    w, h = size
    base = np.array([rng.randint(40, 200) for _ in range(3)], np.float32)
    ramp = np.linspace(0, 1, w, dtype=np.float32)[None, :, None] * rng.uniform(-60, 60)
    noise = np.random.default_rng(rng.randint(0, 1 << 30)).normal(0, 12, (h, w, 3)).astype(np.float32)
    return Image.fromarray(np.clip(base + ramp + noise, 0, 255).astype(np.uint8))


def render(kind: str, words: list[str], size: int, angle: float, rng: random.Random,
           canvas: tuple[int, int] = (640, 480)) -> Image.Image:
    font = ImageFont.truetype(font_path(kind != "screenshot"), size)
    lines = words if kind != "sign" else [" ".join(words)]
    if kind == "receipt":
        lines = ["RECEIPT", *[f"{w}  {rng.randint(1, 30)}.{rng.randint(0, 99):02d}" for w in words], "TOTAL"]
    pad = size // 2
    measure = ImageDraw.Draw(Image.new("L", (1, 1)))
    widths = [measure.textbbox((0, 0), line, font=font)[2] for line in lines]
    panel = Image.new("RGB", (max(widths) + 2 * pad, len(lines) * int(size * 1.3) + 2 * pad),
                      {"sign": (20, 90, 40), "receipt": (245, 245, 240), "screenshot": (255, 255, 255)}[kind])
    ink = (250, 250, 250) if kind == "sign" else (20, 20, 20)
    draw = ImageDraw.Draw(panel)
    for n, line in enumerate(lines):
        draw.text((pad, pad + n * int(size * 1.3)), line, font=font, fill=ink)
    if angle:
        panel = panel.rotate(angle, expand=True, resample=Image.Resampling.BICUBIC, fillcolor=(0, 0, 0))
        mask = Image.new("L", panel.size, 0)
        ImageDraw.Draw(mask).rectangle((0, 0, *panel.size), fill=255)
    if kind == "screenshot":
        photo = panel.resize(canvas) if panel.size[0] > canvas[0] else panel
        out = Image.new("RGB", canvas, (255, 255, 255))
        out.paste(photo, (0, 0))
        return out
    out = _background(rng, canvas)
    scale = min(1.0, 0.9 * canvas[0] / panel.size[0], 0.9 * canvas[1] / panel.size[1])
    if scale < 1:
        panel = panel.resize((int(panel.size[0] * scale), int(panel.size[1] * scale)), Image.Resampling.LANCZOS)
    mask = panel.convert("L").point(lambda v: 255 if v > 0 else 0)
    x = rng.randint(0, canvas[0] - panel.size[0])
    y = rng.randint(0, canvas[1] - panel.size[1])
    out.paste(panel, (x, y), mask)
    return out.filter(ImageFilter.GaussianBlur(0.5))


def generate(out: str | Path, n: int, seed: int = 0, sizes=(18, 28, 44), angles=(0.0, -3.0, 4.0)) -> list[TextPhoto]:
    """``n`` text photos into ``out`` (JPEG), their words known: signs (two street words), receipts (three items)
    and screenshots (two two-word lines), cycling through the font sizes and rotations. File names say nothing of
    the words (``text_0007.jpg``)."""
    rng = random.Random(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    photos = []
    for i in range(n):
        kind = ("sign", "receipt", "screenshot")[i % 3]
        if kind == "sign":
            words = [STREETS[(i // 3) % len(STREETS)], rng.choice(KINDS)]
        elif kind == "receipt":
            words = rng.sample(ITEMS, 3)
        else:
            words = rng.sample(SCREEN, 2)
        size, angle = sizes[(i // 3) % len(sizes)], angles[(i // 9) % len(angles)]
        path = out / f"text_{i:04d}.jpg"
        render(kind, words, size, angle, rng).save(path, quality=90)
        flat = tuple(w.lower() for phrase in words for w in phrase.split())
        photos.append(TextPhoto(str(path), kind, flat, size, angle))
    return photos
