"""`jointspace index sync`: a folder's new files are added, changed ones embedded again, deleted ones removed, with
counts; a second run does nothing; excludes apply; a writer killed mid-sync leaves the previous index loadable."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from index.embed import embed_photos
from index.gallery import EmbedOptions, Gallery, sync
from index.generations import current_generation
from service.cli import main as cli_main
from training.models.checkpoint import load_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path)


def _photo(path: Path, seed: int, fmt="JPEG"):
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (40, 30), tuple(int(v) for v in rng.integers(0, 255, 3)))
    ImageDraw.Draw(image).ellipse(tuple(int(v) for v in sorted(rng.integers(0, 30, 2))) * 2,
                                  fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, fmt)
    return path


def _sync_cli(tiny_model_path, photos, out, capsys, *extra):
    rc = cli_main(["index", "sync", "--images", str(photos), "--index", str(out), "--model", str(tiny_model_path),
                   "--quiet", "--workers", "0", "--json", *extra])
    captured = capsys.readouterr()
    return rc, (json.loads(captured.out) if rc == 0 else None), captured.err


def _paths(out, model):
    g = Gallery.load(out, model=model)
    rows = {Path(r.path).relative_to(g.photos.root).as_posix(): r for r in g.meta.all_images()}
    assert sorted(g.images.ids().tolist()) == sorted(r.id for r in rows.values())   # FAISS and SQLite agree
    g.close()
    return rows


def test_sync_adds_changes_removes_and_is_idempotent(model, tiny_model_path, tmp_path, capsys):
    photos = tmp_path / "photos"
    for i, rel in enumerate(["a.jpg", "b.jpg", "trip/c.jpg", "trip/d.heic"]):
        _photo(photos / rel, i, "HEIF" if rel.endswith(".heic") else "JPEG")
    _photo(photos / ".thumbnails" / "t.jpg", 9)
    _photo(photos / "@eaDir" / "x.jpg", 10)
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                     "--quiet", "--workers", "0", "--no-querybank", "--tta", "none"]) == 0
    capsys.readouterr()
    before = _paths(out, model)
    assert sorted(before) == ["a.jpg", "b.jpg", "trip/c.jpg", "trip/d.heic"]     # default excludes

    # nothing changed: nothing done, no new generation
    gen = current_generation(out)
    rc, counts, _ = _sync_cli(tiny_model_path, photos, out, capsys)
    assert rc == 0 and counts == {"added": 0, "changed": 0, "removed": 0, "unchanged": 4, "skipped": 0,
                                  "links_outside": 0, "generation": gen}
    # add two, change one (new content), touch one (same content, new mtime), delete one, one corrupt new file
    _photo(photos / "new1.jpg", 20)
    _photo(photos / "trip" / "new2.avif", 21, "AVIF")
    _photo(photos / "b.jpg", 22)
    os.utime(photos / "a.jpg", (1e9, 1e9))
    (photos / "trip" / "c.jpg").unlink()
    (photos / "bad.jpg").write_bytes(b"\xff\xd8\xff garbage")
    rc, counts, err = _sync_cli(tiny_model_path, photos, out, capsys)
    assert rc == 0 and "bad.jpg" in err
    assert {k: counts[k] for k in ("added", "changed", "removed", "unchanged", "skipped")} == \
        {"added": 2, "changed": 1, "removed": 1, "unchanged": 2, "skipped": 1}
    assert counts["generation"] != gen
    after = _paths(out, model)
    assert sorted(after) == ["a.jpg", "b.jpg", "new1.jpg", "trip/d.heic", "trip/new2.avif"]
    assert after["a.jpg"].id == before["a.jpg"].id and after["trip/d.heic"].id == before["trip/d.heic"].id
    assert after["b.jpg"].id > max(r.id for r in before.values())        # re-embedded under a new id
    g = Gallery.load(out, model=model)
    own = embed_photos(model, [photos / "b.jpg"], progress=False, workers=0).vectors[0]
    assert np.allclose(g.images.reconstruct(after["b.jpg"].id), own, atol=1e-5)   # the new content's vector
    with pytest.raises(KeyError):
        g.images.reconstruct(before["b.jpg"].id)
    g.close()
    # idempotent: the second run does nothing (the corrupt file is listed again, the index is not touched)
    gen = current_generation(out)
    rc, counts, err = _sync_cli(tiny_model_path, photos, out, capsys)
    assert rc == 0 and counts["generation"] == gen and counts["unchanged"] == 5 and counts["skipped"] == 1
    assert counts["added"] == counts["changed"] == counts["removed"] == 0
    # an exclude pattern removes what it now rules out; images outside the folder are left alone
    outside = _photo(tmp_path / "elsewhere" / "o.jpg", 30)
    assert cli_main(["index", "add", "--index", str(out), "--model", str(tiny_model_path), str(outside.parent),
                     "--quiet", "--workers", "0"]) == 0
    capsys.readouterr()
    rc, counts, _ = _sync_cli(tiny_model_path, photos, out, capsys, "--exclude", "trip")
    assert rc == 0 and counts["removed"] == 2
    g = Gallery.load(out, model=model)
    assert sorted(Path(r.path).name for r in g.meta.all_images()) == ["a.jpg", "b.jpg", "new1.jpg", "o.jpg"]
    g.close()


def test_links_leaving_the_folder_are_skipped_and_listed_and_sync_stays_idempotent(model, tiny_model_path,
                                                                                     tmp_path, capsys):
    photos, elsewhere = tmp_path / "photos", tmp_path / "elsewhere"
    _photo(photos / "a.jpg", 0)
    _photo(photos / "sub" / "c.jpg", 1)
    secret = _photo(elsewhere / "secret.jpg", 2)
    _photo(elsewhere / "private" / "s.jpg", 3)
    (photos / "leak.jpg").symlink_to(secret)                          # a file outside
    (photos / "holidays").symlink_to(elsewhere / "private")             # a folder outside
    (photos / "deep").mkdir()
    (photos / "deep" / "up.jpg").symlink_to(Path("..") / ".." / "elsewhere" / "secret.jpg")   # relative, outside
    (photos / "alias.jpg").symlink_to(photos / "a.jpg")                 # a file inside: indexed once, as a.jpg
    (photos / "again").symlink_to(photos / "sub")                       # a folder inside: its files where they are
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                     "--quiet", "--workers", "0"]) == 0
    err = capsys.readouterr().err
    for link in ("leak.jpg", "holidays", "deep/up.jpg"):
        assert f"skipped {photos / link}: a symbolic link to " in err, err
    assert "3 symbolic link(s) leaving the folder skipped" in err and "alias.jpg" not in err
    rows = _paths(out, model)
    assert sorted(rows) == ["a.jpg", "sub/c.jpg"]                       # no target outside, no duplicate
    assert all(elsewhere not in Path(r.path).parents for r in rows.values())
    gen = current_generation(out)
    for _ in range(2):                                                  # every run: nothing to do, links listed
        rc, counts, err = _sync_cli(tiny_model_path, photos, out, capsys)
        assert rc == 0 and counts == {"added": 0, "changed": 0, "removed": 0, "unchanged": 2, "skipped": 0,
                                      "links_outside": 3, "generation": gen}, counts
        assert f"skipped {photos / 'leak.jpg'}" in err
    report = sync(out, model, photos, embedding=EmbedOptions(progress=False, workers=0))
    assert sorted(Path(link).name for link, _ in report.outside) == ["holidays", "leak.jpg", "up.jpg"]
    assert report.generation == gen and current_generation(out) == gen


def test_sync_errors_exit_2_with_a_message(tiny_model_path, tmp_path, capsys):
    rc, _, err = _sync_cli(tiny_model_path, tmp_path / "nowhere", tmp_path / "gallery", capsys)
    assert rc == 2 and "no image directory" in err
    (tmp_path / "photos").mkdir()
    rc, _, err = _sync_cli(tiny_model_path, tmp_path / "photos", tmp_path / "gallery", capsys)
    assert rc == 2 and "no jointspace index" in err


CRASH_SCRIPT = r"""
import os, signal, sys
import index.faiss_index as fi
from index.gallery import EmbedOptions, sync
from training.models.checkpoint import load_model

real_save = fi.VectorIndex.save
def save_then_die(self, path):
    real_save(self, path)
    with open(path, "r+b") as fh:           # a torn file in the temporary generation
        fh.truncate(10)
    os.kill(os.getpid(), signal.SIGKILL)
fi.VectorIndex.save = save_then_die
sync(sys.argv[1], load_model(sys.argv[2]), sys.argv[3], embedding=EmbedOptions(progress=False, workers=0))
"""


def test_sync_killed_mid_write_leaves_the_previous_index(model, tiny_model_path, tmp_path, capsys):
    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.jpg", i)
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                     "--quiet", "--workers", "0"]) == 0
    before = _paths(out, model)
    gen = current_generation(out)
    _photo(photos / "p3.jpg", 3)
    (photos / "p0.jpg").unlink()
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(out), str(tiny_model_path), str(photos)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert current_generation(out) == gen and _paths(out, model) == before      # the previous state, loadable
    report = sync(out, model, photos,
                  embedding=EmbedOptions(progress=False, workers=0))                 # the next sync completes it
    assert len(report.image_ids) == 1 and report.removed_images == 1
    assert sorted(_paths(out, model)) == ["p1.jpg", "p2.jpg", "p3.jpg"]
    assert not list(out.glob(".tmp-gen-*"))


def test_a_file_is_indexed_once_however_its_path_is_spelled(model, tiny_model_path, tmp_path, capsys,
                                                            monkeypatch):
    """`index add` knows a file by its resolved path: adding one the index holds adds nothing and says so (a
    relative, absolute, ./ or .. spelling, or a link to it); a changed one is embedded again in its place."""
    photos = tmp_path / "photos"
    for i, rel in enumerate(["a.jpg", "new/clock.jpg", "new/cup.jpg"]):
        _photo(photos / rel, i)
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                     "--quiet", "--workers", "0", "--no-querybank", "--tta", "none", "--exclude", "new"]) == 0
    capsys.readouterr()
    add = ["index", "add", "--index", str(out), "--model", str(tiny_model_path), "--quiet", "--workers", "0"]
    assert cli_main([*add, str(photos / "new")]) == 0
    assert capsys.readouterr().out.startswith(f"added 2 photos to {out} (")
    gen = current_generation(out)
    monkeypatch.chdir(photos / "new")
    (tmp_path / "link.jpg").symlink_to(photos / "new" / "clock.jpg")
    for spelled in ("clock.jpg", "./clock.jpg", "../new/clock.jpg", str(photos / "new" / "clock.jpg"),
                    str(tmp_path / "link.jpg")):
        assert cli_main([*add, spelled]) == 0, spelled
        captured = capsys.readouterr()
        assert captured.out == f"nothing added: 1 file given is in the index already, as it is; {out} is unchanged\n"
        assert f"already in the index, unchanged: {Path(spelled)}" in captured.err
        assert current_generation(out) == gen
    assert sorted(_paths(out, model)) == ["a.jpg", "new/clock.jpg", "new/cup.jpg"]
    # one already there, one new: the new one is added, the other said
    _photo(photos / "new" / "pen.jpg", 7)
    assert cli_main([*add, "clock.jpg", "pen.jpg", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["image_ids"]) == 1 and report["already"] == ["clock.jpg"] and report["replaced"] == 0
    # a changed file is embedded again in its place: one entry, a new id
    old_id = _paths(out, model)["new/clock.jpg"].id
    _photo(photos / "new" / "clock.jpg", 99)
    assert cli_main([*add, "clock.jpg"]) == 0
    assert "1 file changed since it was indexed: embedded again" in capsys.readouterr().out
    rows = _paths(out, model)
    assert sorted(rows) == ["a.jpg", "new/clock.jpg", "new/cup.jpg", "new/pen.jpg"] and rows["new/clock.jpg"].id != old_id


def test_sync_removes_the_doubles_an_older_index_holds(model, tiny_model_path, tmp_path, capsys):
    """An index written before files were known by their resolved path may hold one file twice (two ids, shown
    twice in results and as an "identical" duplicate group); `index sync` keeps one entry and says how many
    it removed."""
    from index.changes import ChangeSet, apply, live_target

    photos = tmp_path / "photos"
    for i, rel in enumerate(["a.jpg", "b.jpg", "c.jpg"]):
        _photo(photos / rel, i)
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--out", str(out),
                     "--quiet", "--workers", "0", "--no-querybank", "--tta", "none"]) == 0
    capsys.readouterr()
    first = _paths(out, model)["b.jpg"].id
    emb = embed_photos(model, [photos / "b.jpg"], workers=0, progress=False)     # b.jpg, a second time
    with live_target(out) as target:          # written as an older index did: no look at what it holds
        apply(target, ChangeSet(image_vectors=emb.vectors,
                                image_rows=[(str((photos / "b.jpg").resolve()), emb.info[0])]))
    g = Gallery.load(out, model=model)
    held = sorted(Path(r.path).name for r in g.meta.all_images())
    g.close()
    assert held == ["a.jpg", "b.jpg", "b.jpg", "c.jpg"]
    rc, counts, _ = _sync_cli(tiny_model_path, photos, out, capsys)
    assert rc == 0 and counts["doubles_removed"] == 1 and counts["added"] == counts["removed"] == 0
    rows = _paths(out, model)
    assert sorted(rows) == ["a.jpg", "b.jpg", "c.jpg"] and rows["b.jpg"].id == first      # the first entry kept
    rc, counts, _ = _sync_cli(tiny_model_path, photos, out, capsys)                       # and it stays so
    assert rc == 0 and "doubles_removed" not in counts and counts["unchanged"] == 3
    assert cli_main(["index", "sync", "--images", str(photos), "--index", str(out), "--model", str(tiny_model_path),
                     "--quiet", "--workers", "0"]) == 0
    assert capsys.readouterr().out == f"{out} already matches {photos}: 3 unchanged; nothing to change\n"


def test_two_writers_adding_one_file_leave_one_entry(model, tiny_model_path, tmp_path, capsys, monkeypatch):
    """`index add` reads the index before it embeds, without the writers' lock; a writer that added the same file
    meanwhile is seen under the lock: the file keeps one entry (the later writer's), never two."""
    import index.gallery as gallery

    photos = tmp_path / "photos"
    for i, rel in enumerate(["a.jpg", "new/b.jpg"]):
        _photo(photos / rel, i)
    out = tmp_path / "gallery"
    assert cli_main(["index", "build", "--model", str(tiny_model_path), "--images", str(photos), "--exclude", "new",
                     "--out", str(out), "--quiet", "--workers", "0", "--no-querybank", "--tta", "none"]) == 0
    add = ["index", "add", "--index", str(out), "--model", str(tiny_model_path), "--quiet", "--workers", "0"]
    assert cli_main([*add, str(photos / "new" / "b.jpg")]) == 0          # the other writer, first
    first = _paths(out, model)["new/b.jpg"].id
    monkeypatch.setattr(gallery, "_held", lambda root: ({}, {}))   # this one read the index before it did
    assert cli_main([*add, str(photos / "new" / "b.jpg")]) == 0
    capsys.readouterr()
    rows = _paths(out, model)
    assert sorted(rows) == ["a.jpg", "new/b.jpg"] and rows["new/b.jpg"].id != first


def test_build_takes_one_photo_or_a_listing_and_says_what_else_it_cannot_read(tiny_model_path, tmp_path, capsys):
    photo = _photo(tmp_path / "one.jpg", 1)
    out = tmp_path / "gallery"
    build = ["index", "build", "--model", str(tiny_model_path), "--out", str(out), "--quiet", "--workers", "0",
             "--no-querybank", "--tta", "none", "--images"]
    assert cli_main([*build, str(photo)]) == 0
    assert capsys.readouterr().out.startswith("indexed 1 image and 0 captions")
    (tmp_path / "list.txt").write_text("one.jpg\n")
    assert cli_main([*build, str(tmp_path / "list.txt")]) == 0
    assert capsys.readouterr().out.startswith("indexed 1 image and 0 captions")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00 not text, not an image")
    assert cli_main([*build, str(tmp_path / "blob.bin")]) == 2
    assert f"{tmp_path / 'blob.bin'} is not a UTF-8 text file" in capsys.readouterr().err
