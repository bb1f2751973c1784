"""synth → train → evaluate through the real CLI, asserting recall far above chance."""
import json

import pytest

from service.cli import main


@pytest.mark.slow
def test_synth_train_evaluate_cli(tmp_path):
    data, run, out = tmp_path / "data", tmp_path / "run", tmp_path / "e.json"
    assert main(["synth", "--out", str(data), "--images", "1000", "--seed", "3", "--image-size", "64"]) == 0
    assert main(["train", "--config", "configs/demo.yaml", "--data", str(data), "--out", str(run), "--quiet",
                 "--set", "train.epochs=10", "--set", "train.lr_decay_epochs=8", "--set", "train.workers=0"]) == 0
    assert main(["evaluate", "--model", str(run / "model.pt"), "--data", str(data), "--split", "test",
                 "--out", str(out), "--plot", str(tmp_path / "e.png"), "--quiet", "--workers", "0"]) == 0
    res = json.loads(out.read_text())
    chance_i2t = 100.0 / res["n_images"]            # one image's captions among all images' captions
    chance_t2i = 100.0 / res["n_images"]            # one image among all images
    assert res["n_images"] == 100 and res["n_captions"] == 500
    assert res["i2t"]["r1"] >= 10 * chance_i2t and res["t2i"]["r1"] >= 10 * chance_t2i, res
    assert set(res["i2t"]) == {"r1", "r5", "r10", "medr", "meanr"}
    assert (tmp_path / "e.png").stat().st_size > 1000


def test_cli_reports_bad_input_cleanly(tmp_path, capsys):
    assert main(["evaluate", "--model", str(tmp_path / "missing.pt"), "--data", str(tmp_path), "--split", "test"]) == 2
    assert "error" in capsys.readouterr().err
    (tmp_path / "c.yaml").write_text("train:\n  nope: 1\n")
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--data", str(tmp_path), "--out",
                 str(tmp_path / "r")]) == 2
    assert "train.nope" in capsys.readouterr().err
