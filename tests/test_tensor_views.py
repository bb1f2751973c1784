"""The torch decode path (training/inference/tensor_views.py) against the PIL path it replaces on a CUDA host, run
here on CPU tensors (the same code): the same views to a fraction of a grey level on average, the same embeddings,
EXIF orientation, the files left to Pillow, and which path the setting picks."""
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from index.embed import PhotoDecoding, decode_photos, read_photo
from server_process import wait_ready
from training.data.preprocess import (ZOOM, ImageGeometryError, MirroredViews, Preprocess, StackedPreprocess,
                                      decode_image, embed_side)
from training.inference import tensor_views as tv
from training.inference.embedding import ImageDecoding, embed_image_files, read_encoded, read_image

SHIPPED = StackedPreprocess((Preprocess(260, 260, (0.5,) * 3, (0.5,) * 3), Preprocess(224, 224, (0.5,) * 3, (0.5,) * 3),
                             Preprocess(240, 240, (0.5,) * 3, (0.5,) * 3)))
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    """The repository's own sample photos, as `jointspace index samples` writes them (real photos, no network)."""
    from index.samples import write_samples

    found = sorted(write_samples(tmp_path_factory.mktemp("samples"), near_duplicate=False).glob("*.jpg"))
    assert found, "index.samples wrote no photos"
    return found


def _jpeg(array: np.ndarray, **save) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, "JPEG", quality=92, **save)
    return out.getvalue()


def _photo_like(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth colour gradients with some texture: a JPEG that compresses like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h) + 64], -1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("pre", [SHIPPED, MirroredViews(SHIPPED, zoom=ZOOM), Preprocess(64, 72, crops=10),
                                 MirroredViews(Preprocess(64, 72, crops=5))],
                         ids=["stacked", "stacked-flip-crop", "ten-crop", "five-crop-flip"])
def test_torch_views_are_the_pil_views_to_a_fraction_of_a_grey_level(pre, photos, monkeypatch):
    """Against the PIL views of the decode the torch path resizes from: the full decode (``REDUCE_LIKE_PIL`` off;
    for the shipped preprocessing the demo photos are not shrunk by PIL either, so it is the path as shipped)."""
    monkeypatch.setattr(tv, "REDUCE_LIKE_PIL", False)
    for path in photos:
        data = path.read_bytes()
        pil = pre.pixels(decode_image(data, ".jpg").image)
        encoded = tv.encoded_jpeg(data, pre.min_side)
        assert encoded is not None, path
        got = tv.encoded_pixels(pre, [encoded], "cpu")
        assert got.shape == (1, *pil.shape) and got.dtype == torch.uint8
        diff = (got[0].int() - pil.int()).abs()
        assert diff.max() <= 4 and diff.float().mean() < 0.3, (path.name, diff.max(), diff.float().mean())
        if pre is SHIPPED:                                           # the PIL path as shipped: the same here
            assert torch.equal(pil, pre.pixels(decode_image(data, ".jpg", embed_side(pre)).image))


@pytest.mark.parametrize("pre", [SHIPPED, MirroredViews(SHIPPED, zoom=ZOOM), Preprocess(64, 72, crops=10),
                                 MirroredViews(Preprocess(64, 72, crops=5))],
                         ids=["stacked", "stacked-flip-crop", "ten-crop", "five-crop-flip"])
def test_a_batch_is_cut_into_views_as_each_image_alone(pre, monkeypatch):
    """views_of cuts the images of one size together (one kernel a step for the batch, on a GPU) and in chunks: the
    same uint8 views, bit for bit, as tensor_views of each image alone, in the order given, sizes mixed, a photo
    large enough to be box-reduced first among them."""
    sizes = [(300, 400), (400, 300), (300, 400), (900, 1200), (300, 400), (257, 261), (400, 300), (900, 1200)]
    images = [torch.from_numpy(_photo_like(h, w, seed=i)).permute(2, 0, 1).contiguous()
              for i, (h, w) in enumerate(sizes)]
    alone = torch.stack([tv.tensor_views(pre, im) for im in images])
    assert torch.equal(tv.views_of(pre, images), alone)
    monkeypatch.setattr(tv, "CHUNK_PIXELS", 2 * 300 * 400)         # two of the common size a chunk, big ones alone
    assert torch.equal(tv.views_of(pre, images), alone)
    side = pre.image_size
    assert tv.views_of(pre, []).shape == (0, pre.crops, pre.channels, side, side)


def test_box_reducing_first_follows_the_pil_paths_shrinking(photos):
    """``REDUCE_LIKE_PIL`` on (as shipped): a photo PIL decodes at a DCT scale is box-reduced by that factor before
    the resize, and the views follow PIL's shrunk decode closely (ten crops of 64 px: cat.jpg is decoded at 1/2)."""
    assert tv.REDUCE_LIKE_PIL
    pre = Preprocess(64, 72, crops=10)
    for path in photos:
        data = path.read_bytes()
        pil = pre.pixels(decode_image(data, ".jpg", embed_side(pre)).image)
        diff = (tv.encoded_pixels(pre, [tv.encoded_jpeg(data, pre.min_side)], "cpu")[0].int() - pil.int()).abs()
        assert diff.max() <= 6 and diff.float().mean() < 0.3, (path.name, diff.max(), diff.float().mean())
    image = torch.zeros(3, 300, 451, dtype=torch.uint8)
    assert tv.shrunk(image, 72).shape == (3, 150, 226)               # 1/2, as dct_scale((451, 300), 72)
    assert tv.shrunk(image, 260) is image                            # not shrunk by PIL either


def test_a_large_photo_shrunk_by_pil_while_decoding_gives_close_views():
    """A 12 MP JPEG: PIL decodes it at a DCT scale and reduces it, torch box-reduces it by the same factor and
    resizes that."""
    data = _jpeg(_photo_like(3000, 4000))
    pil = SHIPPED.pixels(decode_image(data, ".jpg", embed_side(SHIPPED)).image).int()
    got = tv.encoded_pixels(SHIPPED, [tv.encoded_jpeg(data, SHIPPED.min_side)], "cpu")[0].int()
    assert (got - pil).abs().float().mean() < 1.0


def test_torch_and_pil_embeddings_agree_on_real_photos(tmp_path, photos):
    from training.models.checkpoint import load_model

    model = load_model(REPO / "training" / "pretrained" / "flickr8k.pt")
    paths = photos[:6]
    out = {}
    for decode in ("pil", "torch"):
        decoding = decode_photos(model.preprocess, paths, 16, 0, "cpu", how=PhotoDecoding(decode=decode))
        assert decoding.decode == decode
        out[decode] = embed_image_files(model, paths, progress=False, decoding=decoding)
    assert out["pil"].kept == out["torch"].kept == list(range(len(paths)))
    cosines = (out["pil"].vectors * out["torch"].vectors).sum(1)
    assert cosines.min() >= 0.99, cosines
    for a, b in zip(out["pil"].info, out["torch"].info):       # what the metadata keeps is the file's own
        assert (a.width, a.height, a.sha256, a.size, a.taken) == (b.width, b.height, b.sha256, b.size, b.taken)
        assert (a.phash ^ b.phash).bit_count() <= 4


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_turns_the_image_as_pillow_does(orientation):
    array = _photo_like(24, 40, seed=orientation)
    array[:6, :10] = 255                                     # a mark in one corner: every turn is visible
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _jpeg(array, exif=exif.tobytes())
    encoded = tv.encoded_jpeg(data)
    assert encoded is not None and encoded.orientation == orientation and encoded.size == (40, 24)
    got = tv.decode_batch([encoded], "cpu")[0]
    expected = torch.from_numpy(np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
                                ).permute(2, 0, 1)
    assert got.shape == expected.shape and (got.shape[2], got.shape[1]) == encoded.upright_size
    assert (got.int() - expected.int()).abs().max() <= 1     # the same decoder; turned alike
    assert decode_image(data, ".jpg").size == encoded.upright_size


def _cmyk_jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(_photo_like(40, 48)).convert("CMYK").save(out, "JPEG")
    return out.getvalue()


def _png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(_photo_like(40, 48)).save(out, "PNG")
    return out.getvalue()


def test_only_plain_jpegs_go_to_the_device():
    rgb = _photo_like(40, 48)
    assert tv.plain_jpeg(_jpeg(rgb))
    assert tv.plain_jpeg(_jpeg(rgb[..., 0]))                          # grey: one component
    assert not tv.plain_jpeg(_jpeg(rgb, progressive=True))
    assert not tv.plain_jpeg(_cmyk_jpeg())                            # four components
    assert not tv.plain_jpeg(_png())
    assert not tv.plain_jpeg(b"\xff\xd8\xff")                         # a header cut short
    assert tv.encoded_jpeg(_png()) is None and tv.encoded_jpeg(_cmyk_jpeg()) is None


def test_other_files_fall_back_to_pillow_in_the_same_batch(tmp_path):
    """A PNG, a CMYK and a progressive JPEG in a batch with plain JPEGs: those decoded by Pillow in the workers,
    the plain ones on the device; every row as the PIL path makes it (within a grey level)."""
    pre = Preprocess(64, 72)
    files = {"plain.jpg": _jpeg(_photo_like(90, 120, 1)), "cmyk.jpg": _cmyk_jpeg(), "shot.png": _png(),
             "progressive.jpg": _jpeg(_photo_like(80, 100, 2), progressive=True),
             "grey.jpg": _jpeg(_photo_like(70, 50, 3)[..., 1])}
    paths = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    kinds = [type(read_encoded(p, pre.min_side)[0]).__name__ for p in paths]
    assert kinds == ["EncodedJPEG", "Image", "Image", "Image", "EncodedJPEG"]
    torch_batch = ImageDecoding(paths, pre, batch_size=8, workers=0, decode="torch")
    pil_batch = ImageDecoding(paths, pre, batch_size=8, workers=0, decode="pil")
    _, mixed, bad, _, _ = next(torch_batch)
    _, pixels, _, _, _ = next(pil_batch)
    assert not bad and isinstance(mixed, list) and isinstance(pixels, torch.Tensor)
    got = torch_batch.pixels(mixed, torch.device("cpu"))
    assert got.shape == pixels.shape and (got.int() - pixels.int()).abs().max() <= 2


def test_a_photo_too_large_for_the_model_is_refused_from_its_header():
    data = _jpeg(_photo_like(8, 800))                               # 100:1
    with pytest.raises(ImageGeometryError):
        tv.encoded_jpeg(data, 260)


def test_the_index_reader_leaves_plain_jpegs_encoded_only_under_torch(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(_jpeg(_photo_like(300, 400)))
    image, info = read_photo(path, SHIPPED.min_side)
    encoded, same = read_photo(path, SHIPPED.min_side, encoded=True)
    assert isinstance(image, Image.Image) and isinstance(encoded, tv.EncodedJPEG)
    assert (info.width, info.height, info.sha256, info.phash) == (same.width, same.height, same.sha256, same.phash)


def test_the_setting_picks_torch_on_cuda_and_pil_on_a_cpu(monkeypatch):
    monkeypatch.delenv("JOINTSPACE_DECODE", raising=False)
    assert tv.decode_choice("cpu") == "pil" and tv.decode_choice("cuda") == "torch"
    assert tv.decode_choice("cuda", "pil") == "pil" and tv.decode_choice("cpu", "torch") == "torch"
    monkeypatch.setenv("JOINTSPACE_DECODE", "torch")
    assert tv.decode_choice("cpu") == "torch" and tv.decode_choice("cpu", "auto") == "pil"
    monkeypatch.setenv("JOINTSPACE_DECODE", "nvjpeg")
    with pytest.raises(ValueError, match=r"unknown image decoding 'nvjpeg' \(JOINTSPACE_DECODE\); known: auto, pil, "
                                         r"torch"):
        tv.decode_choice("cpu")
    from service.settings import Settings

    with pytest.raises(ValueError, match="decode"):                  # the service refuses it at start
        Settings()
    monkeypatch.setenv("JOINTSPACE_DECODE", "torch")
    assert Settings().decode == "torch"
    monkeypatch.delenv("JOINTSPACE_DECODE")
    assert Settings().decode == "auto"
    decoding = ImageDecoding([], Preprocess(64, 72), workers=0)
    assert decoding.decode == "pil"                               # a CPU's default is unchanged
    assert read_image is not read_encoded


def test_the_index_commands_take_decode(capsys):
    from service.cli import build_parser

    parser = build_parser()
    for argv in (["index", "build", "--images", "x", "--out", "y"], ["index", "add", "--index", "x"],
                 ["index", "sync", "--images", "x", "--index", "y"]):
        assert parser.parse_args([*argv, "--decode", "torch"]).decode == "torch"
        assert parser.parse_args(argv).decode is None
        with pytest.raises(SystemExit):
            parser.parse_args([*argv, "--decode", "nvjpeg"])
        assert "invalid choice: 'nvjpeg'" in capsys.readouterr().err


def test_index_build_with_torch_decoding_embeds_as_with_pil(tiny_model_path, synth_small, tmp_path):
    """`index build --decode torch` (what a CUDA host runs by default), here on the CPU: the same photos indexed,
    the same metadata, vectors within the two paths' grey level."""
    import shutil

    from index.gallery import Gallery
    from service.cli import main as cli_main

    folder = tmp_path / "photos"
    folder.mkdir()
    for p in sorted((synth_small / "images").glob("*.jpg"))[:12]:
        shutil.copy(p, folder / p.name)
    (folder / "shot.png").write_bytes(_png())
    vectors, rows = {}, {}
    for decode in ("pil", "torch"):
        assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(folder), "--out",
                         str(tmp_path / decode), "--quiet", "--workers", "1", "--no-querybank", "--backend", "eager",
                         "--decode", decode]) == 0
        gallery = Gallery.load(tmp_path / decode)
        try:
            images = sorted(gallery.meta.all_images(), key=lambda r: r.path)
            vectors[decode] = np.stack([gallery.image_vector(r.id) for r in images])
            rows[decode] = [(Path(r.path).name, r.width, r.height, r.sha256) for r in images]
        finally:
            gallery.close()
    assert rows["pil"] == rows["torch"] and len(rows["pil"]) == 13
    assert (vectors["pil"] * vectors["torch"]).sum(1).min() > 0.99


def test_an_upload_under_torch_decoding_gets_the_same_pixels_and_the_same_errors(monkeypatch, tmp_path, photos):
    from service.images import ImageError, upload_to_pixels

    cpu = torch.device("cpu")
    data = next(p for p in photos if p.name == "cat.jpg").read_bytes()
    monkeypatch.delenv("JOINTSPACE_DECODE", raising=False)
    pil = upload_to_pixels(data, 50_000_000, SHIPPED, cpu)            # a CPU's default: Pillow, as before
    assert torch.equal(pil, upload_to_pixels(data, 50_000_000, SHIPPED))
    monkeypatch.setenv("JOINTSPACE_DECODE", "torch")
    got = upload_to_pixels(data, 50_000_000, SHIPPED, cpu)
    assert got.device == cpu and got.shape == pil.shape and (got.int() - pil.int()).abs().max() <= 6
    path = tmp_path / "query.jpg"
    path.write_bytes(data)
    assert torch.equal(upload_to_pixels(path, 50_000_000, SHIPPED, cpu), got)     # a gallery file, the same
    with pytest.raises(ImageError) as refused:                        # the geometry, from the header: 413
        upload_to_pixels(_jpeg(_photo_like(8, 800)), 50_000_000, SHIPPED, cpu)
    assert refused.value.status == 413
    with pytest.raises(ImageError) as refused:                        # too many pixels for this service: 413
        upload_to_pixels(data, 1000, SHIPPED, cpu)
    assert refused.value.status == 413
    with pytest.raises(ImageError) as truncated:                      # not whole: Pillow's, which refuses it
        upload_to_pixels(data[:len(data) // 2], 50_000_000, SHIPPED, cpu)
    assert truncated.value.status == 400
    assert torch.equal(upload_to_pixels(_png(), 50_000_000, SHIPPED, cpu), upload_to_pixels(_png(), 50_000_000, SHIPPED))


def test_a_query_image_under_torch_decoding_gives_the_same_features(monkeypatch, photos):
    from training.inference.compose import image_features_of
    from training.models.checkpoint import load_model

    model = load_model(REPO / "training" / "pretrained" / "flickr8k.pt")
    photo = photos[0]
    monkeypatch.delenv("JOINTSPACE_DECODE", raising=False)
    pil = image_features_of(model, photo)
    monkeypatch.setenv("JOINTSPACE_DECODE", "torch")
    got = image_features_of(model, photo)
    assert torch.nn.functional.cosine_similarity(got, pil, dim=0) > 0.999


def test_the_services_image_routes_decode_uploads_by_torch_when_set(tiny_model_path, synth_small, tmp_path,
                                                                     monkeypatch):
    """JOINTSPACE_DECODE=torch (a CUDA host's default) on a CPU service: an upload as a query goes through the
    torch path and ranks as with Pillow; `index search --image` takes the same path."""
    import shutil

    from fastapi.testclient import TestClient

    import training.inference.tensor_views as views
    from service.app import create_app
    from service.cli import main as cli_main
    from service.settings import Settings

    folder = tmp_path / "photos"
    folder.mkdir()
    for p in sorted((synth_small / "images").glob("*.jpg"))[:8]:
        shutil.copy(p, folder / p.name)
    index = tmp_path / "index"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(folder), "--out", str(index),
                     "--quiet", "--workers", "0", "--no-querybank"]) == 0
    used = []
    real = views.encoded_pixels
    monkeypatch.setattr(views, "encoded_pixels", lambda *a, **k: used.append(1) or real(*a, **k))
    photo = next(folder.glob("*.jpg"))
    upload = {"image": (photo.name, photo.read_bytes(), "image/jpeg")}
    answers = {}
    for decode in ("pil", "torch"):
        monkeypatch.setenv("JOINTSPACE_DECODE", decode)
        with TestClient(create_app(Settings(model=str(tiny_model_path), index=str(index), reload_interval_s=0))) as c:
            wait_ready(c)
            before = len(used)
            by_upload = c.post("/v1/search/images", files=upload, data={"k": "3"})
            assert by_upload.status_code == 200, by_upload.text
            assert (len(used) > before) == (decode == "torch")
            answers[decode] = [h["id"] for h in by_upload.json()["results"]]
    assert answers["pil"] == answers["torch"]
    before = len(used)                                               # `index search --image`: the same setting
    assert cli_main(["index", "search", "--index", str(index), "--model", str(tiny_model_path), "--image",
                     str(photo), "--json"]) == 0
    assert len(used) == before + 1
