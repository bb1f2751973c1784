"""Partial fine-tuning from cached activations (text.options.train_layers, image.train_blocks), GPO pooling,
the cosine schedule and their config errors."""
import numpy as np
import pytest
import torch

from conftest import tiny_config
from training.config import ConfigError, build_config
from training.data.vocab import Vocabulary, pad_batch
from training.models.minilm import MiniLMEncoder
from training.models.model import build_model
from training.models.pooling import GPO, Pool
from training.train import cosine_factor

SENTENCES = ["a dog runs on the grass", "two children play in the snow near a red house", "a man",
             "a black and white dog is jumping over a wooden fence in the park"]


def _minilm(**options):
    enc = MiniLMEncoder(build_config({"text": {"encoder": "minilm", "options": options}}).text)
    enc.fit(log=lambda *_: None)
    return enc


@pytest.mark.parametrize("layers,pooling", [(2, "gpo"), (1, "mean"), (0, "gpo"), (6, "gpo")])
def test_minilm_cached_path_equals_the_whole_model(tmp_path, layers, pooling):
    torch.manual_seed(0)
    enc = _minilm(train_layers=layers, pooling=pooling)
    ids = [enc.encode_text(s) for s in SENTENCES]
    enc.cache_inputs(ids, tmp_path, dtype="float32", progress=False, log=lambda *_: None)
    assert enc._cache is not None and all(tuple(i) in enc._cache for i in ids)
    enc.eval()
    whole = enc(*pad_batch(ids))                       # eval: the whole model from word pieces
    enc.train()
    for layer in enc.bert.encoder.layer:               # no dropout, to compare the paths exactly
        layer.eval()
    calls = []
    enc.bottom = lambda *a: calls.append(1) or (_ for _ in ()).throw(AssertionError("bottom ran"))
    cached = enc(*pad_batch(ids))                      # training: the top over the cached states
    assert not calls
    torch.testing.assert_close(cached, whole, atol=1e-5, rtol=0)
    # gradients reach exactly the trained layers (and GPO), never the frozen ones
    cached.sum().backward()
    trained = {n.split(".")[3] for n, p in enc.named_parameters() if p.grad is not None and n.startswith("bert.")}
    assert trained == {str(i) for i in range(6 - layers, 6)}
    assert (enc.pool.gpo is not None) == (pooling == "gpo")


def test_minilm_layers_skip_padding_and_dropped_tokens_exactly():
    """The layers run on the attended tokens only (packed): each row of a padded batch with hidden tokens gives
    the states of that row alone with those tokens cut out (the layers see positions only through the states)."""
    torch.manual_seed(0)
    enc = _minilm(train_layers=6)
    enc.eval()
    ids, lengths = pad_batch([enc.encode_text(s) for s in SENTENCES])
    states = enc.bert.embeddings(ids)
    valid = (torch.arange(ids.shape[1]) < lengths[:, None]) & (torch.rand(ids.shape) > 0.3)
    valid[:, 0] = True
    with torch.no_grad():
        batched = enc.bert.layers(states, valid)
        for row in range(len(SENTENCES)):
            alone = enc.bert.layers(states[row:row + 1, valid[row]], torch.ones(1, int(valid[row].sum()), dtype=torch.bool))
            torch.testing.assert_close(batched[row, valid[row]], alone[0], atol=1e-5, rtol=0)
        assert not batched[~valid].any()             # positions not attended come back as zeros


def test_minilm_packed_layers_run_under_bf16_autocast():
    """Inference on CUDA runs under bf16 autocast (training/inference/embedding.py); the packed layers mix the dtypes it makes."""
    enc = _minilm(train_layers=2, pooling="gpo")
    enc.eval()
    batch = pad_batch([enc.encode_text(s) for s in SENTENCES])
    with torch.no_grad():
        exact = enc(*batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = enc(*batch)
    torch.testing.assert_close(low.float(), exact, atol=2e-2, rtol=0)


def test_minilm_state_cache_is_keyed_reused_and_float16_is_close(tmp_path):
    enc = _minilm(train_layers=2)
    ids = [enc.encode_text(s) for s in SENTENCES]
    enc.cache_inputs(ids, tmp_path, progress=False, log=lambda *_: None)          # float16 by default
    files = sorted(p.name for p in tmp_path.iterdir())
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert enc._cache.states.dtype == np.float16 and len(files) == 3
    enc.cache_inputs(ids, tmp_path, progress=False, log=lambda *_: None)          # same key: reused as is
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamps
    enc.cache_inputs(ids[:2], tmp_path, progress=False, log=lambda *_: None)      # other data: another key
    enc3 = _minilm(train_layers=3)                                                # other cut: another key
    enc3.cache_inputs(ids, tmp_path, progress=False, log=lambda *_: None)
    assert len(list(tmp_path.glob("text-*.json"))) == 3
    enc.cache_inputs(ids, tmp_path, progress=False, log=lambda *_: None)
    enc.eval()
    whole = enc(*pad_batch(ids))
    enc.train()
    for layer in enc.bert.encoder.layer:
        layer.eval()
    torch.testing.assert_close(enc(*pad_batch(ids)), whole, atol=2e-3, rtol=0)


def test_token_dropout_hides_inner_word_pieces_only():
    torch.manual_seed(0)
    enc = _minilm(train_layers=1, token_dropout=0.5)
    ids, lengths = pad_batch([enc.encode_text(s) for s in SENTENCES])
    valid = torch.arange(ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    kept = enc.drop_tokens(valid, lengths)
    rows = torch.arange(len(lengths))
    assert kept[:, 0].all() and kept[rows, lengths - 1].all()          # [CLS] and [SEP] always kept
    assert not (kept & ~valid).any() and (kept != valid).any()          # only real tokens hidden, some are


@pytest.mark.parametrize("options,message", [
    ({"poolin": "max"}, "unknown option 'poolin'"),
    ({"capsuls": 8}, "unknown option 'capsuls'"),
    ({"train_layers": 7}, "train_layers: Input should be less than or equal to 6"),
    ({"train_layers": 2, "finetune": True}, "exclude each other"),
    ({"pooling": "max"}, "pooling: Input should be 'mean' or 'gpo'"),
    ({"token_dropout": 0.9}, "token_dropout"),
])
def test_minilm_options_are_checked(options, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"text": {"encoder": "minilm", "options": options}})


def test_gpo_is_max_or_mean_at_the_extremes_and_ignores_padding():
    torch.manual_seed(0)
    gpo = GPO()
    x = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    out = gpo(x, mask)
    # padding never matters: changing padded values leaves the result unchanged
    torch.testing.assert_close(gpo(x.masked_fill(~mask.unsqueeze(-1), 99.0), mask), out)
    assert torch.allclose(out[2], x[2, 0])                                  # one element: itself
    theta = gpo.weights(mask.sum(1), 5)
    torch.testing.assert_close(theta.sum(1), torch.ones(3))
    assert (theta[1, 3:] == 0).all()
    # with all weight on the first rank GPO is max pooling
    with torch.no_grad():
        gpo.score.weight.zero_()
    flat = gpo(x, mask)                                                      # equal scores: the mean
    torch.testing.assert_close(flat[1], x[1, :3].mean(0))
    torch.testing.assert_close(Pool("mean")(x, mask)[1], x[1, :3].mean(0))


def _lite0_model(**image):
    cfg = build_config({"image": {"backbone": "efficientnet_lite0", "resize": 224, **image},
                        "text": {"encoder": "bow", "hidden": 16}, "model": {"embed_dim": 16}})
    return build_model(cfg, Vocabulary.build(["a dog"]), load_weights=False).eval()


@pytest.mark.parametrize("blocks,pooling", [(2, "mean"), (1, "gpo"), (0, "gpo")])
def test_image_cached_activations_give_the_whole_model(blocks, pooling):
    torch.manual_seed(0)
    model = _lite0_model(train_blocks=blocks, pooling=pooling)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        cached = model.image_features(images)                       # what the feature cache stores
        assert cached.shape == (2, model.cached_dim)
        grid = model.backbone.forward_features(images.contiguous(memory_format=torch.channels_last))
        whole = model.image_pool(grid.flatten(2).transpose(1, 2), torch.ones(2, 49, dtype=torch.bool))
        torch.testing.assert_close(model.pooled_features(cached), whole, atol=1e-5, rtol=0)
        if pooling == "mean":                                       # timm's own global average pooling
            torch.testing.assert_close(model.pooled_features(cached), model.backbone(images), atol=1e-5, rtol=0)
        torch.testing.assert_close(model.embed_features(cached), model.embed_images(images), atol=1e-5, rtol=0)
    model.set_backbone_trainable(False)
    trained = {n for n, p in model.backbone.named_parameters() if p.requires_grad}
    top = ("conv_head.", "bn2.") + (("blocks.6.0.",) if blocks == 2 else ())
    assert trained and all(n.startswith(top) for n in trained) if blocks else not trained
    if blocks == 2:
        assert any(n.startswith("blocks.6.0.") for n in trained)


@pytest.mark.parametrize("section,values,message", [
    ("image", {"backbone": "efficientnet_lite0", "resize": 224, "train_blocks": 40}, "train_blocks must be in 0..17"),
    ("image", {"backbone": "efficientnet_lite0", "resize": 224, "pooling": "max"}, "image.pooling.*'mean' or 'gpo'"),
    ("image", {"backbone": "efficientnet_lite0", "resize": 256, "crops": 10, "train_blocks": 1}, "crops: 1"),
    ("train", {"cache_dtype": "int8"}, "cache_dtype"),
    ("train", {"lr_schedule": "cosine", "warmup_steps": -1}, "warmup_steps"),
    ("train", {"encoder_lr_factor": 0}, "encoder_lr_factor"),
    ("image", {"backbone": "efficientnet_lite0", "resize": 224, "feature_dropout": 1.0}, "feature_dropout"),
])
def test_bad_partial_finetuning_configs_are_errors(section, values, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        cfg = build_config({section: values, "text": {"encoder": "bow"}})
        build_model(cfg, Vocabulary.build(["a dog"]), load_weights=False)


def test_feature_dropout_acts_in_training_only():
    torch.manual_seed(0)
    plain = build_model(tiny_config(), Vocabulary.build(["a dog"]), load_weights=False)
    dropped = build_model(tiny_config(image={"feature_dropout": 0.5}), Vocabulary.build(["a dog"]), load_weights=False)
    dropped.load_state_dict(plain.state_dict())                  # no parameters of its own: same keys
    features = torch.rand(8, plain.feature_dim) + 0.1
    plain.train(), dropped.train()
    a, b = dropped.project_features(features), dropped.project_features(features)
    assert not torch.allclose(a, b) and not torch.allclose(a, plain.project_features(features))
    masked = dropped.feature_dropout(features)
    assert 0.2 < (masked == 0).float().mean() < 0.8                  # about half the features dropped
    plain.eval(), dropped.eval()
    torch.testing.assert_close(dropped.embed_features(features), plain.embed_features(features), atol=0, rtol=0)


def test_smallcnn_cannot_be_split():
    with pytest.raises(ValueError, match="need an EfficientNet backbone"):
        build_model(tiny_config(image={"pooling": "gpo"}), Vocabulary.build(["a dog"]))


def test_cosine_schedule_warms_up_then_decays_to_the_final_factor():
    f = [cosine_factor(s, 100, 10, 0.01) for s in range(101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    assert f[100] == pytest.approx(0.01) and f[55] == pytest.approx(0.505)


def test_frozen_minilm_keeps_training_sentences_and_only_the_latest_queries(monkeypatch):
    enc = _minilm()                                    # frozen, mean pooling: sentence vectors are memoised
    assert enc.frozen_vectors
    monkeypatch.setattr(MiniLMEncoder, "RECENT", 2)
    ids = [enc.encode_text(s) for s in SENTENCES]
    enc.train()
    trained = enc(*pad_batch(ids))
    assert len(enc._memo) == len(SENTENCES) and not enc._recent
    enc.eval()
    queries = [enc.encode_text(s) for s in ("a cat", "a red car", "an old bridge", "a cat")]
    for q in queries:
        enc(*pad_batch([q]))
    # three distinct queries through a memo of two: the oldest went, the training sentences stayed
    assert len(enc._recent) == 2 and tuple(queries[1]) not in enc._recent
    assert len(enc._memo) == len(SENTENCES)
    again = enc(*pad_batch(ids + [queries[1]]))        # memoised and fresh vectors in one batch, in order
    torch.testing.assert_close(again[:len(ids)], trained)
    fresh = enc.sentence_vectors(*pad_batch([queries[1]])).float()
    torch.testing.assert_close(again[len(ids):], fresh, atol=1e-6, rtol=0)
