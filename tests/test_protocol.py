"""The EmbeddingModel protocol and its capabilities: what the inference API, the index and the service use of a
model, asked by name (models/protocol.py); mypy checks that both model classes satisfy it."""
import pytest

from conftest import tiny_config
from training.data.vocab import Vocabulary
from training.inference.generate import NoDecoderError, require_decoder
from training.models.model import build_model
from training.models.protocol import EmbeddingModel, can_compose, has_attention, has_decoder

DECODER = {"enabled": True, "word_dim": 16, "hidden": 32, "max_len": 12}
VOCAB = Vocabulary.build(["a red circle"])


@pytest.mark.parametrize("sections, decoder, attention", [
    ({}, False, False),
    ({"decoder": DECODER}, True, False),
    ({"decoder": DECODER, "attention": {"enabled": True}, "train": {"sampling": "image"}}, True, True),
])
def test_capabilities_follow_the_config(sections, decoder, attention):
    model: EmbeddingModel = build_model(tiny_config(**sections), VOCAB)
    assert has_decoder(model) is decoder and has_attention(model) is attention
    assert can_compose(model) is not attention           # composition needs an image as one vector (W2VV §IV-C)
    if decoder:
        require_decoder(model)
    else:
        with pytest.raises(NoDecoderError, match="no sentence decoder"):
            require_decoder(model)


def test_the_protocol_names_what_the_server_side_reads():
    """Every member the protocol declares is there on a built model (the attributes index/ and service/ read)."""
    model = build_model(tiny_config(), VOCAB)
    members = [n for n in vars(EmbeddingModel) if not n.startswith("_")]
    assert {"cfg", "vocab", "preprocess", "similarity", "decoder", "attention", "embed_images", "embed_texts",
            "encode_text_ids", "project_texts", "fingerprint", "extra", "concepts", "backbone_pretrained",
            "image_split"} <= set(members)
    for name in members:
        assert hasattr(model, name), name
    assert model.fingerprint == "" and model.extra == {}     # a model not read from a file: set by load_model
