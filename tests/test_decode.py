"""Decoding for inference: a JPEG decoded at the smallest DCT scale the preprocessing allows, EXIF orientation
kept, one decode feeding every member's resize, truncated files still rejected; DataLoader settings by cores and
device."""
import functools
import io
import math

import numpy as np
import pytest
import torch
from PIL import Image, JpegImagePlugin

from conftest import tiny_config
import training.data.features as features
import training.data.preprocess as preprocess
import training.inference.embedding as embed
from index.embed import read_photo
from service.images import ImageError, open_checked, thumbnail, upload_to_pixels
from training.data.features import loader_options
from training.data.preprocess import (Preprocess, StackedPreprocess, decode_image, draft, load_image,
                                      preprocess_from_dict)

# the shipped model's members: EfficientNet-Lite2, -Lite0, -Lite1 at their native sizes
SHIPPED = StackedPreprocess((Preprocess(260, 260, (0.5,) * 3, (0.5,) * 3), Preprocess(224, 224, (0.5,) * 3, (0.5,) * 3),
                             Preprocess(240, 240, (0.5,) * 3, (0.5,) * 3)))


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like RGB image: smooth random shapes plus sensor-like noise."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (max(2, height // 40), max(2, width // 40), 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    noisy = smooth + rng.integers(-7, 8, smooth.shape, dtype=np.int16)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, orientation: int | None = None, quality: int = 90) -> bytes:
    out = io.BytesIO()
    kwargs = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    image.save(out, "JPEG", quality=quality, **kwargs)
    return out.getvalue()


@functools.cache
def flat_jpeg(width: int, height: int) -> bytes:
    return jpeg(Image.new("RGB", (width, height), (120, 80, 40)))


@pytest.mark.parametrize("size", [(4000, 3000), (3000, 4000), (1152, 864), (1040, 2000), (1039, 2000), (519, 700),
                                  (300, 300), (200, 150)])
@pytest.mark.parametrize("side", [260, 224, 100])
def test_draft_decodes_at_the_smallest_scale_that_keeps_twice_the_needed_side(size, side):
    # the expectation, stated independently: the largest 1/s (s in 1, 2, 4, 8) whose shorter side is ≥ 2 × side
    expected = max(s for s in (1, 2, 4, 8) if min(size) / s >= 2 * side or s == 1)
    with Image.open(io.BytesIO(flat_jpeg(*size))) as im:
        scale = draft(im, side)
        im.load()
        got = im.size
    assert scale == expected
    assert got == (math.ceil(size[0] / scale), math.ceil(size[1] / scale))
    assert min(got) >= min(2 * side, min(size))                         # never below twice the side needed
    if scale < 8:
        assert min(size) / (2 * scale) < 2 * side                       # the next scale would be below it


def test_only_jpeg_is_drafted_and_the_reduction_keeps_twice_the_side():
    png = io.BytesIO()
    photo(1600, 1200).save(png, "PNG")
    with Image.open(io.BytesIO(png.getvalue())) as im:
        assert draft(im, 100) == 1
    # no DCT scale for PNG: an integer reduction, keeping the shorter side ≥ 2 × 100 (1200 // 200 = 6; sides rounded up)
    assert decode_image(png.getvalue(), ".png", min_side=100).image.size == (267, 200)
    assert decode_image(png.getvalue(), ".png", min_side=700).image.size == (1600, 1200)       # < 2 × 700: as is
    # beyond 1/8 a JPEG is reduced too: 8000 × 6000 → 1000 × 750 by DCT, then ÷ 2 (750 // (2 × 150) = 2)
    assert decode_image(flat_jpeg(8000, 6000), ".jpg", min_side=150).image.size == (500, 375)


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_exif_orientation_is_kept_under_draft(orientation):
    source = photo(1600, 1200, seed=orientation)
    data = jpeg(source, orientation)
    full = load_image(data, ".jpg")[0]
    decoded = decode_image(data, ".jpg", min_side=200)
    # the shorter side decides the scale, whichever way the photo is turned: 1200 // 2 = 600 ≥ 2 × 200 > 1200 // 4
    assert sorted(decoded.image.size) == [600, 800]
    assert decoded.image.size == (full.width // 2, full.height // 2)
    assert decoded.size == full.size == ((1200, 1600) if orientation in (6, 8) else (1600, 1200))
    assert decoded.exif is not None and decoded.exif.get(0x0112) == orientation      # the file's EXIF, as before
    # the same picture, the same way up: the draft equals the full decode shrunk alike (mean difference, 0-255)
    shrunk = np.asarray(full.resize(decoded.image.size, Image.Resampling.BOX), dtype=np.float32)
    assert np.abs(np.asarray(decoded.image, dtype=np.float32) - shrunk).mean() < 3.0
    # and that way up is the one the EXIF tag says (turned the wrong way, the random picture differs by ~40)
    turn = {1: None, 3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_270, 8: Image.Transpose.ROTATE_90}
    upright = source if turn[orientation] is None else source.transpose(turn[orientation])
    seen = np.asarray(upright.resize(decoded.image.size, Image.Resampling.BOX), dtype=np.float32)
    assert np.abs(np.asarray(decoded.image, dtype=np.float32) - seen).mean() < 3.0


def _count(monkeypatch, cls, name, calls):
    original = getattr(cls, name)

    def counted(self, *args, **kwargs):
        calls.append((name, self.size))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, counted)


@pytest.fixture
def shrink(monkeypatch):
    """Images to embed shrunk while decoding (as shipped; pinned so these tests do not depend on the policy)."""
    monkeypatch.setattr(preprocess, "SHRINK_TO_EMBED", True)


@pytest.mark.parametrize("shrunk", [True, False])
def test_the_shrink_policy_decides_how_uploads_and_index_workers_decode(tmp_path, monkeypatch, shrunk):
    """As shipped (on) a large JPEG to embed is decoded shrunk — the same pixels as ``decode_image`` with the
    model's ``min_side`` —, and with the policy off at full size, bit for bit as before."""
    monkeypatch.setattr(preprocess, "SHRINK_TO_EMBED", shrunk)
    data = jpeg(photo(2800, 2100))
    want = (SHIPPED.pixels(decode_image(data, ".jpg", SHIPPED.min_side).image) if shrunk
            else old_pixels(data, SHIPPED))
    assert torch.equal(upload_to_pixels(data, 50_000_000, SHIPPED), want)
    path = tmp_path / "big.jpg"
    path.write_bytes(data)
    index, (pixels, info), error = embed._Decoded([path], SHIPPED, read_photo)[0]
    assert error is None and torch.equal(pixels, want)
    assert torch.equal(pixels, old_pixels(data, SHIPPED)) is not shrunk


def test_shrinking_to_embed_is_on_as_shipped():
    assert preprocess.SHRINK_TO_EMBED and preprocess.embed_side(SHIPPED) == SHIPPED.min_side


def test_a_stacked_preprocessing_decodes_once_and_every_member_resizes_the_shrunk_image(tmp_path, monkeypatch,
                                                                                          shrink):
    path = tmp_path / "big.jpg"
    path.write_bytes(flat_jpeg(4000, 3000))
    opened, calls = [], []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    _count(monkeypatch, JpegImagePlugin.JpegImageFile, "draft", calls)
    _count(monkeypatch, Image.Image, "resize", calls)
    _count(monkeypatch, Image.Image, "convert", calls)
    item = embed._Decoded([path], SHIPPED, read_photo)[0]
    index, (pixels, info), error = item
    assert error is None and pixels.shape == (1, 9, 260, 260)
    assert len(opened) == 1
    assert [c for c in calls if c[0] == "draft"] == [("draft", (4000, 3000))]
    # three resizes, one per member, one to the perceptual hash's 32 × 32 grey picture (index/phash.py) and one to
    # the OCR gate's 256-pixel grey thumbnail (index/ocr.py), each of the one image decoded at 1/4 (1000 × 750),
    # never of the full one
    assert [c for c in calls if c[0] == "resize"] == [("resize", (1000, 750))] * 5
    assert not [c for c in calls if c[0] == "convert" and c[1] == (4000, 3000)]
    assert (info.width, info.height) == (4000, 3000)                   # the metadata keeps the file's size


def test_stacked_pixels_of_one_image_equal_each_members_own():
    """Converting once and resizing per member is bit-identical to each member preprocessing the image."""
    for image in (photo(500, 375), photo(300, 410).convert("L"), photo(224, 224).convert("P")):
        stacked = SHIPPED.pixels(image)
        for m, part in zip(SHIPPED.members, SHIPPED.split(stacked)):
            assert torch.equal(part, m.pixels(image))


def old_pixels(data: bytes, pre: StackedPreprocess) -> torch.Tensor:
    """The preprocessing before decoding shrank images: a full decode, each member from the full image."""
    image = load_image(data, ".jpg")[0]
    out = torch.zeros(pre.crops, pre.channels, pre.image_size, pre.image_size, dtype=torch.uint8)
    for i, m in enumerate(pre.members):
        out[:, 3 * i:3 * i + 3, :m.image_size, :m.image_size] = m.pixels(image)
    return out


@pytest.mark.parametrize("size", [(2800, 2100), (1600, 1200), (2000, 2600)])        # DCT scales 1/4, 1/2, 1/2
def test_shrunk_decoding_gives_pixels_close_to_the_full_decode(size, shrink):
    """Tolerance, in 0-255 levels over every pixel of the three members' inputs: mean |difference| ≤ 1.5 and the
    99th percentile ≤ 8 (measured: mean 0.1-0.3, 99th percentile 1). Decoding down to the side itself (1/8 for
    2100 rows, ending in half a DCT block) gave a mean difference of ~5 on this texture and cost 1.04 dev R-sum
    (benchmarks/decode_ranking.py); hence twice the side."""
    data = jpeg(photo(*size, seed=size[0]))
    new = upload_to_pixels(data, 50_000_000, SHIPPED)
    assert torch.equal(new, SHIPPED.pixels(decode_image(data, ".jpg", SHIPPED.min_side).image))
    diff = (new.float() - old_pixels(data, SHIPPED).float()).abs()
    assert diff.mean() <= 1.5 and diff.flatten().quantile(0.99) <= 8
    small = jpeg(photo(500, 375))              # shorter side < 2 × 260: decoded as before, bit for bit
    assert torch.equal(upload_to_pixels(small, 50_000_000, SHIPPED), old_pixels(small, SHIPPED))


def test_truncated_and_corrupt_files_are_still_rejected(tmp_path):
    data = jpeg(photo(2000, 1500))
    truncated = data[:len(data) // 2]
    corrupt = data[:600] + bytes(range(256)) * 40
    for bad in (truncated, corrupt):
        with pytest.raises(OSError):
            decode_image(bad, ".jpg", min_side=260)
        with pytest.raises(ImageError) as err:
            upload_to_pixels(bad, 50_000_000, SHIPPED)
        assert err.value.status == 400
    path = tmp_path / "cut.jpg"
    path.write_bytes(truncated)
    index, pixels, error = embed._Decoded([path], SHIPPED, read_photo)[0]
    assert pixels is None and "truncated" in error


def test_thumbnails_are_decoded_down_to_their_size(tmp_path):
    path = tmp_path / "turned.jpg"
    path.write_bytes(jpeg(Image.new("RGB", (4000, 3000), (9, 99, 199)), orientation=6))
    with Image.open(path) as im:
        assert draft(im, 256) == 4
    data, media = thumbnail(path, 256, 50_000_000)
    thumb = Image.open(io.BytesIO(data))
    assert media == "image/jpeg" and thumb.size == (192, 256)          # upright: the portrait way
    assert open_checked(path, 50_000_000, 256).size == (750, 1000)    # decoded at 1/4, turned


def test_the_shipped_preprocessing_reads_back_from_its_dict():
    assert preprocess_from_dict(SHIPPED.to_dict()) == SHIPPED and SHIPPED.min_side == 260
    assert preprocess_from_dict(SHIPPED.members[1].to_dict()) == SHIPPED.members[1]
    assert Preprocess(224, resize=256, crops=5).min_side == 256


@pytest.mark.parametrize("cores, device, workers, expected", [
    (16, "cuda", None, {"num_workers": 15, "pin_memory": True, "prefetch_factor": 2}),
    (16, "cpu", None, {"num_workers": 8, "pin_memory": False, "prefetch_factor": 2}),
    (16, "cuda", 40, {"num_workers": 16, "pin_memory": True, "prefetch_factor": 2}),
    (2, "cpu", None, {"num_workers": 1, "pin_memory": False, "prefetch_factor": 4}),
    (2, "cpu", 2, {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2}),
    (3, "cuda", None, {"num_workers": 2, "pin_memory": True, "prefetch_factor": 2}),
    (1, "cuda", None, {"num_workers": 0, "pin_memory": True}),
    (1, "cpu", None, {"num_workers": 0, "pin_memory": False}),
])
def test_loader_workers_prefetch_and_pinning_follow_cores_and_device(monkeypatch, cores, device, workers, expected):
    monkeypatch.setattr(features.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert loader_options(1000, 64, workers, device) == expected
    assert loader_options(64, 64, workers, device)["num_workers"] == 0        # one batch: no worker processes


def _stand_in(preprocess):
    """A module standing in for a model where only its preprocessing, config and (no) person discount are read."""
    model = torch.nn.Linear(1, 1)
    model.preprocess, model.cfg = preprocess, tiny_config(model={"embed_dim": 4})
    model.person_discount = lambda: 0.0
    return model


def test_embedding_files_for_a_cuda_model_pins_its_batches(monkeypatch, tmp_path):
    """The loader of embed_image_files takes its settings from the model's device (no GPU needed to check)."""
    monkeypatch.setattr(features.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(embed, "device_of", lambda model: torch.device("cuda"))
    seen = {}

    def loader(dataset, **kwargs):
        seen.update(kwargs)
        return []

    monkeypatch.setattr(embed, "DataLoader", loader)
    model = _stand_in(SHIPPED)
    out = embed.embed_image_files(model, [tmp_path / f"{i}.jpg" for i in range(200)], embed.FileReading(workers=None),
                                   progress=False)
    assert out.vectors.shape == (0, 4)
    assert seen["num_workers"] == 7 and seen["pin_memory"] is True and seen["prefetch_factor"] == 2


def test_sync_hashes_and_decodes_the_same_bytes_and_skips_decoding_unchanged_content(tmp_path, monkeypatch):
    """A file whose size or mtime changed is read once in the worker: hashed, and decoded only when the hash is not
    the one the index holds (``index sync``)."""
    import hashlib

    import index.embed as index_embed

    same, edited = tmp_path / "same.jpg", tmp_path / "edited.jpg"
    same.write_bytes(jpeg(photo(64, 48, seed=1)))
    edited.write_bytes(jpeg(photo(64, 48, seed=2)))
    indexed = {str(same): hashlib.sha256(same.read_bytes()).hexdigest(), str(edited): "0" * 64}
    reads, decodes = [], []
    real_read, real_decode = index_embed.Path.read_bytes, index_embed.decode_image
    monkeypatch.setattr(index_embed.Path, "read_bytes", lambda self: reads.append(self.name) or real_read(self))
    monkeypatch.setattr(index_embed, "decode_image", lambda *a, **k: decodes.append(1) or real_decode(*a, **k))
    model = _stand_in(Preprocess(32, 32))
    monkeypatch.setattr(embed, "embed_pixels", lambda m, pixels, shapes=None, unfamiliarity=False: torch.zeros(len(pixels), 4))
    out = index_embed.embed_photos(model, [same, edited], workers=0, progress=False, indexed=indexed)
    assert out.passed == [0] and out.kept == [1] and not out.skipped
    assert sorted(reads) == ["edited.jpg", "same.jpg"] and len(decodes) == 1       # each read once, one decoded
    assert out.info[0].sha256 == hashlib.sha256(edited.read_bytes()).hexdigest()


# --- decoding started before the model loads (index build) -------------------------------------------------------

@pytest.fixture
def twenty_photos(synth_small, tmp_path):
    import shutil

    folder = tmp_path / "photos"
    folder.mkdir()
    for p in sorted((synth_small / "images").glob("*.jpg"))[:20]:
        shutil.copy(p, folder / p.name)
    return folder


def test_index_build_decodes_before_the_model_loads_and_embeds_as_after(tiny_model_path, twenty_photos, tmp_path,
                                                                       monkeypatch):
    """`index build` starts its decoding workers (well ahead) before it loads the model, reading the model file
    once; the vectors are those of a build that decodes after the model is loaded."""
    import index.embed as index_embed
    import training.models.checkpoint as checkpoint
    from index.changes import BuildOptions
    from index.gallery import EmbedOptions, Gallery, build
    from service.cli import main as cli_main

    events = []
    real_decode, real_load, real_read = index_embed.decode_photos, checkpoint.load_model, checkpoint.load_checkpoint
    monkeypatch.setattr(index_embed, "decode_photos",
                        lambda *a, **k: events.append(("decode", k["how"].ahead)) or real_decode(*a, **k))
    monkeypatch.setattr(checkpoint, "load_model",
                        lambda path, device="cpu", payload=None: events.append(("load", payload is not None))
                        or real_load(path, device, payload))
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda path: events.append(("read",)) or real_read(path))
    out = tmp_path / "early"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(twenty_photos), "--out",
                     str(out), "--quiet", "--workers", "1", "--no-querybank", "--backend", "eager"]) == 0
    assert events == [("read",), ("decode", True), ("load", True)]

    model = real_load(tiny_model_path)
    late = tmp_path / "late"
    paths = sorted(twenty_photos.glob("*.jpg"))
    build(late, model, paths, options=BuildOptions(tta="flip-crop"), embedding=EmbedOptions(progress=False, workers=1))

    def vectors(root):
        gallery = Gallery.load(root)
        try:
            return {r.path: gallery.image_vector(r.id) for r in gallery.meta.all_images()}
        finally:
            gallery.close()
    early_vectors, late_vectors = vectors(out), vectors(late)
    assert sorted(early_vectors) == sorted(late_vectors) and len(early_vectors) == 20
    for path, vector in late_vectors.items():
        np.testing.assert_array_equal(early_vectors[path], vector)


def test_a_model_that_fails_to_load_stops_the_decoding_started(tiny_model_path, twenty_photos, tmp_path,
                                                              monkeypatch, capsys):
    import training.inference.embedding as embedding
    import training.models.checkpoint as checkpoint
    from service.cli import main as cli_main

    closed = []
    real_close = embedding.ImageDecoding.close
    monkeypatch.setattr(embedding.ImageDecoding, "close", lambda self: closed.append(1) or real_close(self))

    def broken(*a, **k):
        raise ValueError("this model does not load")
    monkeypatch.setattr(checkpoint, "load_model", broken)
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(twenty_photos), "--out",
                     str(tmp_path / "index"), "--quiet", "--workers", "1"]) == 2
    assert "this model does not load" in capsys.readouterr().err
    assert closed and not (tmp_path / "index").exists()


def test_a_decoding_started_is_checked_against_the_files_and_the_model(tiny_model_path, twenty_photos):
    from index.embed import decode_photos, embed_photos
    from training.models.checkpoint import load_checkpoint, load_model, stored_preprocess

    model = load_model(tiny_model_path)
    assert stored_preprocess(load_checkpoint(tiny_model_path)) == model.preprocess
    paths = sorted(twenty_photos.glob("*.jpg"))
    started = decode_photos(model.preprocess, paths[:10], 16, workers=0, tta="flip")
    with pytest.raises(ValueError, match="other files"):
        embed_photos(model, paths[:9], decoding=started, progress=False)
    other = Preprocess(model.preprocess.image_size + 8, model.preprocess.resize + 8)
    with pytest.raises(ValueError, match="preprocesses the images otherwise"):
        embed_photos(model, paths[:10], decoding=decode_photos(other, paths[:10], 16, workers=0),
                          progress=False)
    again = decode_photos(model.preprocess, paths[:10], 16, workers=0, tta="flip")
    out = embed_photos(model, paths[:10], decoding=again, progress=False)
    # the same pixels and weights; float32 rounding may differ by a unit in the last place between CPUs whose
    # BLAS kernels split a batch otherwise (measured: 1.2e-7 on an Intel Xeon, exact on an AMD EPYC)
    np.testing.assert_allclose(out.vectors, embed_photos(model, paths[:10], workers=0, progress=False,
                                                         tta="flip").vectors, rtol=0, atol=1e-6)


def test_decoding_ahead_holds_more_batches_within_its_memory_bound(monkeypatch, tmp_path):
    monkeypatch.setattr(features.os, "sched_getaffinity", lambda pid: set(range(2)))
    paths = [tmp_path / f"{i}.jpg" for i in range(400)]
    usual = embed.ImageDecoding(paths, SHIPPED, batch_size=4, workers=None)
    ahead = embed.ImageDecoding(paths, SHIPPED, batch_size=4, workers=None, ahead=True)
    try:
        batch_bytes = 4 * SHIPPED.channels * SHIPPED.image_size ** 2
        assert usual.loader.prefetch_factor == 4 and usual.loader.num_workers == 1
        assert ahead.loader.prefetch_factor == embed.AHEAD_BYTES // batch_bytes > 4
    finally:
        usual.close()
        ahead.close()
