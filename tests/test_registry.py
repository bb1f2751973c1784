"""The registry (training/models/factory.py): a text encoder is one module plus one registry line, and the config,
the model and model.pt take it from there. The module and the line are the worked example of docs/training.md,
run as written."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from training.config import ConfigError, build_config
from training.models.config_schema import reference_markdown
from training.data.vocab import Vocabulary, pad_batch
from training.models import factory
from training.models.factory import TEXT_ENCODERS
from training.models.model import build_model
from training.models.checkpoint import load_model, save_model
from training.models.registry import Entry, Registry
from training.models.sections import TextKeys

DOC = Path(__file__).resolve().parents[1] / "docs" / "training.md"
HEADING = "## Adding a text encoder: one module plus one registry line"


def _example_blocks() -> tuple[str, str]:
    """The two Python blocks of the worked example: the module, then the registry line."""
    text = DOC.read_text()
    section = text[text.index(HEADING):]
    section = section[:section.index("\n## ", len(HEADING))]
    module, line = re.findall(r"```python\n(.*?)```", section, re.S)
    return module, line


@pytest.fixture
def max_words(tmp_path, monkeypatch):
    """The example module, imported from a file, and its registry line added to (a copy of) TEXT_ENCODERS."""
    source, line = _example_blocks()
    path = tmp_path / "max_words.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("max_words", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "max_words", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(TEXT_ENCODERS, "entries", dict(TEXT_ENCODERS.entries))   # restored after the test
    entry = eval(line.strip().rstrip(","), {"Entry": Entry, "max_words": module})
    TEXT_ENCODERS.add(entry)
    return module


def test_a_registered_text_encoder_is_configured_built_embedded_and_reloaded(max_words, tmp_path):
    cfg = tiny_config(text={"encoder": "max_words", "word_dim": 24, "options": {"unit_words": True}})
    assert cfg.text.options.model_dump() == {"unit_words": True}
    vocab = Vocabulary.build(["a red circle", "a blue square left of a circle"])
    torch.manual_seed(0)
    model = build_model(cfg, vocab).eval()
    assert isinstance(model.text_encoder, max_words.MaxWords) and model.text_encoder.unit_words
    texts = ["a red circle", "a blue square", "circle red a"]
    ids, lengths = pad_batch(model.encode_text_ids(texts))
    with torch.no_grad():
        emb = model.embed_texts(ids, lengths)
    assert emb.shape == (3, cfg.model.embed_dim) and torch.isfinite(emb).all()
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(3))                       # cosine space: unit vectors
    assert not torch.allclose(emb[0], emb[1])
    torch.testing.assert_close(emb[0], emb[2])                                        # a maximum ignores word order
    save_model(model, tmp_path / "model.pt")
    with torch.no_grad():
        again = load_model(tmp_path / "model.pt").embed_texts(ids, lengths)
    torch.testing.assert_close(again, emb)
    # the name, its description and its option are in the generated config reference
    reference = reference_markdown()
    assert "| `max_words` | the elementwise max of word vectors | `unit_words` |" in reference
    assert "#### `text.options` for `text.encoder: max_words`" in reference


def test_a_misspelt_name_or_option_of_the_new_encoder_is_an_error_naming_it(max_words):
    with pytest.raises(ConfigError, match="unknown text encoder 'max_word'.*max_words"):
        build_config({"text": {"encoder": "max_word"}})
    with pytest.raises(ConfigError, match="unknown option 'unit_word' for text.encoder max_words.*unit_words"):
        build_config({"text": {"encoder": "max_words", "options": {"unit_word": True}}})
    with pytest.raises(ConfigError, match="text.options.unit_words"):
        build_config({"text": {"encoder": "max_words", "options": {"unit_words": "sometimes"}}})


def test_a_name_not_in_the_registry_is_refused_naming_it():
    assert "max_words" not in TEXT_ENCODERS                   # the example is registered by its tests only
    for values, message in [({"text": {"encoder": "max_words"}}, "config key 'text.encoder': unknown text encoder "
                                                                  "'max_words'; choose one of: bow, gru"),
                            ({"image": {"backbone": "resnet51"}}, "unknown image backbone 'resnet51'"),
                            ({"loss": {"name": "triplet"}}, "unknown loss 'triplet'"),
                            ({"model": {"similarity": "dot"}}, "unknown similarity 'dot'; choose one of: cosine, "
                                                               "order")]:
        with pytest.raises(ConfigError, match=message):
            build_config(values)
    with pytest.raises(KeyError, match="unknown text encoder 'max_words'"):
        factory.build_text_encoder(TextKeys(encoder="max_words"), 10)


def test_each_table_is_built_in_one_place_and_names_are_unique():
    registry = Registry("thing", "section.thing", [Entry("a", len, None, "the first")])
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        registry.add(Entry("a", len, None, "again"))
    for table in (factory.TEXT_ENCODERS, factory.BACKBONES, factory.LOSSES, factory.SIMILARITIES):
        assert table.names() and all(entry.description for entry in table)
    # every backbone that has a region grid (STT-ATT) is a backbone
    assert set(factory.REGION_GRIDS.names()) <= set(factory.BACKBONES.names())
