"""The person discount: which queries name a person (training/inference/person_words.py), the concept head's a(x) and its
fit (training/models/concepts.py, training/fit_concepts.py), and the discount inside the index (index/people.py):
a text query that names a person loses λ · a(x) on each photo, any other query nothing, in every search path."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from index import people
from index.changes import BuildOptions, ChangeSet, ModelFacts
from index.gallery import Gallery, build_from_vectors, update
from index.generations import current_generation
from index.qbnorm import QueryBank
from training.config import build_config
from training.data.vocab import Vocabulary
from training.fit_concepts import fit
from training.inference.embedding import embed_pixels, person_discount
from training.inference.person_words import names_person
from training.models.checkpoint import load_model, save_model
from training.models.model import build_model

FP = "e" * 64
DIM = 16
NAMES = [f"thing{i}" for i in range(1000)]


def _unit(n, seed, dim=DIM):
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_query_names_a_person_by_its_words():
    for text in ("a person", "People on a beach", "a man with a camera", "two girls play", "a smiling woman",
                 "an astronaut poses for a portrait", "she rides a bike", "a selfie", "a smiling face"):
        assert names_person(text), text
    for text in ("a CD player", "yellow lady's slipper", "a boxer dog", "a red brick wall", "manhole cover",
                 "a photo of a groomed poodle", "xqzv"):
        assert not names_person(text), text


def test_wordnet_nouns_for_a_person_count_and_their_plurals():
    # training/inference/person_nouns.txt: WordNet 3.0's noun.person words whose main sense is a person
    for text in ("a pilot", "two scientists", "an engineer at work", "a skateboarder on a ramp", "firefighters",
                 "businessmen", "a grandmother", "hikers on a trail", "a man in a cowboy hat", "a baseball player",
                 "two soccer players on a field"):
        assert names_person(text), text
    for text in ("a monarch butterfly", "a pitcher of water", "a king penguin", "a Granny Smith apple",
                 "a general view of the city", "a private beach", "the dog chased a ball",
                 "a loudspeaker and a speaker", "tent poles", "a walker", "a baby bib", "a kite (bird of prey)",
                 "a King Charles Spaniel", "a record player", "a whale", "a car's hood", "a dragon", "a mermaid",
                 "a monster truck", "an angel", "a pair of pliers", "fans in the bleachers", "primates in a tree",
                 "a primate in a zoo"):
        assert not names_person(text), text


def test_wordnet_nouns_for_a_thing_that_hold_a_person_word_do_not_count_but_the_word_elsewhere_does():
    # WordNet's several-word nouns for a thing one photographs ("pilot whale", an animal; "sister ship", an artifact)
    for text in ("a pilot whale", "a worker bee in a flower", "a sister ship in the harbour", "a blue whale",
                 "a baby carriage", "a guy wire", "pilot whales", "worker bees", "two king penguins"):
        assert not names_person(text), text
    # ... a person noun among them stays one (not a thing), the body is a person's, and the word outside the phrase
    for text in ("a police officer", "a baby boy", "a human body", "a pilot next to a pilot whale",
                 "a pilot whale and its pilot", "pilot whales and pilots"):
        assert names_person(text), text


def test_a_group_of_people_counts_unless_of_names_its_members():
    # person_words.GROUP_WORDS: a couple, a team, a crowd, a family, an audience are people ...
    for text in ("a couple kisses on the street", "two couples pose", "a football team", "two soccer teams compete",
                 "a crowd at a concert", "a family poses", "a family of four", "a family of 7 poses",
                 "an audience claps", "a crowd of people", "a couple of tourists", "firemen at a fire",
                 "a fireman sprays water"):
        assert names_person(text), text
    # ... unless "of" says what the group is of (a person word there still counts), or it names a thing
    for text in ("a couple of apples", "a family of ducks", "a team of dogs", "a crowd of pigeons",
                 "the rose family", "a family room", "the team's bus", "a couplet"):
        assert not names_person(text), text


def test_the_wordnet_nouns_carry_wordnets_licence_and_load():
    from training.inference.person_words import NOUNS_FILE, _lexicon

    text = NOUNS_FILE.read_text()
    assert "WordNet 3.0 Copyright 2006 by Princeton University" in text
    words, people, things = _lexicon()
    assert len(words) > 4000 and {"pilot", "scientist", "man"} <= words and "monarch" not in words
    assert people is not None and people.search("tennis players") and not people.search("a player")
    assert "king penguin" in things["king"] and "pilot whale" in things["pilot"] and "penguin" not in things


def _index(root, discount, bank=None, n=40):
    vectors, a = _unit(n, 0), np.tile(np.array([0.0, 1.0, 0.5, 0.0], np.float32), n // 4)
    build_from_vectors(root, ModelFacts(FP, "cosine", person_discount=discount), ChangeSet(
        image_vectors=vectors, image_unfamiliarity=a, image_ids=np.arange(n),
        image_rows=[(f"/p/{i}.jpg", None) for i in range(n)],
        caption_vectors=_unit(6, 9), captions=[(f"caption {i}", None) for i in range(6)]),
        BuildOptions(factory="Flat", querybank=bank))
    return vectors, a


def _scores(hits):
    return {i: s for i, s in hits}


def test_a_person_query_loses_lambda_times_a_on_each_photo_and_no_other_query_does(tmp_path):
    root = tmp_path / "index"
    vectors, a = _index(root, 0.2)
    manifest = json.loads((root / current_generation(root) / "manifest.json").read_text())
    assert manifest["people"] == {"discount": 0.2} and manifest["dim"] == DIM
    gallery = Gallery.load(root)
    assert gallery.images.dim == DIM + 1 and gallery.captions.dim == DIM      # [v, −λ a]; captions as they are
    gallery.close()
    q = _unit(2, 5)
    flagged = people.text_queries(q, ["a person", "a red car"])
    assert flagged.shape == (2, DIM + 1) and flagged[:, -1].tolist() == [1.0, 0.0]
    gallery = Gallery.load(root)
    try:
        person, car = (_scores(h) for h in gallery.search_images(flagged, 40))
        photo = _scores(gallery.search_images(q, 40)[0])          # a query without the flag (a photo): P = 0
        for i in range(40):
            assert person[i] == pytest.approx(float(q[0] @ vectors[i]) - 0.2 * a[i], abs=1e-5)
            assert car[i] == pytest.approx(float(q[1] @ vectors[i]), abs=1e-5)
            assert photo[i] == pytest.approx(float(q[0] @ vectors[i]), abs=1e-5)
        np.testing.assert_allclose(gallery.image_vector(1), vectors[1], atol=1e-6)     # the embedding alone
        first = gallery.search_images(flagged[:1], 5)[0]
        assert [i for i, _ in first] == sorted(person, key=lambda i: -person[i])[:5]   # ranked by the discount
        with pytest.raises(ValueError, match="dimensions"):
            gallery.search_images(np.zeros((1, DIM + 2), np.float32), 3)
    finally:
        gallery.close()
    # photos added later carry their a(x); photos added without one (a model's older embeddings): a = 0
    new = _unit(2, 7)
    update(root, FP, ChangeSet(image_vectors=new, image_unfamiliarity=np.array([1.0, 0.0], np.float32),
                               image_rows=[("/q/0.jpg", None), ("/q/1.jpg", None)]))
    update(root, FP, ChangeSet(image_vectors=new[:1], image_rows=[("/q/2.jpg", None)]))
    gallery = Gallery.load(root)
    try:
        person = _scores(gallery.search_images(flagged[:1], 43)[0])
        assert person[40] == pytest.approx(float(q[0] @ new[0]) - 0.2, abs=1e-5)
        assert person[41] == pytest.approx(float(q[0] @ new[1]), abs=1e-5)
        assert person[42] == pytest.approx(float(q[0] @ new[0]), abs=1e-5)
    finally:
        gallery.close()
    with pytest.raises(ValueError, match="unfamiliarities"):
        update(root, FP, ChangeSet(image_vectors=new, image_unfamiliarity=np.zeros(3, np.float32),
                                   image_rows=[("/r/0.jpg", None), ("/r/1.jpg", None)]))


def test_the_discount_stacks_on_the_query_bank_offset_and_keeps_relevance(tmp_path):
    root = tmp_path / "index"
    bank = QueryBank(captions=_unit(50, 11), images=_unit(50, 12))
    vectors, a = _index(root, 0.3, bank=bank)
    q = _unit(1, 5)
    gallery = Gallery.load(root)
    try:
        plain = _scores(gallery.search_images(q, 40)[0])                 # q · v − o
        person = _scores(gallery.search_images(people.text_queries(q, ["a man"]), 40)[0])
        for i in range(40):
            assert person[i] == pytest.approx(plain[i] - 0.3 * a[i], abs=1e-5)
        np.testing.assert_allclose(gallery.image_vector(2), vectors[2], atol=1e-6)
        flagged = people.text_queries(q, ["a man"])
        ranking = gallery.ranked("images", flagged, gallery.search_images(flagged, 5))[0]
        assert len(ranking.hits) == 5
    finally:
        gallery.close()


def test_an_index_without_the_discount_reads_a_person_flag_as_nothing(tmp_path):
    root = tmp_path / "index"
    vectors, _ = _index(root, 0.0)
    manifest = json.loads((root / current_generation(root) / "manifest.json").read_text())
    assert "people" not in manifest
    q = _unit(1, 5)
    gallery = Gallery.load(root)
    try:
        assert gallery.images.dim == DIM
        assert gallery.search_images(people.text_queries(q, ["a person"]), 40) == gallery.search_images(q, 40)
    finally:
        gallery.close()


def _config(discount):
    return build_config({"image": {"backbone": "efficientnet_lite0", "image_size": 64, "resize": 64},
                         "text": {"encoder": "gru", "word_dim": 16, "hidden": 32}, "model": {"embed_dim": 32},
                         "concepts": {"enabled": True, "prototypes": 8, "person_discount": discount,
                                      "familiar_dims": 24, "familiar_neighbours": 3}})


def test_the_head_fits_t0_and_gives_a_near_one_only_far_from_every_training_photo(tmp_path):
    torch.manual_seed(0)
    model = build_model(_config(0.2), Vocabulary.build(["a man", "a dog"])).eval()
    g = torch.Generator().manual_seed(0)
    centres = F.normalize(torch.randn(7, model.feature_dim, generator=g), dim=-1)   # 7: not every 6th photo's
    feats = centres[torch.arange(90) % 7] + 0.005 * torch.randn(90, model.feature_dim, generator=g)
    report = fit(model, feats, log=lambda *_: None, names=NAMES)
    head = model.concepts
    assert report["familiar_photos"] == 90 and report["familiar_dims"] == 24
    assert head.familiar_photos.shape == (90, 24) and head.familiar_photos.dtype == torch.float16
    near = feats[1:4]                         # training photos (not held out): their nearest is themselves
    far = torch.randn(3, model.feature_dim, generator=g)               # like none of the training photos
    with torch.no_grad():
        assert bool((head.unfamiliarity(near) < 0.5).all()) and bool((head.unfamiliarity(far) > 0.99).all())
        t = head.familiarity(near)
        t0, tau, _ = head.familiar_gate
        assert float(t0) == pytest.approx(report["familiar_t0"]) and float(tau) == pytest.approx(0.005)
        torch.testing.assert_close(head.unfamiliarity(near), torch.sigmoid((t0 - t) / tau))
        # t(x) as written: the mean of the m largest cosines in the kept components
        reduced = F.normalize(near, dim=-1) @ head.familiar_basis.float()
        want = (reduced @ head.familiar_photos.float().t()).topk(3).values.mean(-1)
        torch.testing.assert_close(t, want)
    assert person_discount(model) == pytest.approx(0.2)
    # saved and loaded: the number of photos kept is the fit's
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.concepts.unfamiliarity(far), head.unfamiliarity(far))
    assert loaded.concepts.familiar_photos.shape == (90, 24)


def test_embed_pixels_gives_a_after_the_embedding_only_when_asked_and_only_with_a_discount():
    torch.manual_seed(0)
    model = build_model(_config(0.2), Vocabulary.build(["a man", "a dog"])).eval()
    feats = torch.rand(40, model.feature_dim, generator=torch.Generator().manual_seed(1))
    fit(model, feats, log=lambda *_: None, names=NAMES)
    pixels = torch.randint(0, 255, (3, 1, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    both = embed_pixels(model, pixels, unfamiliarity=True)
    alone = embed_pixels(model, pixels)
    assert both.shape == (3, 33) and alone.shape == (3, 32)
    torch.testing.assert_close(both[:, :32], alone)
    assert bool(((both[:, 32] >= 0) & (both[:, 32] <= 1)).all())
    plain = build_model(_config(0.0), Vocabulary.build(["a man", "a dog"])).eval()
    assert person_discount(plain) == 0.0 and "concepts.familiar_photos" not in plain.state_dict()
    with pytest.raises(ValueError, match="person discount"):
        embed_pixels(plain, pixels, unfamiliarity=True)


def test_the_service_engine_and_the_text_search_discount_person_queries_alike(tiny_model_path, tmp_path):
    from index.hybrid import TextPaging, search_text
    from service.engine import Engine, Options

    model = load_model(tiny_model_path).eval()
    dim = model.cfg.model.embed_dim
    vectors = _unit(12, 3, dim=dim)
    a = np.array([1.0, 0.0] * 6, np.float32)
    root = tmp_path / "index"
    build_from_vectors(root, ModelFacts(model.fingerprint, "cosine", person_discount=0.25), ChangeSet(
        image_vectors=vectors, image_unfamiliarity=a, image_ids=np.arange(12),
        image_rows=[(f"/p/{i}.jpg", None) for i in range(12)], caption_vectors=_unit(3, 4, dim=dim),
        captions=[(f"caption {i}", None) for i in range(3)]), BuildOptions(factory="Flat"))
    gallery = Gallery.load(root, model=model)
    try:
        engine = Engine(model, gallery)
        texts = ["a person", "a red circle"]
        q = engine.embed_texts(texts)
        want = [q[0] @ vectors.T - 0.25 * a, q[1] @ vectors.T]
        served = engine.search_texts([(texts[0], 12), (texts[1], 12), (texts[0], Options(k=12, mode="hybrid"))])
        for ranking, w in zip(served, want + want[:1]):
            got = dict(ranking.hits)
            assert sorted(got) == list(range(12))
            np.testing.assert_allclose([got[i] for i in range(12)], w, atol=1e-5)
        terminal = search_text(gallery, q[:1], texts[0], "vector", TextPaging(k=12))     # jointspace index search
        np.testing.assert_allclose([dict(terminal.hits)[i] for i in range(12)], want[0], atol=1e-5)
    finally:
        gallery.close()


def test_a_video_moments_a_is_the_mean_of_its_frames(tmp_path):
    from PIL import Image

    from index.moments import Sampling
    from index.video_decode import sample_frames
    from index.video_embed import embed_videos
    from index.video_writer import write_video

    torch.manual_seed(0)
    model = build_model(_config(0.2), Vocabulary.build(["a man", "a dog"])).eval()
    fit(model, torch.rand(40, model.feature_dim, generator=torch.Generator().manual_seed(1)), log=lambda *_: None,
        names=NAMES)
    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)) for _ in range(8)]
    clip = write_video(tmp_path / "c.mkv", frames, fps=2)
    emb = embed_videos(model, [clip], Sampling(rate=1.0, window=2.0), workers=0, progress=False)
    pixels = torch.stack([model.preprocess.pixels(im) for _, im in sample_frames(clip, rate=1.0)])
    a = embed_pixels(model, pixels, unfamiliarity=True)[:, -1].numpy()
    spans = [s.frames for s in emb.segments[0]]
    assert len(spans) >= 2 and emb.segment_vectors[0].shape[1] == 32
    np.testing.assert_allclose(emb.moment_unfamiliarity(), [a[lo:hi].mean() for lo, hi in spans], atol=1e-5)


def test_an_ensembles_discount_is_its_members_weighted_as_its_score_weighs_them():
    """An ensemble scores Σ w_i² cos_i / Σ w_i²; its person discount λ · a(x) is the same mean of its members'
    λ_i · a_i(x), so a photo unlike every training photo loses on a person query as the members would make it."""
    from training.models.ensemble import EnsembleEmbedding

    members = []
    for seed, discount in ((0, 0.2), (1, 0.1)):
        torch.manual_seed(seed)
        member = build_model(_config(discount), Vocabulary.build(["a man", "a dog"])).eval()
        fit(member, torch.rand(40, member.feature_dim, generator=torch.Generator().manual_seed(seed)),
            log=lambda *_: None, names=NAMES)
        members.append(member)
    weights = (1.0, 2.0)
    ensemble = EnsembleEmbedding(members, weights, ["a", "b"]).eval()
    assert person_discount(ensemble) == pytest.approx((1 * 0.2 + 4 * 0.1) / 5)
    feats = torch.cat([torch.rand(6, m.feature_dim, generator=torch.Generator().manual_seed(3)) for m in members], 1)
    feats[:3] = torch.randn(3, feats.shape[1], generator=torch.Generator().manual_seed(4))    # like no training photo
    with torch.no_grad():
        a = [m.unfamiliarity(p) for m, p in zip(members, feats.split([m.feature_dim for m in members], 1))]
        got = ensemble.unfamiliarity(feats)
    torch.testing.assert_close(person_discount(ensemble) * got, (1 * 0.2 * a[0] + 4 * 0.1 * a[1]) / 5)
    assert bool((got[:3] > 0.9).all()) and bool(((got >= 0) & (got <= 1)).all())
    pixels = torch.randint(0, 255, (2, 1, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    assert embed_pixels(ensemble, pixels, unfamiliarity=True).shape == (2, 65)       # the index can store it
    plain = EnsembleEmbedding([build_model(_config(0.0), Vocabulary.build(["a man"])).eval() for _ in range(2)],
                              [1.0, 1.0], ["a", "b"])
    assert person_discount(plain) == 0.0 and bool((plain.unfamiliarity(feats) == 0).all())
