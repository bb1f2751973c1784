"""CI-sized model zoo: every config in configs/zoo/ trains a few steps on the synthetic set and evaluates.

The configs are sized for real data (EfficientNet-Lite0 features, 1024-d GRUs); ``SHRINK`` overrides make
each run seconds long: a small CNN whose 32-d output is also the common space (so W2VV's "no projection"
still holds), 32-d hidden layers, one skip-gram epoch for caption-trained word vectors and one RCN recursion
(routing itself is tested in test_zoo_models.py). GloVe vectors, n-gram tables and MiniLM weights are the real ones.
"""
import csv
import json
from pathlib import Path

import pytest
import yaml

from training.zoo import COLUMNS, run_zoo

ZOO = sorted((Path(__file__).resolve().parents[1] / "configs" / "zoo").glob("*.yaml"))
SHRINK = ["train.epochs=1", "train.max_steps_per_epoch=2", "train.batch_size=16", "train.workers=0",
          "image.backbone=smallcnn", "image.image_size=32", "image.resize=32", "image.options={width: 4, out_dim: 32}",
          "model.embed_dim=32", "model.projection_hidden=64", "text.hidden=32", "data.max_caption_len=16"]
# per encoder, the options that shrink it (options are checked against each encoder's own)
SHRINK_OPTIONS = {"w2vv": {"out_dim": 32, "word_vector_epochs": 1}, "rcn": {"word_vector_epochs": 1, "recursions": 1},
                  "gru": {"word_vector_epochs": 1}, "mean_wordvec": {"word_vector_epochs": 1},
                  "ngram": {"word_vector_epochs": 1}, "sse": {"word_vector_epochs": 1}}


def shrunk(configs, out: Path) -> list[Path]:
    """Copies of the zoo configs (same file names) with their encoder's shrinking options."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for path in configs:
        cfg = yaml.safe_load(path.read_text())
        text = cfg.setdefault("text", {})
        options = {**text.get("options", {}), **SHRINK_OPTIONS.get(text.get("encoder", "gru"), {})}
        if options.get("recursions") == 1 and text.get("options", {}).get("recursions") == 0:
            options["recursions"] = 0                    # rcn_gru: the GRU baseline routes nothing
        text["options"] = options
        (out / path.name).write_text(yaml.safe_dump(cfg))
        paths.append(out / path.name)
    return paths


def test_there_is_a_config_per_paper_model():
    names = {p.stem for p in ZOO}
    for needed in ("bir_bow", "bir_2g", "bir_2g_t2i", "bir_sse", "twobranch_k1", "twobranch_semihard", "rcn",
                   "rcn_gru", "w2vv", "minilm_frozen", "minilm_finetune", "stt_cosine", "stt_order"):
        assert needed in names


@pytest.mark.slow
def test_every_zoo_config_trains_and_evaluates(synth_small, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    logged = []
    configs = shrunk(ZOO, tmp_path / "configs")
    rows = run_zoo(synth_small / "dataset.json", configs, tmp_path, overrides=SHRINK, split="val", progress=False,
                   log=logged.append)
    assert [r["model"] for r in rows] == [p.stem for p in ZOO]
    for row in rows:
        assert 0 <= row["i2t_r1"] <= row["i2t_r5"] <= row["i2t_r10"] <= 100
        assert 0 <= row["t2i_r1"] <= row["t2i_r5"] <= row["t2i_r10"] <= 100
        assert 0 < row["mir_i2t"] <= 1 and 0 < row["mir_t2i"] <= 1
        metrics = json.loads((tmp_path / row["model"] / "metrics.json").read_text())
        assert {"rk_variants", "rprecision5", "mir"} <= set(metrics)
        assert (tmp_path / row["model"] / "model.pt").exists()
    with open(tmp_path / "zoo.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [t["model"] for t in table] == [p.stem for p in ZOO] and list(table[0]) == COLUMNS
    assert (tmp_path / "zoo.md").read_text().count("\n") == len(ZOO) + 2
    assert (tmp_path / "zoo.png").read_bytes()[:4] == b"\x89PNG"

    # the same command again resumes: nothing is retrained, the table is the same
    logged.clear()
    again = run_zoo(synth_small / "dataset.json", configs[:3], tmp_path, overrides=SHRINK, progress=False,
                    log=logged.append)
    assert again == rows[:3]
    assert all("already done" in line for line in logged)

    # the result cache is keyed on the data too: another data set is trained, not "already done"
    from training.data.synth import generate

    generate(tmp_path / "other", n_images=60, seed=5, image_size=64, progress=False)
    logged.clear()
    run_zoo(tmp_path / "other" / "dataset.json", configs[:1], tmp_path, overrides=SHRINK, split="val",
            progress=False, log=logged.append)
    assert not any("already done" in line for line in logged) and any("training" in line for line in logged)
