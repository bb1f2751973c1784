"""The concept head (training/models/concepts.py: ConSE eq. 1 with a typicality gate) and its fit
(training/fit_concepts.py): the fusion as written, the gate's direction, identity until fitted, the config rules,
save and reload, and the command that fits a trained model."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from index.embed import embed_sentences
from index.qbnorm import model_bank
from service.cli import main as cli_main
from training.fit_concepts import fit, spherical_kmeans, with_concepts
from training.config import build_config
from training.data.vocab import Vocabulary
from training.inference.embedding import embed_texts
from training.inference.querybank import carried
from training.models.checkpoint import load_checkpoint, load_model, save_model, save_slim
from training.models.concepts import class_aliases, class_names, naming_sources
from training.models.config_schema import ConfigError
from training.models.model import build_model

from conftest import tiny_config

NAMES = [f"thing{i}" for i in range(1000)]


def lite0_config(**concepts):
    return build_config({"image": {"backbone": "efficientnet_lite0", "image_size": 64, "resize": 64},
                         "text": {"encoder": "gru", "word_dim": 16, "hidden": 32}, "model": {"embed_dim": 32},
                         "concepts": {"enabled": True, "prototypes": 8, "bank_template": "a {}", **concepts}})


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(lite0_config(), Vocabulary.build(["a dog runs on grass", "a cat"])).eval()


def fitted(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(60, model.feature_dim, generator=g)
    fit(model, feats, log=lambda *_: None, names=NAMES)
    return feats


def test_unfitted_head_is_the_identity(model):
    plain = build_model(lite0_config(enabled=False), model.vocab)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("concepts.")})
    plain.eval()
    fresh = with_concepts(plain, {"prototypes": 8})
    feats = torch.rand(3, plain.feature_dim)
    with torch.no_grad():
        torch.testing.assert_close(fresh.embed_features(feats), plain.embed_features(feats))


def test_fused_embedding_is_conse_eq1_added_by_the_gate(model):
    feats = fitted(model)
    head = model.concepts
    x = feats[:4] * 3
    with torch.no_grad():
        probs = F.softmax(head.classifiers[0](x) / head.cfg.class_temperature, dim=-1)   # one backbone: its own
        top = probs.topk(head.cfg.top_k)
        c = (top.values[..., None] * head.class_embeddings[top.indices]).sum(1) / top.values.sum(-1, keepdim=True)
        r = (F.normalize(x, dim=-1) @ head.prototypes.t()).topk(head.cfg.neighbours).values.mean(-1)
        r0, tau = head.gate
        g = head.cfg.weight * torch.sigmoid((r0 - r) / tau)
        unit = F.normalize(model.image_proj(x), dim=-1)
        expected = F.normalize(unit + g[:, None] * c, dim=-1)
        torch.testing.assert_close(model.embed_features(x), expected)
    assert bool(head.fitted) and head.class_embeddings.norm(dim=-1).sub(1).abs().max() < 1e-5


def test_gate_opens_for_photos_unlike_the_training_photos(model):
    feats = fitted(model)
    head = model.concepts
    typical = head.prototypes[:3] * 5                      # on a prototype: r = 1
    unlike = torch.zeros(3, model.feature_dim)
    unlike[:, :7] = 1.0                                    # a direction no training photo has
    with torch.no_grad():
        g_typical, g_unlike = head.gate_weights(typical), head.gate_weights(unlike)
        r_held = head.typicality(feats[::6])
    assert (g_typical < 0.05 * head.cfg.weight).all()
    assert (g_unlike > 0.95 * head.cfg.weight).all()
    # r₀ is the configured quantile of the held-out photos' typicality
    assert float(head.gate[0]) == pytest.approx(float(torch.quantile(r_held, head.cfg.quantile)), abs=1e-5)


def test_spherical_kmeans_finds_separated_clusters():
    g = torch.Generator().manual_seed(1)
    centres = F.normalize(torch.randn(4, 16, generator=g), dim=-1)
    points = torch.cat([c + 0.01 * torch.randn(25, 16, generator=g) for c in centres])
    found = spherical_kmeans(points, 4, seed=0)
    assert (found @ centres.t()).max(0).values.min() > 0.99


def test_fit_refuses_too_few_photos_and_wrong_widths(model):
    with pytest.raises(ValueError, match="concepts.prototypes"):
        fit(model, torch.rand(9, model.feature_dim), log=lambda *_: None, names=NAMES)
    with pytest.raises(ValueError, match="backbone features"):
        fit(model, torch.rand(60, 7), log=lambda *_: None, names=NAMES)


def test_config_rules_name_what_is_wrong():
    with pytest.raises(ConfigError, match="concepts.wieght"):
        build_config({"concepts": {"wieght": 0.5}})
    with pytest.raises(ConfigError, match="concepts.enabled needs"):
        build_config({"image": {"backbone": "efficientnet_lite0"}, "decoder": {"enabled": True},
                      "concepts": {"enabled": True}})
    cfg = tiny_config(concepts={"enabled": True})                 # a small CNN has no ImageNet classifier
    with pytest.raises(ValueError, match="classifier"):
        build_model(cfg, Vocabulary.build(["a dog"]))


def test_fitted_head_survives_save_and_slim_reload(model, tmp_path):
    fitted(model, seed=3)
    feats = torch.rand(2, model.feature_dim)
    with torch.no_grad():
        want = model.embed_features(feats)
    full, slim = tmp_path / "full.pt", tmp_path / "slim.pt"
    save_model(model, full)
    save_slim(model, slim)
    kept = load_checkpoint(slim)["state_dict"]
    assert "concepts.class_embeddings" in kept and "concepts.classifiers.0.weight" not in kept   # from the package
    for path in (full, slim):
        with torch.no_grad():
            torch.testing.assert_close(load_model(path).embed_features(feats), want)


def test_train_fits_the_head_and_the_bank_names_the_classes(synth_small, tmp_path):
    from training.train import train

    cfg = build_config({"image": {"backbone": "efficientnet_lite0", "image_size": 64, "resize": 64},
                        "text": {"encoder": "gru", "word_dim": 16, "hidden": 32}, "model": {"embed_dim": 32},
                        "loss": {"name": "sum"}, "train": {"epochs": 1, "batch_size": 16, "workers": 0},
                        "concepts": {"enabled": True, "prototypes": 4, "bank_template": "a {}"},
                        "querybank": {"captions": 20, "images": 10}})
    summary = train(cfg, synth_small, tmp_path, progress=False, log=lambda *_: None)
    model = load_model(tmp_path / "model.pt")
    assert bool(model.concepts.fitted) and summary["concepts"]["prototypes"] == 4
    bank = carried(model)
    assert len(bank["captions"]) == 20 + 1000 and "a tabby" in bank["captions"]
    # its index bank: the class sentences, and each class's other names embedded as they are (averaged over the
    # head's templates, normalised), each with its class
    qb = model_bank(model, progress=False, cache=tmp_path / "cache")
    aliases = class_aliases()
    assert qb is not None and qb.sentences.shape == (1000, 32) and qb.aliases.shape == (len(aliases), 32)
    assert qb.alias_classes.tolist() == [c for c, _ in aliases]
    at = [n for _, n in aliases].index("hedgehog")
    template, = model.cfg.concepts.templates
    want = embed_sentences(model, [template.format("hedgehog")], progress=False)[0]
    np.testing.assert_allclose(qb.aliases[at].astype(np.float32), want, atol=2e-3)
    # the command refits a trained model (here with another weight), in place, keeping its bank's size
    assert cli_main(["concepts", "--model", str(tmp_path / "model.pt"), "--data", str(synth_small),
                     "--set", "concepts.weight=0.5", "--set", "concepts.prototypes=4"]) == 0
    again = load_model(tmp_path / "model.pt")
    assert again.cfg.concepts.weight == 0.5 and bool(again.concepts.fitted)
    assert len(carried(again)["captions"]) == 1020
    assert cli_main(["concepts", "--model", str(tmp_path / "model.pt"), "--data", str(synth_small),
                     "--set", "weight=1"]) == 2


def test_a_class_is_also_named_by_its_other_english_lemmas_and_not_by_its_scientific_name():
    names = class_names()
    aliases = class_aliases()
    by_name = {n: c for c, n in aliases}
    assert names[by_name["hedgehog"]] == "porcupine" and names[by_name["wheelbarrow"]] == "barrow"
    assert names[by_name["German shepherd dog"]] == "German shepherd" and names[by_name["tee shirt"]] == "jersey"
    assert not {"Tinca tinca", "Carassius auratus", "Panthera leo", "Ailuropoda melanoleuca"} & set(by_name)
    assert all(n.lower() != names[c].lower() for c, n in aliases) and len(set(aliases)) == len(aliases)
    assert [c for c, _ in aliases] == sorted(c for c, _ in aliases) and 600 < len(aliases) < 1000


def test_a_class_can_be_named_by_its_curated_name_or_by_both_and_its_other_names_stay_aliases():
    first, clean = class_names(), class_names("clean")
    assert (first[509], clean[509]) == ("confectionery", "candy store") and clean[968] == "tea cup"
    assert first[134] == first[517] == "crane" and clean[134] != clean[517]      # the bird and the machine
    assert naming_sources("first") == ("first",) and naming_sources("both") == ("first", "clean")
    with pytest.raises(ValueError, match="concepts.class_names.*'latin'"):
        naming_sources("latin")
    for naming, said in (("clean", (clean,)), ("both", (first, clean))):
        aliases = class_aliases(naming)
        assert not [n for c, n in aliases if any(n.lower() == s[c].lower() for s in said)]
        assert (naming == "clean") == ((968, "cup") in aliases)        # a first lemma the sentences do not say
        assert (334, "hedgehog") in aliases and "Tinca tinca" not in {n for _, n in aliases}
    with pytest.raises(ConfigError, match="concepts.class_names"):
        lite0_config(class_names="latin")


def test_named_by_both_a_class_sentence_is_the_mean_of_its_two_names_sentences():
    torch.manual_seed(0)
    model = build_model(lite0_config(class_names="both", templates=["a photo of a {}.", "a {}"]),
                        Vocabulary.build(["a candy store", "a tea cup"])).eval()
    fit(model, torch.rand(60, model.feature_dim, generator=torch.Generator().manual_seed(0)), log=lambda *_: None)
    sentences = [t.format(n) for names in (class_names(), class_names("clean")) for t in model.cfg.concepts.templates
                 for n in names[500:510]]
    want = F.normalize(embed_texts(model, sentences).float().view(4, 10, -1).sum(0), dim=-1)
    torch.testing.assert_close(model.concepts.class_embeddings[500:510], want, atol=1e-5, rtol=0)


# --- the COSMO confidence gate and the people side ----------------------------------------------------------------

def test_confidence_gate_has_one_weight_per_photo_and_rises_with_the_classifiers_confidence():
    torch.manual_seed(0)
    model = build_model(lite0_config(confidence_floor=0.2, confidence=8.0, confidence_at=0.3),
                        Vocabulary.build(["a dog", "a cat"])).eval()
    fitted(model)
    head = model.concepts
    x = torch.rand(1, model.feature_dim) * 4
    scaled = torch.cat([x * s for s in (0.25, 1.0, 4.0, 16.0)])     # r(x) is scale-free, the logits are not
    with torch.no_grad():
        kappa, g, r = head.confidence(scaled), head.gate_weights(scaled), head.typicality(scaled)
    assert g.shape == kappa.shape == (4,)
    torch.testing.assert_close(r, r[:1].expand(4))
    assert (kappa.diff() > 0).all() and (g.diff() > 0).all()
    r0, tau = head.gate
    typical = head.cfg.weight * torch.sigmoid((r0 - r) / tau)
    torch.testing.assert_close(g, typical * (0.2 + 0.8 * torch.sigmoid(8.0 * (kappa - 0.3))))
    assert (g < typical).all() and (g > 0.2 * typical).all()


def test_confidence_gate_is_the_typicality_gate_at_its_limits():
    torch.manual_seed(0)
    vocab = Vocabulary.build(["a dog", "a cat"])
    plain, cosmo = (build_model(lite0_config(**kw), vocab).eval()
                    for kw in ({}, {"confidence_floor": 0.25, "confidence": 1e4}))
    cosmo.load_state_dict(plain.state_dict())
    feats = fitted(plain)
    fitted(cosmo)
    x = feats[:5] * torch.tensor([0.1, 1, 4, 16, 64])[:, None]
    with torch.no_grad():
        r0, tau = plain.concepts.gate
        old = plain.concepts.cfg.weight * torch.sigmoid((r0 - plain.concepts.typicality(x)) / tau)
        torch.testing.assert_close(plain.concepts.gate_weights(x), old)          # f = 1: the typicality gate
        sure = cosmo.concepts.confidence(x) > cosmo.concepts.cfg.confidence_at
        assert sure.any() and (~sure).any()
        limit = torch.where(sure, old, 0.25 * old)                               # α → ∞: w or f · w
        torch.testing.assert_close(cosmo.concepts.gate_weights(x), limit, atol=1e-4, rtol=0)
    assert "concepts.person" not in plain.state_dict()       # no people side: the buffers of older files only


def test_split_gate_keeps_the_typicality_gate_for_familiar_photos_and_cosmos_for_the_others():
    torch.manual_seed(0)
    vocab = Vocabulary.build(["a dog", "a cat"])
    cosmo, split = (build_model(lite0_config(confidence_floor=0.25, confidence=8.0, familiar_dims=16, **kw), vocab).eval()
                    for kw in ({}, {"familiar_weight": 0.5}))
    split.load_state_dict(cosmo.state_dict(), strict=False)
    assert "concepts.familiar_photos" not in cosmo.state_dict() and "concepts.familiar_photos" in split.state_dict()
    feats = fitted(cosmo)
    report = fit(split, feats, log=lambda *_: None, names=NAMES)
    head = split.concepts
    assert report["familiar_t_gate"] == pytest.approx(float(head.familiar_gate[2]))
    assert not head.discounts_people                                 # t(x) kept for the gate alone
    x = torch.cat([feats[1:4], torch.rand(3, split.feature_dim) * 4])   # training photos, then unlike them
    with torch.no_grad():
        r0, tau = head.gate
        typical = torch.sigmoid((r0 - head.typicality(x)) / tau)
        _, tau_a, t_g = head.familiar_gate
        unlike = torch.sigmoid((t_g - head.familiarity(x)) / tau_a)
        g = head.gate_weights(x)
        torch.testing.assert_close(g, (1 - unlike) * 0.5 * typical + unlike * cosmo.concepts.gate_weights(x))
        torch.testing.assert_close(head.unfamiliarity(x), torch.zeros(6))      # no person discount: a = 0


def test_people_side_is_fitted_on_captions_and_adds_the_person_sentence():
    from training.fit_concepts import logistic, shows_a_person

    assert shows_a_person(["a man rides a bike", "a person on a bike", "a red bike"])
    assert not shows_a_person(["a dog runs", "a dog on grass", "a man watches a dog"])
    z = torch.linspace(-1, 1, 400)
    labels = torch.rand(400, generator=torch.Generator().manual_seed(0)) < torch.sigmoid((z - 0.2) / 0.1)
    z0, tau = logistic(z, labels)
    assert z0 == pytest.approx(0.2, abs=0.05) and tau == pytest.approx(0.1, abs=0.05)

    torch.manual_seed(0)
    model = build_model(lite0_config(people_weight=0.5), Vocabulary.build(["a man", "a dog", "a photo of a person"]))
    model.eval()
    feats = torch.rand(60, model.feature_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        unit = F.normalize(model.image_proj(feats), dim=-1)
    axis = unit[:, 0] > unit[:, 0].median()                          # "a person" where the first component is high
    captions = [["a man walks"] * 5 if a else ["a dog runs"] * 5 for a in axis.tolist()]
    with pytest.raises(ValueError, match="captions"):
        fit(model, feats, log=lambda *_: None, names=NAMES)
    report = fit(model, feats, log=lambda *_: None, names=NAMES, captions=captions)
    head = model.concepts
    assert report["person_photos"] == int(axis.sum()) and report["person_mean_pi"] > report["other_mean_pi"]
    with torch.no_grad():
        pi = head.person_weights(unit)
        g = head.gate_weights(feats, pi)
        expected = F.normalize(unit + g[:, None] * head.concept_vectors(feats)
                               + 0.5 * pi[:, None] * head.person[1], dim=-1)
        torch.testing.assert_close(model.embed_features(feats), expected)
        torch.testing.assert_close(g, head.gate_weights(feats) * (1 - pi))
    assert float(head.person[1].norm()) == pytest.approx(1.0, abs=1e-5)


def test_concept_keys_are_checked():
    with pytest.raises(ConfigError, match="concepts.confidense"):
        build_config({"concepts": {"confidense": 5.0}})
    with pytest.raises(ConfigError, match="concepts.confidence_at"):
        build_config({"concepts": {"confidence_at": 1.5}})
    with pytest.raises(ConfigError, match="concepts.confidence_floor"):
        build_config({"concepts": {"confidence_floor": -0.1}})
    with pytest.raises(ConfigError, match="concepts.people_weight"):
        build_config({"concepts": {"people_weight": -1.0}})


def test_an_ensemble_embeds_each_photo_as_its_members_do_concept_heads_included():
    """`jointspace ensemble` of models with concept heads: each member's part of the ensemble's photo embedding is
    that member's own (its head included), weighted, so an ensemble keeps what each member knows of ImageNet."""
    from training.models.ensemble import EnsembleEmbedding

    members = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        member = build_model(lite0_config(), Vocabulary.build(["a dog runs on grass", "a cat"])).eval()
        fitted(member, seed)
        members.append(member)
    ensemble = EnsembleEmbedding(members, [1.0, 0.5], ["a", "b"]).eval()
    feats = torch.rand(5, ensemble.feature_dim, generator=torch.Generator().manual_seed(2)) * 3
    with torch.no_grad():
        got = ensemble.embed_features(feats)
        parts = feats.split([m.cached_dim for m in members], dim=-1)
        own = [m.embed_features(p) for m, p in zip(members, parts)]
        expected = F.normalize(torch.cat([own[0], 0.5 * own[1]], dim=-1), dim=-1)
        torch.testing.assert_close(got, expected)
        heads_left_out = F.normalize(torch.cat([F.normalize(m.project_features(p), dim=-1) * w
                                                for m, p, w in zip(members, parts, (1.0, 0.5))], dim=-1), dim=-1)
    assert (got - heads_left_out).abs().max() > 1e-3          # the heads move the photos
