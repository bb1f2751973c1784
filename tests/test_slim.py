"""Slim model files: only the trained tensors are stored; the pretrained ones come back from their PyPI packages,
checked by sha256."""
import pytest
import torch

from service.cli import main as cli_main
from training.config import build_config
from training.data.vocab import Vocabulary
from training.inference.embedding import embed_texts
from training.models.model import build_model
from training.models.checkpoint import fingerprint, load_checkpoint, load_model, save_model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A Lite0 + MiniLM model as partial fine-tuning leaves it: pretrained parts as shipped, except the trained
    top (Lite0's head, MiniLM's last layer), GPO and the projections."""
    torch.manual_seed(0)
    cfg = build_config({"image": {"backbone": "efficientnet_lite0", "resize": 224, "train_blocks": 1, "pooling": "gpo"},
                        "text": {"encoder": "minilm", "options": {"train_layers": 1, "pooling": "gpo"}},
                        "model": {"embed_dim": 32}})
    model = build_model(cfg, Vocabulary.build(["a dog runs"]))
    model.text_encoder.fit(log=lambda *_: None)
    with torch.no_grad():                        # what training changes
        model.backbone.conv_head.weight.add_(0.01)
        model.text_encoder.bert.encoder.layer[5].output.dense.weight.mul_(1.01)
    path = tmp_path_factory.mktemp("slim") / "model.pt"
    save_model(model, path)
    return path


def test_slim_model_loads_to_the_same_model_from_a_fraction_of_the_bytes(trained, tmp_path):
    full = load_model(trained)
    out = tmp_path / "slim.pt"
    assert cli_main(["slim", "--model", str(trained), "--out", str(out)]) == 0
    slim = load_model(out)
    assert slim.fingerprint == full.fingerprint == fingerprint(slim)       # the same model, bit for bit
    for key, value in full.state_dict().items():
        assert torch.equal(slim.state_dict()[key], value), key
    assert out.stat().st_size < trained.stat().st_size / 3
    kept = load_checkpoint(out)["state_dict"]
    assert "backbone.conv_head.weight" in kept and "text_encoder.bert.encoder.layer.5.output.dense.weight" in kept
    assert "backbone.conv_stem.weight" not in kept and "text_encoder.bert.encoder.layer.0.output.dense.weight" \
        not in kept and "text_encoder.tokenizer_json" not in kept
    torch.testing.assert_close(embed_texts(slim, ["a dog runs"]), embed_texts(full, ["a dog runs"]))


def test_slim_half_is_smaller_and_close(trained, tmp_path):
    out = tmp_path / "half.pt"
    assert cli_main(["slim", "--model", str(trained), "--out", str(out), "--half"]) == 0
    full, half = load_model(trained), load_model(out)
    assert half.fingerprint != full.fingerprint
    torch.testing.assert_close(embed_texts(half, ["a dog runs"]), embed_texts(full, ["a dog runs"]),
                               atol=2e-3, rtol=0)


def test_other_pretrained_weights_are_refused(trained, tmp_path):
    out = tmp_path / "slim.pt"
    assert cli_main(["slim", "--model", str(trained), "--out", str(out)]) == 0
    payload = torch.load(out, weights_only=False)
    payload["slim"]["omitted_sha256"] = "0" * 64           # as if the installed package held other weights
    torch.save(payload, out)
    with pytest.raises(ValueError, match="needs the pretrained weights it was trained with"):
        load_model(out)
