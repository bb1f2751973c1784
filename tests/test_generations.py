"""``jointspace evaluate --generations`` and ``jointspace score-generations``: the sentences an evaluation
generated, written to a file and re-scored elsewhere (e.g. where Java is) to the same numbers."""
import gzip
import json

import pytest
import torch

from conftest import tiny_config
from training.caption_eval import CocoScorer, java_available
from training.data.datasets import load_dataset
from training.data.vocab import Vocabulary
from training.models.model import build_model
from training.models.checkpoint import save_model

METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "cider")


@pytest.fixture(scope="module", params=["decoder", "pool"])
def evaluated(request, synth_small, tiny_stt_model_path, tmp_path_factory):
    """``evaluate --out --generations`` of the tiny STT model on the test split (without METEOR). ``decoder``:
    its own (poor, near-zero scoring) sentences; ``pool``: each vector decoded into a caption of the data set
    it picks (``argmax``), so that every BLEU-n and CIDEr compared is well above zero."""
    from service.cli import main

    out = tmp_path_factory.mktemp("generations")
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "pool":
            pool = [c for r in load_dataset(synth_small).images for c in r.captions]
            mp.setattr("training.inference.generate.caption_embeddings", lambda model, emb, n=1, exclude=None, **_: [
                [(pool[int(row.argmax()) * 7 % len(pool)], 0.0)] for row in emb])
        assert main(["evaluate", "--model", str(tiny_stt_model_path), "--data", str(synth_small), "--split",
                     "test", "--out", str(out / "eval.json"), "--generations", str(out / "gen.json"),
                     "--workers", "0", "--no-meteor", "--quiet"]) == 0
    result = json.loads((out / "eval.json").read_text())
    if request.param == "pool":
        assert all(result[task][m] > 0.01 for task in ("captioning", "paraphrasing") for m in METRICS), result
    return result, out / "gen.json"


def test_generations_file_holds_every_scored_sentence(synth_small, tiny_stt_model_path, evaluated):
    result, path = evaluated
    gen = json.loads(path.read_text())
    test = load_dataset(synth_small).split("test")
    assert gen["model"] == str(tiny_stt_model_path) and gen["split"] == "test"
    assert gen["decoding"] == result["decoding"]
    assert "_generations" not in result                                   # private: not in the metrics JSON

    cap = gen["captioning"]                                               # one entry per image
    assert [e["key"] for e in cap] == [r.image_id for r in test.images]
    assert [e["image"] for e in cap] == [str(r.path) for r in test.images]
    assert [e["references"] for e in cap] == [list(r.captions) for r in test.images]
    assert all(isinstance(e["candidate"], str) for e in cap) and any(e["candidate"] for e in cap)

    want, j = [], 0                                                       # one per caption with other captions
    for r in test.images:
        for i, c in enumerate(r.captions):
            if len(r.captions) > 1:
                want.append({"key": j, "source": c, "references": r.captions[:i] + r.captions[i + 1:]})
            j += 1
    para = gen["paraphrasing"]
    assert [{k: e[k] for k in ("key", "source", "references")} for e in para] == want
    assert all(isinstance(e["candidate"], str) for e in para)
    assert len(para) == result["paraphrasing"]["n"] and len(cap) == result["captioning"]["n"]


def test_score_generations_reproduces_the_evaluate_scores(evaluated, tmp_path, capsys):
    from service.cli import main

    result, path = evaluated
    capsys.readouterr()
    assert main(["score-generations", str(path), "--out", str(tmp_path / "scores.json"), "--no-meteor"]) == 0
    printed = capsys.readouterr().out
    assert "captioning" in printed and "paraphrasing" in printed
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["source"] == str(path)
    for task in ("captioning", "paraphrasing"):
        assert {m: scores[task][m] for m in METRICS} == {m: result[task][m] for m in METRICS}
        assert scores[task]["n"] == result[task]["n"] and scores[task]["tokenizer"] == result[task]["tokenizer"]
        assert scores[task]["meteor"] is None and scores[task]["skipped"] == {"meteor": "not requested"}

    gz = tmp_path / "generations.json.gz"              # the same file gzipped scores the same
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert main(["score-generations", str(gz), "--out", str(tmp_path / "gz.json"), "--no-meteor"]) == 0
    again = json.loads((tmp_path / "gz.json").read_text())
    assert all(again[t] == scores[t] for t in ("captioning", "paraphrasing"))


def test_score_generations_scores_meteor_with_java_or_reports_it_skipped(tmp_path, capsys):
    from service.cli import main

    gen = {"captioning": [{"key": 0, "image": "a.png", "candidate": "a dog runs on grass",
                           "references": ["a dog runs on the grass", "a brown dog is running"]},
                          {"key": 1, "image": "b.png", "candidate": "men play soccer",
                           "references": ["two men play football"]}],
           "paraphrasing": [{"key": 0, "source": "a dog runs on the grass", "candidate": "a dog is running",
                             "references": ["a brown dog is running"]}]}
    (tmp_path / "gen.json").write_text(json.dumps(gen))
    assert main(["score-generations", str(tmp_path / "gen.json"), "--out", str(tmp_path / "s.json")]) == 0
    scores = json.loads((tmp_path / "s.json").read_text())
    for task in ("captioning", "paraphrasing"):
        if java_available():
            assert 0 < scores[task]["meteor"] <= 1 and "meteor" not in scores[task]["skipped"]
        else:
            assert scores[task]["meteor"] is None and "java" in scores[task]["skipped"]["meteor"]
    with CocoScorer(meteor=False) as scorer:                               # same numbers as scoring directly
        direct = scorer.score({e["key"]: e["references"] for e in gen["captioning"]},
                              {e["key"]: e["candidate"] for e in gen["captioning"]})
    assert {m: scores["captioning"][m] for m in METRICS} == {m: direct[m] for m in METRICS}
    assert "METEOR" in capsys.readouterr().out


@pytest.mark.parametrize("content,message", [
    (None, "no such generations file"),
    ("{not json", "not a JSON file"),
    ("[1, 2]", "expected a JSON object"),
    ('{"captioning": []}', "'paraphrasing' is missing"),
    ('{"captioning": [{"key": 0, "candidate": "a dog"}], "paraphrasing": []}', "captioning[0]"),
    ('{"captioning": [{"key": 0, "candidate": "a", "references": []}], "paraphrasing": []}', "non-empty list"),
    ('{"captioning": [], "paraphrasing": [{"key": 1, "candidate": "a", "references": ["b"]},'
     ' {"key": 1, "candidate": "c", "references": ["d"]}]}', "duplicate key"),
])
def test_score_generations_refuses_a_missing_or_corrupt_file(tmp_path, capsys, content, message):
    from service.cli import main

    path = tmp_path / "gen.json"
    if content is not None:
        path.write_text(content)
    assert main(["score-generations", str(path), "--out", str(tmp_path / "s.json"), "--no-meteor"]) == 2
    err = capsys.readouterr().err
    assert "error" in err and message in err and str(path) in err
    assert not (tmp_path / "s.json").exists()


def test_evaluate_generations_needs_a_decoder_and_generation(synth_small, tiny_stt_model_path, tmp_path, capsys):
    from service.cli import main

    data = load_dataset(synth_small)
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in data.images for c in r.captions)
    save_model(build_model(tiny_config(), vocab), tmp_path / "plain.pt")  # retrieval-only
    common = ["--data", str(synth_small), "--split", "test", "--workers", "0", "--quiet",
              "--generations", str(tmp_path / "gen.json")]
    assert main(["evaluate", "--model", str(tmp_path / "plain.pt"), *common]) == 2
    assert "no sentence decoder" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(tiny_stt_model_path), "--no-generation", *common]) == 2
    assert "--no-generation" in capsys.readouterr().err
    assert not (tmp_path / "gen.json").exists()
