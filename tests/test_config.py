"""Config files: defaults, overrides by dotted path, unknown keys refused."""
import warnings
from pathlib import Path

import pytest

from training.config import ConfigError, build_config, load_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_every_shipped_config_loads():
    files = sorted(CONFIGS.rglob("*.yaml"))
    assert files
    for f in files:
        cfg = load_config(f)
        assert cfg.train.epochs >= 1 or cfg.scst.steps >= 1, f     # every config trains something


def test_override_by_dotted_path_parses_yaml_values():
    cfg = build_config({}, ["train.epochs=1", "train.lr=1e-4", "text.encoder=bow", "image.weights=null",
                            "text.options.binary=true"])
    assert cfg.train.epochs == 1 and cfg.train.lr == 1e-4
    assert cfg.text.encoder == "bow" and cfg.image.weights is None
    assert cfg.text.options.model_dump() == {"binary": True}


@pytest.mark.parametrize("override", ["train.epoch=3", "nosuch.key=1", "train=5", "model.similarity=dot",
                                      "train.batch_size=0"])
def test_bad_keys_and_values_are_errors(override):
    with pytest.raises(ConfigError):
        build_config({}, [override])


def test_unknown_key_in_file_is_an_error(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  epochz: 3\n")
    with pytest.raises(ConfigError, match="train.epochz"):
        load_config(f)


def test_file_values_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  epochs: 7\n  lr: 0.5\n")
    cfg = load_config(f, ["train.epochs=2"])
    assert cfg.train.epochs == 2 and cfg.train.lr == 0.5
    assert cfg.loss.name == "max_violation"          # untouched defaults stay


def test_typed_config_names_the_misspelt_key_or_option_and_what_is_allowed():
    from training.models.factory import TEXT_ENCODERS

    assert all(entry.options is not None for entry in TEXT_ENCODERS)      # every encoder has its options model
    cases = [
        ({"text": {"encoder": "gru", "options": {"poolin": "max"}}}, "unknown option 'poolin' for text.encoder gru"),
        ({"text": {"encoder": "rcn", "options": {"capsuls": 8}}}, "unknown option 'capsuls'.*capsules"),
        ({"text": {"encoder": "gru", "options": {"pooling": "min"}}}, "text.options.pooling.*'last', 'mean' or 'max'"),
        ({"image": {"backbone": "smallcnn", "options": {"widht": 8}}}, "unknown option 'widht'.*width, out_dim"),
        ({"image": {"backbone": "resnet50", "options": {"width": 8}}}, "its options: none"),
        ({"loss": {"name": "bir_pairwise", "options": {"methodology": "x"}}}, "methodology"),
        ({"loss": {"name": "sum", "options": {"k": 3}}}, "unknown option 'k' for loss.name sum"),
        ({"train": {"lr_schedule": "cos"}}, "train.lr_schedule.*'cosine'"),
        ({"train": {"epochs": "ten"}}, "train.epochs"),
        ({"image": {"crops": 3}}, "image.crops.*1, 5 or 10"),
        ({"model": {"projection": "mlp2"}}, "model.projection"),
        ({"text": {"encoder": "gpt"}}, "unknown text encoder 'gpt'"),
    ]
    for values, message in cases:
        with pytest.raises(ConfigError, match=message):
            build_config(values)
    # the shipped configs are all valid
    for path in sorted(Path(__file__).resolve().parents[1].glob("configs/**/*.yaml")):
        load_config(path)


def _inference_options(options: dict) -> dict:
    """Text options without token dropout, which only acts while the text tower trains (the STT configs freeze it)."""
    return {k: v for k, v in options.items() if k != "token_dropout"}


def test_decoder_configs_on_the_shipped_space_read_its_image_features():
    """configs/stt_flickr8k_frozen.yaml and _scst.yaml start from a configs/flickr8k.yaml model
    (train.init_from): their image section must give the same backbone and preprocessing, or init_from refuses."""
    root = Path(__file__).resolve().parents[1] / "configs"
    shipped = load_config(root / "flickr8k.yaml")
    for name in ("stt_flickr8k_frozen.yaml", "stt_flickr8k_scst.yaml"):
        cfg = load_config(root / name)
        for key in ("backbone", "image_size", "resize", "crops", "pooling", "train_blocks", "extra_backbones"):
            assert getattr(cfg.image, key) == getattr(shipped.image, key), (name, key)
        # the text tower and the space are loaded from the shipped model: same encoder, layers, pooling and width
        assert cfg.text.encoder == shipped.text.encoder, name
        assert _inference_options(cfg.text.options.model_dump()) == _inference_options(shipped.text.options.model_dump()), name
        assert cfg.model == shipped.model, name
        assert "text_encoder" in cfg.train.freeze, name


@pytest.mark.parametrize("values, message", [
    ({"train": {"epochs": True}}, "train.epochs.*valid integer"),
    ({"train": {"batch_size": 2.0}}, "train.batch_size.*valid integer"),
    ({"image": {"train_crops": False}}, "image.train_crops.*not False"),
    ({"image": {"train_crops": 5, "train_resize": 100}}, r"config key 'image': train_resize must be >= image_size"),
    ({"image": {"train_crops": 5}, "attention": {"enabled": True}}, "train_crops does not apply to STT-ATT"),
    ({"image": {"pooling": "gpo", "crops": 5}}, "need image.crops: 1"),
    ({"image": {"extra_backbones": [{"backbone": "resnet18", "image_size": 224, "resize": 256}]},
      "train": {"finetune_epochs": 1}}, "extra_backbones are frozen"),
    ({"train": {"select_on": "nll"}}, "select_on: nll needs a decoder"),
    ({"scst": {"steps": 5}}, "scst.steps > 0 needs a decoder"),
    ({"attention": {"enabled": True}, "text": {"encoder": "bow"}}, r"attention \(STT-ATT\) needs"),
])
def test_the_typed_models_hold_every_rule_types_and_rules_between_sections(values, message):
    """One source of rules: config_schema's models (strict types, model validators); config.validate only runs
    them and the options check."""
    from training.models.config_schema import RunConfig, defaults

    with pytest.raises(ConfigError, match=message):
        build_config(values)
    with pytest.raises(ValueError):                     # the model alone refuses it too
        RunConfig.model_validate(defaults() | {k: {**defaults()[k], **v} if isinstance(v, dict) else v
                                               for k, v in values.items()})


def test_a_config_is_typed_read_by_attribute_and_a_missing_key_is_an_error():
    """build_config hands out the typed RunConfig: sections are models, each option map is the options model of
    the name it configures, a key that does not exist is an AttributeError (never a silent default), and the
    config is read-only."""
    from pydantic import ValidationError

    from training.models.config_schema import ImageSection, RunConfig, TextSection
    from training.models.options import GRUOptions, NoOptions, SmallCNNOptions

    cfg = build_config({"image": {"backbone": "smallcnn", "options": {"width": 8}}}, ["train.lr=1e-4"])
    assert isinstance(cfg, RunConfig) and isinstance(cfg.image, ImageSection) and isinstance(cfg.text, TextSection)
    assert isinstance(cfg.image.options, SmallCNNOptions) and cfg.image.options.width == 8
    assert cfg.image.options.out_dim == 512                                  # its default, filled in
    assert isinstance(cfg.text.options, GRUOptions) and cfg.text.options.pooling == "last"
    assert isinstance(cfg.loss.options, NoOptions) and cfg.train.lr == 1e-4
    with pytest.raises(AttributeError, match="poolng"):
        _ = cfg.image.poolng
    with pytest.raises(AttributeError, match="epoch"):
        _ = cfg.train.epoch
    with pytest.raises(AttributeError):
        _ = cfg.text.options.capsules                                       # an RCN option, not a GRU's
    with pytest.raises(ValidationError, match="frozen"):
        cfg.train.lr = 1.0
    with pytest.raises(TypeError):
        _ = cfg["train"]                                                     # not a dict
    # its plain form (what model.pt and config.yaml store) reads back to an equal config
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # each option map serialises as the options model it holds
        plain = cfg.model_dump()
    assert plain["image"]["options"] == {"width": 8, "out_dim": 512} and build_config(plain) == cfg
    assert plain["loss"]["lambda"] == cfg.loss.lambda_ == 1.0                # stored under its config name
