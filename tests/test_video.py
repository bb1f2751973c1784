"""Videos: reading every container with PyAV, frame sampling, rotation, moments, bad files skipped with a reason,
build + search with photos and moments in one ranking, sync of changed and deleted videos. Clips are a few 64 px
frames written in a temporary folder."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from index import video_decode
from index.changes import BuildOptions
from index.gallery import EmbedOptions, Gallery, build, sync
from index.metadata import Metadata
from index.query import ImageFilter
from index.moments import Sampling, segment
from index.scan import find_videos
from index.video_decode import VideoError, frame_at, probe, sample_frames
from index.video_embed import embed_videos
from index.video_writer import write_video
from server_process import wait_ready
from service.cli import main as cli_main
from training.models.checkpoint import load_model


def _frames(n, w=64, h=64, colour=(255, 0, 0), seed=0):
    """``n`` frames: a square of ``colour`` moving left to right on a grey ground, each frame's red channel
    also counting the frame number (so a sampled frame can be told from its neighbours)."""
    rng = np.random.default_rng(seed)
    ground = rng.integers(90, 110, 3)
    for i in range(n):
        a = np.empty((h, w, 3), np.uint8)
        a[:] = ground
        x = (i * 3) % (w - 16)
        a[h // 2 - 8:h // 2 + 8, x:x + 16] = colour
        a[:4, :4, 0] = min(255, i * 10)
        yield a


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


@pytest.mark.parametrize("suffix", [".mp4", ".mov", ".m4v", ".webm", ".mkv", ".avi"])
def test_every_container_reads_at_the_sampling_rate(tmp_path, suffix):
    path = write_video(tmp_path / f"clip{suffix}", _frames(20), fps=4)        # 5 s
    facts: dict = {}
    got = [(t, im.size) for t, im in sample_frames(path, rate=1.0, facts=facts)]
    assert [round(t, 3) for t, _ in got] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert {size for _, size in got} == {(64, 64)}
    assert facts["duration"] == pytest.approx(5.0, abs=0.01) and facts["fps"] == pytest.approx(4.0)
    assert find_videos(tmp_path) == [path]


def test_rate_max_frames_and_far_seeks_pick_the_frames_asked_for(tmp_path):
    path = write_video(tmp_path / "clip.mp4", _frames(40), fps=4)             # 10 s, one keyframe every 250
    assert [t for t, _ in sample_frames(path, rate=2.0)] == pytest.approx([i / 2 for i in range(20)])
    assert [t for t, _ in sample_frames(path, rate=2.0, max_frames=3)] == pytest.approx([0.0, 0.5, 1.0])
    # every 5 s: each target is past SEEK_GAP, so it is reached by a seek; the frame counter proves which frame
    sampled = list(sample_frames(path, rate=0.2))
    assert [t for t, _ in sampled] == pytest.approx([0.0, 5.0])
    assert abs(int(np.asarray(sampled[1][1])[1, 1, 0]) - 200) < 12                 # frame 20 (5 s × 4 fps)
    keyed = write_video(tmp_path / "keyed.mkv", _frames(40), fps=4)
    assert [t for t, _ in sample_frames(keyed, rate=1 / 3)] == pytest.approx([0.0, 3.0, 6.0, 9.0])


def test_rotation_metadata_is_applied(tmp_path):
    a = np.zeros((32, 64, 3), np.uint8)
    a[:, :32] = (0, 255, 0)                              # stored: left half green
    path = write_video(tmp_path / "turned.mp4", [a] * 4, fps=4, rotation=90)
    facts: dict = {}
    t, image = next(sample_frames(path, facts=facts))
    pixels = np.asarray(image)
    assert image.size == (32, 64)                        # upright: portrait
    assert pixels[-2, 16, 1] > 200 and pixels[2, 16, 1] < 50     # 90° counter-clockwise: left half → bottom
    assert facts["rotation"] == 90
    assert frame_at(path, 0.5).size == (32, 64)


def test_fixed_windows_and_cuts():
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    segs = segment(times, window=3.0, step=1.0, duration=6.5)
    assert [(s.start, s.end, s.frames) for s in segs] == [(0.0, 3.0, (0, 3)), (3.0, 6.0, (3, 6)), (6.0, 6.5, (6, 7))]
    vectors = np.array([[1, 0], [1, 0], [0, 1], [0, 1], [0, 1], [1, 0], [1, 0]], np.float32)
    cut = segment(times, vectors, window=10.0, cut=0.5, step=1.0)
    assert [s.frames for s in cut] == [(0, 2), (2, 5), (5, 7)]
    with pytest.raises(ValueError):
        segment(times, window=0)
    with pytest.raises(ValueError):
        Sampling(rate=0)


def _bad_files(folder: Path) -> dict[str, Path]:
    import av

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.mp4").write_bytes(b"")
    (folder / "garbage.mov").write_bytes(os.urandom(4096))
    audio = folder / "audio.mkv"
    with av.open(str(audio), "w") as c:
        stream = c.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    good = write_video(folder / "cut.mp4", _frames(16), fps=4)
    truncated = folder / "truncated.mp4"                       # its index says more than its bytes hold
    truncated.write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])
    good.unlink()
    return {"empty": folder / "empty.mp4", "garbage": folder / "garbage.mov", "audio": audio,
            "truncated": truncated}


def test_bad_files_are_skipped_with_a_reason(tmp_path, model, monkeypatch):
    bad = _bad_files(tmp_path / "bad")
    good = write_video(tmp_path / "good.webm", _frames(8), fps=4)
    paths = [bad["empty"], good, bad["garbage"], bad["audio"], bad["truncated"]]
    emb = embed_videos(model, paths, Sampling(rate=2.0, window=1.0), workers=0, progress=False)
    assert emb.kept == [1] and emb.moments == 2 and emb.frames == 4
    reasons = dict(emb.skipped)
    assert "0 bytes" in reasons[str(bad["empty"])]
    assert "not a readable video" in reasons[str(bad["garbage"])]
    assert "no video stream (only audio)" == reasons[str(bad["audio"])]
    assert str(bad["truncated"]) in reasons                      # the MP4 index is at the end: cut off
    with pytest.raises(VideoError, match="larger than 32 a side"):   # refused from the header: nothing decoded
        monkeypatch.setattr(video_decode, "MAX_SIDE", 32)
        probe(good)


def test_a_container_that_claims_more_than_it_holds_ends_where_its_frames_end(tmp_path):
    noise = (np.random.default_rng(i).integers(0, 255, (64, 64, 3), dtype=np.uint8) for i in range(40))
    full = write_video(tmp_path / "full.mp4", noise, fps=4, faststart=True)    # index first: 10 s claimed
    lying = tmp_path / "lying.mp4"
    lying.write_bytes(full.read_bytes()[:int(full.stat().st_size * 0.5)])
    assert probe(lying)["duration"] == pytest.approx(10.0)
    facts: dict = {}
    times = [t for t, _ in sample_frames(lying, rate=1.0, facts=facts)]
    assert 1 <= len(times) < 10 and facts["duration"] < 10.0


def _gallery_folder(folder: Path, synth_small: Path) -> Path:
    photos = sorted((synth_small / "images").glob("*"))[:3]
    folder.mkdir(parents=True)
    for p in photos:
        shutil.copy(p, folder / p.name)
    write_video(folder / "red.mp4", _frames(12, colour=(255, 0, 0)), fps=4)         # 3 s
    (folder / "clips").mkdir()
    write_video(folder / "clips" / "blue.webm", _frames(8, colour=(0, 0, 255), seed=1), fps=4)     # 2 s
    (folder / "broken.avi").write_bytes(b"RIFF....AVI garbage")
    return folder


def test_build_and_search_return_photos_and_moments_in_one_ranking(tmp_path, tiny_model_path, synth_small,
                                                                   capsys):
    folder = _gallery_folder(tmp_path / "media", synth_small)
    out = tmp_path / "index"
    rc = cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(folder), "--out", str(out),
                   "--quiet", "--workers", "0", "--video-window", "2"])
    captured = capsys.readouterr()
    assert rc == 0 and "indexed 3 images, 2 videos (3 moments)" in captured.out
    assert "timing: start-up " in captured.out and " photos, one batch, no steady rate; " in captured.out
    assert "skipped unreadable video" in captured.err and "broken.avi" in captured.err
    gallery = Gallery.load(out)
    try:
        rows = gallery.meta.all_images()
        moments = [r for r in rows if r.video_id is not None]
        assert [(r.t_start, r.t_end) for r in moments] == [(0.0, 2.0), (0.0, 2.0), (2.0, 3.0)]   # blue, red
        assert gallery.images.ntotal == 6 and gallery.meta.counts()["videos"] == 2
        videos = gallery.meta.all_videos()
        assert [Path(v.path).name for v in videos] == ["blue.webm", "red.mp4"]          # found in path order
        assert videos[1].duration == pytest.approx(3.0) and videos[1].width == 64
        assert len(gallery.allowed_ids(ImageFilter(media="video"))) == 3
        assert len(gallery.allowed_ids(ImageFilter(media="photo"))) == 3
    finally:
        gallery.close()
    for media, expect in ((None, {"photo", "video"}), ("video", {"video"}), ("photo", {"photo"})):
        args = ["index", "search", "--index", str(out), "--model", str(tiny_model_path), "--text", "a red square",
                "--k", "6", "--json"] + (["--media", media] if media else [])
        assert cli_main(args) == 0
        results = json.loads(capsys.readouterr().out)["results"]
        assert {r["media"] for r in results} == expect                # as the service names them
        assert len(results) == (6 if media is None else 3)
        for r in results:
            if r.get("media") == "video":
                assert r["end"] > r["start"] >= 0 and r["video_id"] in (0, 1)


def test_a_videos_vector_is_the_mean_of_its_frames(tmp_path, model):
    clip = write_video(tmp_path / "c.mkv", _frames(12), fps=4)
    emb = embed_videos(model, [clip], Sampling(rate=1.0, window=10.0), workers=0, progress=False)
    from training.inference.embedding import embed_pixels

    frames = [model.preprocess.pixels(im) for _, im in sample_frames(clip, rate=1.0)]
    per_frame = embed_pixels(model.eval(), __import__("torch").stack(frames)).numpy()
    mean = per_frame.mean(0)
    mean /= np.linalg.norm(mean)
    assert np.allclose(emb.vectors[0], mean, atol=1e-5)
    assert np.allclose(emb.segment_vectors[0][0], mean, atol=1e-5)      # one window: the moment is the video


def test_sync_notices_changed_and_deleted_videos(tmp_path, tiny_model_path, synth_small, model):
    folder = _gallery_folder(tmp_path / "media", synth_small)
    out = tmp_path / "index"
    photos = sorted(p for p in folder.glob("*") if p.suffix == ".jpg")
    videos = find_videos(folder)
    build(out, model, photos, video_paths=videos, options=BuildOptions(image_root=folder),
          embedding=EmbedOptions(progress=False, workers=0))
    report = sync(out, model, folder,
                  embedding=EmbedOptions(progress=False, workers=0))          # nothing changed: no new generation
    assert report.unchanged == 5 and not report.image_ids and not report.video_ids
    write_video(folder / "red.mp4", _frames(20, colour=(0, 255, 0)), fps=4)           # changed: 5 s now
    (folder / "clips" / "blue.webm").unlink()                                       # deleted
    write_video(folder / "new.mov", _frames(4), fps=4)                              # new
    report = sync(out, model, folder, embedding=EmbedOptions(progress=False, workers=0))
    assert report.removed_videos == 1 and len(report.video_ids) == 2 and report.unchanged == 3
    gallery = Gallery.load(out)
    try:
        videos = {Path(v.path).name: v for v in gallery.meta.all_videos()}
        assert set(videos) == {"red.mp4", "new.mov"} and videos["red.mp4"].duration == pytest.approx(5.0)
        moments = [r for r in gallery.meta.all_images() if r.video_id is not None]
        assert {r.video_id for r in moments} == {videos["red.mp4"].id, videos["new.mov"].id}
        assert gallery.images.ntotal == 3 + len(moments)
        assert len(moments) == 2                                    # one 5 s window each (the default)
    finally:
        gallery.close()
    assert sync(out, model, folder, embedding=EmbedOptions(progress=False, workers=0)).unchanged == 5


def test_an_index_written_before_videos_still_loads_and_gains_the_columns(tmp_path):
    import sqlite3

    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE images (id INTEGER PRIMARY KEY, path TEXT NOT NULL, added REAL NOT NULL);"
                       "CREATE TABLE captions (id INTEGER PRIMARY KEY, text TEXT NOT NULL, image_id INTEGER, "
                       "added REAL NOT NULL);"
                       "INSERT INTO images VALUES (0, '/photos/a.jpg', 1.0);")
    conn.commit()
    conn.close()
    old = Metadata(db, readonly=True)
    assert old.all_videos() == [] and old.image(0).video_id is None and old.counts()["videos"] == 0
    old.close()
    meta = Metadata(db)                                      # opened for writing: migrated
    assert meta.image(0).t_start is None and meta.all_videos() == []
    meta.close()


# --- the service: moments in search results, their frames, the video file with range requests ------------------

@pytest.fixture(scope="module")
def video_client(tiny_model_path, synth_small, tmp_path_factory):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    folder = _gallery_folder(tmp_path_factory.mktemp("served") / "media", synth_small)
    out = folder.parent / "index"
    photos = sorted(p for p in folder.glob("*") if p.suffix == ".jpg")
    build(out, load_model(tiny_model_path), photos, video_paths=find_videos(folder),
          options=BuildOptions(image_root=folder),
          embedding=EmbedOptions(progress=False, workers=0, sampling=Sampling(window=2.0)))
    app = create_app(Settings(model=str(tiny_model_path), index=str(out), reload_interval_s=0))
    with TestClient(app) as client:
        wait_ready(client)
        gallery = Gallery.load(out)
        moments = [r for r in gallery.meta.all_images() if r.video_id is not None]
        videos = gallery.meta.all_videos()
        gallery.close()
        yield client, moments, videos


def test_search_returns_moments_with_their_video_and_time_span(video_client):
    client, moments, videos = video_client
    r = client.post("/v1/search/images", json={"text": "a red square", "k": 6})
    assert r.status_code == 200
    hits = r.json()["results"]
    assert {h["media"] for h in hits} == {"photo", "video"}
    by_id = {m.id: m for m in moments}
    for h in hits:
        if h["media"] == "video":
            m = by_id[h["id"]]
            assert (h["video_id"], h["start"], h["end"]) == (m.video_id, m.t_start, m.t_end)
            assert h["start"] <= h["frame"] < h["end"]
        else:
            assert h["video_id"] is None and h["start"] is None
    moment = moments[0]
    thumb = client.get(f"/v1/images/{moment.id}?size=32")          # the moment's frame, as a JPEG
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    assert max(Image.open(__import__("io").BytesIO(thumb.content)).size) == 32
    assert client.post("/v1/search/captions", json={"image_id": moment.id, "k": 3}).status_code == 200
    similar = client.post("/v1/search/images", json={"image_id": moment.id, "k": 3})    # a moment as the query
    assert similar.status_code == 200 and similar.json()["results"][0]["id"] == moment.id


def test_search_keeps_to_one_media_type_when_asked(video_client):
    client, moments, _ = video_client
    ids = {m.id for m in moments}
    for media in ("video", "photo"):
        r = client.post("/v1/search/images", json={"text": "a red square", "k": 6, "media": media})
        assert r.status_code == 200
        hits = r.json()["results"]
        assert len(hits) == 3 and {h["media"] for h in hits} == {media}
        assert all((h["id"] in ids) == (media == "video") for h in hits)
        by_example = client.post("/v1/search/images", json={"image_id": moments[0].id, "k": 6, "media": media})
        assert {h["media"] for h in by_example.json()["results"]} == {media}
    upload = client.post("/v1/search/images", files={"image": ("q.jpg", _jpeg_bytes(), "image/jpeg")},
                         data={"k": "6", "media": "video"})
    assert upload.status_code == 200 and {h["media"] for h in upload.json()["results"]} == {"video"}
    for bad in ({"json": {"text": "a red square", "media": "audio"}},
                {"files": {"image": ("q.jpg", _jpeg_bytes(), "image/jpeg")}, "data": {"media": "clip"}}):
        r = client.post("/v1/search/images", **bad)
        assert r.status_code == 422 and "media" in json.dumps(r.json())
    schema = client.get("/openapi.json").json()
    form = schema["paths"]["/v1/search/images"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert form["schema"]["properties"]["media"]["enum"] == ["photo", "video"]


def _jpeg_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, "JPEG")
    return buf.getvalue()


def test_the_video_file_is_streamed_with_range_requests(video_client):
    client, _, videos = video_client
    video = videos[0]
    data = Path(video.path).read_bytes()
    size = len(data)
    whole = client.get(f"/v1/videos/{video.id}")
    assert whole.status_code == 200 and whole.content == data and whole.headers["accept-ranges"] == "bytes"
    assert whole.headers["content-type"] == "video/webm"                 # clips/blue.webm comes first
    part = client.get(f"/v1/videos/{video.id}", headers={"Range": "bytes=10-109"})
    assert part.status_code == 206 and part.content == data[10:110]
    assert part.headers["content-range"] == f"bytes 10-109/{size}" and part.headers["content-length"] == "100"
    tail = client.get(f"/v1/videos/{video.id}", headers={"Range": "bytes=-16"})
    assert tail.status_code == 206 and tail.content == data[-16:]
    rest = client.get(f"/v1/videos/{video.id}", headers={"Range": f"bytes={size - 5}-"})
    assert rest.status_code == 206 and rest.content == data[-5:]
    past = client.get(f"/v1/videos/{video.id}", headers={"Range": f"bytes={size + 1}-"})
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{size}" and past.json()["detail"]
    assert client.get(f"/v1/videos/{video.id}", headers={"Range": "bytes=9-3"}).status_code == 200   # invalid: ignored
    assert client.get(f"/v1/videos/{video.id}", headers={"Range": "items=0-3"}).status_code == 200   # ignored
    assert client.get("/v1/videos/99").status_code == 404
    assert client.get("/v1/videos/-1").status_code == 422


def test_a_frame_of_a_video_and_the_openapi_document(video_client):
    client, _, videos = video_client
    red = next(v for v in videos if v.path.endswith("red.mp4"))
    frame = client.get(f"/v1/videos/{red.id}/frame", params={"t": 1.0})
    assert frame.status_code == 200 and frame.headers["content-type"] == "image/jpeg"
    assert Image.open(__import__("io").BytesIO(frame.content)).size == (64, 64)
    last = client.get(f"/v1/videos/{red.id}/frame", params={"t": 99})                # past its end: the last frame
    assert last.status_code == 200 and last.content != frame.content
    assert client.get(f"/v1/videos/{red.id}/frame", params={"t": -1}).status_code == 422
    assert client.get(f"/v1/videos/{red.id}/frame", params={"size": 99999}).status_code == 422
    paths = client.get("/openapi.json").json()["paths"]
    responses = paths["/v1/videos/{video_id}"]["get"]["responses"]
    assert {"200", "206", "416", "404"} <= set(responses)
    assert "Content-Range" in responses["206"]["headers"]
    assert "/v1/videos/{video_id}/frame" in paths
    hit = client.get("/openapi.json").json()["components"]["schemas"]["ImageHit"]["properties"]
    assert {"media", "video_id", "start", "end", "frame"} <= set(hit)


# --- the generated test set of benchmarks/video_retrieval.py ---------------------------------------------------

def _benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("video_retrieval",
                                                  Path(__file__).resolve().parents[1] / "benchmarks" /
                                                  "video_retrieval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_clips_hold_their_scenes_for_their_spans(tmp_path):
    bench = _benchmark()
    assert bench.tiou((0, 4), (2, 6)) == pytest.approx(2 / 6) and bench.tiou((0, 1), (2, 3)) == 0.0
    truth = bench.make_clips(tmp_path, clips=1, scenes_per_clip=2, fps=2, size=64, seed=3)
    (clip,) = truth
    first, second = clip["scenes"]
    assert first["start"] == 0 and first["end"] == second["start"] and second["end"] == clip["duration"]
    assert 3 <= first["end"] <= 7 and len(first["captions"]) == 5
    assert probe(clip["path"])["duration"] == pytest.approx(clip["duration"])
    from training.data.synth import random_scenes

    scene, _ = random_scenes(1, seed=5)[0]
    for offset in ((1.0, 1.0), (-1.0, -1.0)):                      # far beyond the frame: clamped inside it
        moved = bench.drift(scene, offset)
        assert all(o.radius - 1e-9 <= c <= 1 - o.radius + 1e-9 for o in moved.objects for c in (o.x, o.y))
        # the objects move together: their relative positions (the captions' relations) are kept
        deltas = {(round(m.x - o.x, 6), round(m.y - o.y, 6)) for m, o in zip(moved.objects, scene.objects)}
        assert len(deltas) == 1


def test_without_pyav_a_video_is_refused_with_a_reason_and_photos_still_load(tmp_path, monkeypatch):
    """An install without the ``av`` package: a video is a VideoError that names PyAV (a 415 on the service, not
    a 5xx), and the service's start-up import of the decoders only warns, so photos are still served."""
    import builtins

    from service import state

    path = write_video(tmp_path / "clip.mp4", list(_frames(4)))
    real_import = builtins.__import__

    def no_av(name, *args, **kwargs):
        if name == "av" or name.startswith("av."):
            raise ImportError("No module named 'av'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_av)
    with pytest.raises(VideoError, match="PyAV"):
        probe(path)
    state._import_decoders()   # warns, does not raise
