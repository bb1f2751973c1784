"""The shipped real-photo model: a slim file that loads offline from the installed packages, is the model the
docs report, and is what `index build` and `serve` use without --model; the demo's sample photos."""
import json
from pathlib import Path

import pytest
import torch

from benchmarks.open_vocab import demo_absent
from index.gallery import Gallery
from index.query import ImageFilter, format_time
from index.relevance import NULL_COUNT, STRONG
from index.samples import CAPTIONS, CLIPS, NEAR_DUPLICATE, SAMPLES, write_samples
from service.cli import main as cli_main
from training.inference import pretrained
from training.inference.embedding import embed_texts
from training.models.checkpoint import load_checkpoint, load_model
from training.models.concepts import class_aliases

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shipped():
    return load_model(pretrained.model_path())


def test_the_shipped_file_is_small_slim_and_the_reported_model(shipped):
    path = pretrained.model_path()
    # float16 trained tensors only: MiniLM's top 4 layers, GPO, both projections and the fitted concept head (the
    # classifiers it reads come from the weight packages, as the backbones do)
    assert path.stat().st_size <= 50 * 1024 ** 2
    assert shipped.concepts is not None and bool(shipped.concepts.fitted)
    payload = load_checkpoint(path)
    assert payload["slim"]["omitted"] > 0 and not any(k.startswith("backbone.") for k in payload["state_dict"])
    assert shipped.cfg.name == "flickr8k" and shipped.cfg.text.encoder == "minilm"
    # the dev R-sum it was selected with is the shipped row of the results the docs are generated from
    rows = json.loads((REPO / "benchmarks" / "results" / "flickr8k_dev.json").read_text())["rows"]
    row = next(r for r in rows if r["name"] == "flickr8k (shipped)")
    assert payload["extra"]["val"]["rsum"] == pytest.approx(row["rsum"], abs=0.05)
    with pytest.raises(ValueError, match="no shipped model 'nope'"):
        pretrained.model_path("nope")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's sample photos and clips, indexed by `index build` with its defaults (the shipped model)."""
    root = tmp_path_factory.mktemp("demo")
    out = write_samples(root / "samples")
    index = root / "index"
    assert cli_main(["index", "build", "--images", str(out), "--captions", str(root / "samples" / "captions.txt"),
                     "--out", str(index), "--quiet", "--workers", "0"]) == 0
    return out, index


def test_the_demo_holds_one_near_duplicate_pair(demo, capsys):
    """The demo's resized, recompressed copy of one photo is its one group of near-duplicates (so the page's
    Duplicates view has something to show): the photo and its smaller re-save."""
    _, index = demo
    capsys.readouterr()
    assert cli_main(["index", "duplicates", "--index", str(index), "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert [sorted(Path(i["path"]).name for i in g["images"]) for g in groups] == \
        [sorted([NEAR_DUPLICATE.source, NEAR_DUPLICATE.name])]
    assert groups[0]["kind"] in ("re-encode", "near")


def test_index_build_and_search_use_the_shipped_model_by_default(shipped, demo, capsys):
    out, index = demo
    photos = [s.name for s in SAMPLES] + [NEAR_DUPLICATE.name]       # with the near-duplicate copy
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == sorted(photos)
    assert f"`{NEAR_DUPLICATE.name}`" in (out.parent / "ATTRIBUTION.md").read_text()
    assert sorted(p.name for p in (out / "videos").iterdir()) == sorted(clip.name for clip in CLIPS)
    assert (out.parent / "ATTRIBUTION.md").read_text().count("CC") >= 3
    gallery = Gallery.load(index, model=shipped)                      # built with exactly the shipped model
    scenes = sum(len(clip.scenes) for clip in CLIPS)                  # one 5-second moment per scene
    assert gallery.images.ntotal == len(photos) + scenes and gallery.meta.counts()["videos"] == len(CLIPS)
    # each sample is dated as recorded with it (EXIF of a photo, the file's time of a clip), not by the copy
    taken = {Path(r.path).name: format_time(r.taken) for r in gallery.meta.all_images() if r.video_id is None}
    taken |= {Path(v.path).name: format_time(v.taken) for v in gallery.meta.all_videos()}
    recorded = {s.name: s.taken for s in SAMPLES} | {c.name: c.taken for c in CLIPS} | \
        {NEAR_DUPLICATE.name: NEAR_DUPLICATE.taken}
    assert taken == {name: f"{t[:10].replace(':', '-')}T{t[11:]}Z" for name, t in recorded.items()}
    capsys.readouterr()
    assert cli_main(["index", "search", "--index", str(index), "--text", "a man with a camera", "--k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["results"]
    assert Path(hits[0]["path"]).name == "cameraman.jpg" and len(hits) == 3
    # the page's placeholder and the README's examples find their photo first (the concept head: the backbones'
    # ImageNet classes "espresso" and "missile" in the common space)
    for text, want in {"a cup of coffee": "coffee.jpg", "a rocket": "rocket.jpg"}.items():
        capsys.readouterr()
        assert cli_main(["index", "search", "--index", str(index), "--text", text, "--k", "1", "--media", "photo",
                         "--json"]) == 0
        assert Path(json.loads(capsys.readouterr().out)["results"][0]["path"]).name == want, text
    # newest first lists what the query describes by date, not the whole gallery: the relevance cut (strong
    # matches, index/relevance.py) comes first, so cat.jpg is on the first page; min_score chooses the cut instead
    capsys.readouterr()
    assert cli_main(["index", "search", "--index", str(index), "--text", "a cat", "--sort", "newest", "--json"]) == 0
    newest = json.loads(capsys.readouterr().out)
    assert "cat.jpg" in [Path(r["path"]).name for r in newest["results"]] and newest["strong_match"] is True
    assert all(r["relevance"] >= STRONG for r in newest["results"])
    times = [r["taken"] for r in newest["results"]]
    assert times == sorted(times, reverse=True)
    assert cli_main(["index", "search", "--index", str(index), "--text", "a cat", "--sort", "newest", "--min-score",
                     "-1", "--k", "50", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == gallery.images.ntotal      # every one, by date
    placeholder = (REPO / "service" / "static" / "index.html").read_text()
    assert 'placeholder="a cup of coffee"' in placeholder
    # a real model, not random weights: each query's photo is in its top 3 far more often than chance (3 of 14).
    # (measured with the shipped file: docs/benchmarks.md#open-vocabulary has the demo's captions, photo by photo)
    queries = {"a cat": "cat.jpg", "a cat looking at the camera": "cat.jpg", "a cup of coffee": "coffee.jpg",
               "a rocket launch": "rocket.jpg", "an astronaut": "astronaut.jpg", "a woman smiling": "astronaut.jpg",
               "a flower": "flower.jpg", "a temple": "temple.jpg", "a man with a camera": "cameraman.jpg",
               "stars in the night sky": "galaxies.jpg", "a brick wall": "brick_wall.jpg", "coins": "coins.jpg",
               "grass": "grass.jpg", "a clock": "clock.jpg"}
    found = 0
    for text, want in queries.items():
        top = [Path(gallery.meta.image(i).path).name for i, _ in
               gallery.search_images(embed_texts(shipped, [text]).numpy(), 3)[0]]
        found += want in top
    assert found >= 8, found
    # the clips' moments: the scene of the photo a sentence describes is the best video moment (measured with the
    # shipped file; other scenes, e.g. the rocket's, lose to a hub such as the flower)
    moments = {"a cat": ("at_home.mp4", 0.0), "a pink flower": ("at_home.mp4", 10.0),
               "stars in the night sky": ("space.mp4", 10.0)}
    for text, (clip, start) in moments.items():
        capsys.readouterr()
        assert cli_main(["index", "search", "--index", str(index), "--text", text, "--k", "1", "--media", "video", "--json"]) == 0
        best = json.loads(capsys.readouterr().out)["results"][0]
        assert (Path(best["path"]).name, best["start"], best["end"]) == (clip, start, start + 5.0), text
    gallery.close()


def test_relevance_on_the_demo_says_no_to_nonsense_and_yes_to_its_captions(shipped, demo):
    # index/relevance.py: the shipped model's bank gives the image side its reference and null sentences; measured
    # with the shipped file (benchmarks/relevance_margins.py, docs/index.md#relevance-and-no-strong-match): 18 of the
    # 20 captions strong (not the two astronaut captions); of the 127 queries of things no photo shows the settings
    # were chosen on, absent things and nonsense, 10 on this gallery, which holds the near-duplicate copy (9 without
    # it), none of the 12 of nonsense_queries.txt; of the 45 of the unseen set, 10 (9 without it); of the 50 of the
    # holdout set, written after the settings were fixed, 8 (7 without it; the 9th 0.003 short), none of its 10
    # nonsense strings
    _, index = demo
    gallery = Gallery.load(index, model=shipped)
    assert gallery.manifest["querybank"]["references"] == {"images": 1000, "captions": 1000, "sentences": 1000,
                                                           "nulls": NULL_COUNT, "aliases": len(class_aliases())}
    photos = ImageFilter(media="photo")

    def strong(texts: list[str]) -> list[bool]:
        queries = embed_texts(shipped, texts).numpy()
        return [bool(r.strong_match) for r in gallery.ranked("images", queries,
                                                              gallery.search_images(queries, 10, flt=photos))]

    data = REPO / "benchmarks" / "data"
    nonsense = (data / "nonsense_queries.txt").read_text().splitlines()
    assert not any(strong(nonsense))
    absent = [*demo_absent(), *(data / "absent_queries_demo.txt").read_text().splitlines(), *nonsense,
              *(data / "absent_queries_check.txt").read_text().splitlines()]
    assert sum(strong(absent)) <= len(absent) // 10
    # the unseen set, written before any setting was chosen with it in view: 10 of its 45
    unseen = (data / "absent_queries_unseen.txt").read_text().splitlines()
    assert sum(strong(unseen)) <= len(unseen) // 4
    holdout = (data / "absent_queries_holdout.txt").read_text().splitlines()
    said = strong(holdout)
    assert sum(said) <= len(holdout) // 5 and not any(said[40:])    # its last 10: nonsense
    captions = strong(CAPTIONS.splitlines()[:20])                    # each of a sample photo (open_vocab.py)
    assert all(captions[2:])                                         # 0, 1: the astronaut's
    assert strong(["a cat", "a cup of coffee", "a rocket", "a clock on a wall"]) == [True] * 4
    assert strong(["a giraffe", "xqzv"]) == [False, False]
    # the name term: each names a class the hit's best names do not carry (the page of text, the coins, the gravel)
    assert strong(["a penguin", "a goldfish in a bowl", "a jellyfish"]) == [False] * 3
    # ... and so does a query naming a class by another of its names ("porcupine, hedgehog"; "barrow, ...,
    # wheelbarrow"), on the gravel and the flower
    assert strong(["a hedgehog", "a wheelbarrow"]) == [False] * 2
    gallery.close()


def test_shipped_model_embeds_text_and_pixels_deterministically(shipped):
    a = embed_texts(shipped, ["a dog runs on the beach"])
    assert a.shape == (1, 1024) and torch.allclose(a.norm(dim=-1), torch.ones(1), atol=1e-5)
    torch.testing.assert_close(embed_texts(shipped, ["a dog runs on the beach"]), a)
