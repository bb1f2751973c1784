"""Show, Translate and Tell: eq. 12, STT training samples, the model with a decoder (save/load, inference API,
CLI) and STT-ATT's attention similarity (STT §3.2-3.3)."""
import json

import pytest
import torch

from conftest import tiny_config
from training.caption_eval import CocoScorer, coco_scores, java_available
from training.config import ConfigError
from training.data.datasets import load_dataset
from training.data.vocab import Vocabulary, tokenize
from training.inference.embedding import embed_texts
from training.inference.generate import (NoDecoderError, caption_embeddings, caption_images, decode_settings,
                                         paraphrase_texts)
from training.models.attention import RegionWordAttention
from training.models.model import build_model
from training.models.checkpoint import load_model, save_model
from training.stt import STTLoss, STTTrainer, ordered_pairs
from training.train import Stage

STT = {"enabled": True, "word_dim": 16, "hidden": 32, "max_len": 12}


def quiet(*_):
    pass


def test_ordered_pairs_are_the_twenty_per_image():
    triples = ordered_pairs([0] * 5 + [1] * 5 + [2])
    per_image = {img: [(a, b) for i, a, b in triples if i == img] for img in (0, 1, 2)}
    assert len(per_image[0]) == len(per_image[1]) == 20                   # STT Tables 2-3
    assert len(set(per_image[0])) == 20 and all(a != b for a, b in per_image[0])
    assert all(0 <= a < 5 and 0 <= b < 5 for a, b in per_image[0])
    assert per_image[2] == [(10, 10)]                                   # a lone caption is its own target


def batch_of(trainer):
    src = trainer.source(trainer.train_set, trainable=True)
    loader = trainer.make_loader(Stage("main", 1, 1e-3, 16, True), src, torch.Generator().manual_seed(0))
    return next(iter(loader)), src.kind


def test_eq12_without_decoder_terms_is_exactly_the_retrieval_loss(synth_small, tmp_path):
    cfg = tiny_config(decoder={**STT, "lambda_ic": 0.0, "lambda_para": 0.0})
    trainer = STTTrainer(cfg, synth_small, tmp_path, progress=False, log=quiet)
    batch, kind = batch_of(trainer)
    images, ids_a, len_a, ids_b, len_b, img_idx, cap_idx = batch
    assert not torch.equal(ids_a, ids_b)                                 # caption B is another caption
    model = trainer.model
    loss = trainer.batch_loss(batch, kind, warm=False)
    img = model.embed_images(model.preprocess.normalize(images))
    retrieval = trainer.loss_fn(model.score(img, model.embed_texts(ids_a, len_a)), img_idx)
    assert torch.equal(loss, retrieval)
    loss.backward()
    assert all(p.grad is None for p in model.decoder.parameters())      # the decoder is not even run

    # with λ1, λ2 > 0 the same batch adds the decoder's per-word NLLs, weighted (eq. 12)
    model.zero_grad()
    trainer.stt_loss = STTLoss(0.5, 2.0, 3.0)
    mixed = trainer.batch_loss(batch, kind, warm=False)
    parts = trainer._parts[-1]
    assert mixed.item() == pytest.approx(3.0 * parts["sim"] + 0.5 * parts["ic"] + 2.0 * parts["para"], rel=1e-5)
    assert parts["sim"] == pytest.approx(retrieval.item(), rel=1e-5) and parts["ic"] > 0 and parts["para"] > 0
    mixed.backward()
    assert all(p.grad is not None for p in model.decoder.parameters())


def test_decoder_writes_vocabulary_words_when_the_text_encoder_tokenises_itself(synth_small, tmp_path):
    """An encoder with its own ids (here BiR's n-gram features; MiniLM's WordPiece alike) reads caption A in
    those ids, while the decoder's target caption B is in the vocabulary's word ids it writes."""
    text = {"encoder": "ngram", "hidden": 32, "options": {"n": 2, "values": "binary"}}
    cfg = tiny_config(text=text, decoder=STT, train={"epochs": 1, "sampling": "image"})
    trainer = STTTrainer(cfg, synth_small, tmp_path, progress=False, log=quiet)
    model = trainer.model
    texts = [c for r in trainer.train_set.images for c in r.captions]
    assert trainer.train_ids[0] != model.vocab.encode(texts[0])          # the encoder's ids are not words
    sample = trainer.make_loader(Stage("main", 1, 1e-3, 16, True), trainer.source(trainer.train_set, True),
                                 torch.Generator().manual_seed(0)).dataset
    _, enc_a, target_b, img, cap_a = sample[0]
    _, a, b = sample.triples[0]
    assert cap_a == a and enc_a == trainer.train_ids[a] and target_b == model.vocab.encode(texts[b])
    assert model.vocab.decode(target_b) == " ".join(tokenize(texts[b]))
    trainer.run()
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    nll = log[0]["val"]["nll"]
    assert 0 < nll["ic"] < 10 and 0 < nll["para"] < 10                    # ~log |vocab| at the start, finite
    hyps = paraphrase_texts(load_model(tmp_path / "model.pt"), ["a red circle left of a blue square"], n=2)[0]
    words = set(model.vocab.idx2word)
    assert hyps and all(set(t.split()) <= words for t, _ in hyps)


def test_stt_training_saves_a_self_contained_model_with_decoder(synth_small, tmp_path):
    cfg = tiny_config(decoder=STT, train={"epochs": 1, "sampling": "image"})
    from training.train import train

    train(cfg, synth_small, tmp_path / "run", progress=False, log=quiet)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert set(log[0]["loss_parts"]) == {"sim", "ic", "para"} and set(log[0]["val"]["nll"]) == {"ic", "para"}
    model = load_model(tmp_path / "run" / "model.pt")
    again = load_model(tmp_path / "run" / "model.pt")
    assert model.decoder is not None and model.fingerprint == again.fingerprint
    z = embed_texts(model, ["a red circle left of a blue square"])
    beam = decode_settings(model, beam_size=2)
    assert caption_embeddings(model, z, n=2, settings=beam) == caption_embeddings(again, z, n=2, settings=beam)


@pytest.mark.parametrize("select_on, best_epoch", [("nll", 4), ("rsum", 2)])
def test_select_on_picks_the_checkpoint_and_stops_early(synth_small, tmp_path, monkeypatch, select_on, best_epoch):
    """``train.select_on``: the saved checkpoint and early stopping follow the validation R-sum, or the
    decoder's validation NLL (λ-weighted mean of captioning and paraphrasing), which keeps falling after the
    R-sum peaks. Validation returns scripted numbers; training is real."""
    script = iter([(10.0, 4.0, 4.0), (30.0, 3.0, 3.0), (20.0, 2.0, 2.5), (5.0, 2.6, 2.0), (4.0, 3.0, 3.0),
                   (3.0, 1.0, 1.0)])                  # (R-sum, NLL ic, NLL para) of epochs 1-6

    def scripted_validation(self, source):
        rsum, ic, para = next(script)
        return {"i2t": {}, "t2i": {}, "rsum": rsum, "nll": {"ic": ic, "para": para}}

    monkeypatch.setattr(STTTrainer, "validate", scripted_validation)
    cfg = tiny_config(decoder={**STT, "lambda_ic": 1.0, "lambda_para": 3.0},     # weighted NLL: 4, 3, 2.375, 2.15
                      train={"epochs": 6, "patience": 1 if select_on == "nll" else 2, "sampling": "image",
                             "select_on": select_on})
    summary = STTTrainer(cfg, synth_small, tmp_path, progress=False, log=quiet).run()
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log if r.get("best")][-1] == best_epoch
    assert load_model(tmp_path / "model.pt").extra["epoch"] == best_epoch
    assert summary["best_val_rsum"] == [10.0, 30.0, 20.0, 5.0][best_epoch - 1]
    assert len(log) == (5 if select_on == "nll" else 4)                 # stopped after one / two epochs without a gain

    with pytest.raises(ConfigError, match="select_on"):
        tiny_config(train={"select_on": "nll"})                          # no decoder: nothing to select on
    with pytest.raises(ConfigError, match="select_on"):
        tiny_config(decoder=STT, train={"select_on": "bleu"})


def test_inference_api_returns_ranked_well_formed_sentences(synth_small, tmp_path):
    data = load_dataset(synth_small)
    vocab = Vocabulary.build(c for r in data.images for c in r.captions)
    torch.manual_seed(0)
    model = build_model(tiny_config(decoder=STT), vocab).eval()
    save_model(model, tmp_path / "m.pt")
    model = load_model(tmp_path / "m.pt")
    paths = [r.path for r in data.images[:3]]
    caps = caption_images(model, paths, n=3, beam_size=2)               # the beam widens to n
    assert len(caps) == 3 and all(len(c) == 3 for c in caps)
    for results in caps:
        scores = [s for _, s in results]
        assert scores == sorted(scores, reverse=True) and all(s <= 0 for s in scores)
        for text, _ in results:
            words = text.split()
            assert 1 <= len(words) <= STT["max_len"] and all(w in vocab for w in words) and "<unk>" not in words
    sentences = ["a red circle left of a blue square", "a big green star"]
    paras = paraphrase_texts(model, sentences, n=2)
    assert [len(p) for p in paras] == [2, 2]
    for src, results in zip(sentences, paras):
        assert all(text != " ".join(tokenize(src)) for text, _ in results)
    with pytest.raises(ValueError, match="n must be"):
        caption_embeddings(model, torch.zeros(1, 32), n=0)

    plain = build_model(tiny_config(), vocab)                           # retrieval-only: no decoder
    assert plain.decoder is None
    with pytest.raises(NoDecoderError, match="no sentence decoder"):
        paraphrase_texts(plain, ["a red circle"])


def test_cli_caption_and_paraphrase(synth_small, tmp_path, capsys):
    from service.cli import main

    data = load_dataset(synth_small)
    vocab = Vocabulary.build(c for r in data.images for c in r.captions)
    torch.manual_seed(0)
    save_model(build_model(tiny_config(decoder=STT), vocab), tmp_path / "m.pt")
    assert main(["caption", "--model", str(tmp_path / "m.pt"), str(data.images[0].path), "-n", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["input"] == str(data.images[0].path) and len(out[0]["results"]) == 2
    assert main(["paraphrase", "--model", str(tmp_path / "m.pt"), "a red circle", "a blue star"]) == 0
    assert capsys.readouterr().out.count("\n") == 4                     # two inputs, one result each
    assert main(["caption", "--model", str(tmp_path / "m.pt"), str(tmp_path / "missing.jpg")]) == 2
    save_model(build_model(tiny_config(), vocab), tmp_path / "plain.pt")
    assert main(["paraphrase", "--model", str(tmp_path / "plain.pt"), "a red circle"]) == 2
    assert "no sentence decoder" in capsys.readouterr().err


def test_attention_similarity_follows_eqs_13_to_17():
    torch.manual_seed(0)
    regions, words = torch.randn(3, 4, 8), torch.randn(2, 5, 8)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    att = RegionWordAttention(temperature=4.0, max_elements=50)          # forces several image blocks
    got = att(regions, words, mask)
    want = torch.empty(3, 2)
    for i in range(3):
        for m in range(2):
            v = torch.nn.functional.normalize(regions[i], dim=-1)
            e = torch.nn.functional.normalize(words[m][mask[m]], dim=-1)
            s = v @ e.t()                                                 # eq. 13
            a = torch.softmax(4.0 * s, dim=1) @ e                         # eqs. 14-15
            want[i, m] = torch.cosine_similarity(v, a, dim=1).mean()      # eqs. 16-17
    assert torch.allclose(got, want, atol=1e-5)


def test_stt_att_trains_on_grid_regions_and_reloads(synth_small, tmp_path):
    from training.train import train

    cfg = tiny_config(decoder=STT, attention={"enabled": True}, train={"epochs": 1, "sampling": "image"})
    train(cfg, synth_small, tmp_path / "run", progress=False, log=quiet)
    log = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    assert "pooled" in log["val"] and log["val"]["rsum"] >= 0
    model = load_model(tmp_path / "run" / "model.pt")
    assert model.backbone.n_regions == 16                                 # the small CNN's 4 x 4 grid
    images = torch.randn(2, 3, 32, 32)
    feats = model.image_features(images)
    assert feats.shape == (2, 16 * model.backbone.region_dim)
    pooled = model.embed_features(feats)                                  # §3.3: the regions' average pool
    assert torch.allclose(pooled, torch.nn.functional.normalize(model.embed_regions(feats).mean(1), dim=-1))
    assert len(caption_embeddings(model, pooled, n=1)[0]) == 1
    # evaluation reports every metric the other models report, scored with the attention similarity
    from training.data.datasets import load_dataset
    from training.data.features import Compute
    from training.data.sources import image_source
    from training.evaluate import EvalOptions, attention_retrieval, evaluate_model

    test = load_dataset(synth_small).split("test")
    result = evaluate_model(model, test, progress=False, workers=0, options=EvalOptions(generation=False))
    assert {"rk_variants", "rprecision5", "mir", "pooled", "rsum"} <= set(result)
    source = image_source(model, [r.path for r in test.images], compute=Compute(workers=0, progress=False))
    assert result["rsum"] == pytest.approx(attention_retrieval(model, test, source)["rsum"])
    assert result["rk_variants"]["i2t"]["any_txt"]["r1"] == pytest.approx(result["i2t"]["r1"])


def test_coco_scores_match_known_values_or_report_skips():
    refs = {1: ["a dog runs on the grass", "a brown dog is running"], 2: ["two men play football"]}
    perfect = coco_scores(refs, {1: "a dog runs on the grass", 2: "two men play football"}, meteor=False)
    wrong = coco_scores(refs, {1: "a cat sleeps", 2: "a bowl of soup"}, meteor=False)
    assert perfect["bleu1"] == pytest.approx(1.0, abs=1e-6) and wrong["bleu4"] < 1e-3
    assert perfect["cider"] > wrong["cider"] and perfect["skipped"] == {"meteor": "not requested"}
    assert perfect["tokenizer"] == ("ptb" if java_available() else "jointspace")
    with pytest.raises(ValueError, match="same keys"):
        coco_scores(refs, {1: "a dog"})


def test_meteor_is_scored_with_java_or_reported_skipped(monkeypatch):
    refs = {1: ["a dog runs on the grass"], 2: ["two men play football"]}
    cands = {1: "a dog runs on grass", 2: "men play soccer"}
    with CocoScorer() as scorer:
        res = scorer.score(refs, cands)
    if java_available():
        assert 0 < res["meteor"] < 1 and "meteor" not in res["skipped"]
    else:
        assert res["meteor"] is None and "java" in res["skipped"]["meteor"]
    monkeypatch.setattr("training.caption_eval.java_available", lambda: False)   # a machine without Java
    with CocoScorer() as scorer:
        res = scorer.score(refs, cands)
    assert res["meteor"] is None and "java not found" in res["skipped"]["meteor"]
    assert res["tokenizer"] == "jointspace" and res["bleu1"] > 0


@pytest.mark.slow
def test_demo_stt_captions_beat_the_nearest_caption_baseline(tmp_path_factory):
    """A small STT model on 1,500 synthetic images (~1 min of CPU): its beam-search captions of the test
    images score a higher BLEU-4 than the nearest-caption baseline of the same model — for each test image,
    the training caption closest to it in the common space (retrieval as captioning)."""
    from training.data.synth import generate
    from training.inference.embedding import embed_split
    from training.train import train

    data = tmp_path_factory.mktemp("synth_stt")
    generate(data, n_images=1500, seed=3, image_size=32, progress=False)
    cfg = tiny_config(image={"options": {"width": 8, "out_dim": 256}}, text={"word_dim": 32, "hidden": 64},
                      model={"embed_dim": 64}, decoder={"enabled": True, "word_dim": 32, "hidden": 64},
                      train={"epochs": 20, "batch_size": 64, "lr": 2e-3, "lr_decay_epochs": 16, "sampling": "image",
                             "eval_every": 5, "patience": 100})
    run = tmp_path_factory.mktemp("run_stt")
    train(cfg, data, run, progress=False, log=quiet)
    model = load_model(run / "model.pt")
    dataset = load_dataset(data)
    test, train_split = dataset.split("test"), dataset.split("train")
    img, _, _ = embed_split(model, test, progress=False, workers=0)
    _, train_caps_emb, _ = embed_split(model, train_split, progress=False, workers=0)
    train_caps = [c for r in train_split.images for c in r.captions]
    nearest = model.score(img, train_caps_emb).argmax(1).tolist()
    refs = {r.image_id: list(r.captions) for r in test.images}
    generated = caption_embeddings(model, img, n=1, settings=decode_settings(model, beam_size=3))
    stt = coco_scores(refs, {i: g[0][0] for i, g in enumerate(generated)}, meteor=False)
    baseline = coco_scores(refs, {i: train_caps[j] for i, j in enumerate(nearest)}, meteor=False)
    assert stt["bleu4"] > baseline["bleu4"] + 0.02, (stt, baseline)


def test_evaluate_json_gains_captioning_and_paraphrasing(synth_small, tmp_path, capsys):
    from service.cli import main

    data = load_dataset(synth_small)
    vocab = Vocabulary.build(c for r in data.images for c in r.captions)
    torch.manual_seed(0)
    save_model(build_model(tiny_config(decoder=STT), vocab), tmp_path / "m.pt")
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--model", str(tmp_path / "m.pt"), "--data", str(synth_small), "--split", "test",
                 "--out", str(out), "--workers", "0", "--no-meteor", "--quiet"]) == 0
    result = json.loads(out.read_text())
    n_test = data.split("test").n_images
    assert result["captioning"]["n"] == n_test and result["paraphrasing"]["n"] == 5 * n_test
    for task in ("captioning", "paraphrasing"):
        row = result[task]
        assert all(0 <= row[m] <= 1 for m in ("bleu1", "bleu2", "bleu3", "bleu4"))
        assert row["cider"] >= 0 and row["meteor"] is None and row["skipped"] == {"meteor": "not requested"}
    assert result["examples"][0]["caption"] and "rsum" in result
    assert result["decoding"]["beam_size"] == STT.get("beam_size", 3)
    assert "captioning" in capsys.readouterr().out
    assert main(["evaluate", "--model", str(tmp_path / "m.pt"), "--data", str(synth_small), "--split", "test",
                 "--out", str(out), "--workers", "0", "--no-meteor", "--quiet", "--beam-size", "1",
                 "--length-penalty", "0"]) == 0
    greedy = json.loads(out.read_text())
    assert greedy["decoding"]["beam_size"] == 1 and greedy["decoding"]["length_penalty"] == 0
    example = greedy["examples"][0]
    model = load_model(tmp_path / "m.pt")
    assert example["caption"] == caption_images(model, [example["image"]], beam_size=1, length_penalty=0)[0][0][0]

    save_model(build_model(tiny_config(), vocab), tmp_path / "plain.pt")   # retrieval-only: no such keys
    assert main(["evaluate", "--model", str(tmp_path / "plain.pt"), "--data", str(synth_small), "--split", "test",
                 "--out", str(out), "--workers", "0", "--quiet"]) == 0
    assert "captioning" not in json.loads(out.read_text())


def test_decoder_trained_on_a_frozen_retrieval_space_keeps_its_retrieval(synth_small, tmp_path):
    """``train.init_from`` + ``train.freeze``: an STT decoder trained on the common space of a finished
    retrieval model leaves every retrieval tensor, and so the retrieval metrics, exactly as they were."""
    from training.evaluate import EvalOptions, evaluate_model
    from training.train import train

    train(tiny_config(train={"epochs": 1}), synth_small, tmp_path / "retrieval", progress=False, log=quiet)
    base = load_model(tmp_path / "retrieval" / "model.pt")
    frozen = ["backbone", "image_proj", "text_encoder", "text_proj"]
    cfg = tiny_config(decoder={**STT, "lambda_sim": 0.0},
                      train={"epochs": 2, "sampling": "image", "select_on": "nll",
                             "init_from": str(tmp_path / "retrieval" / "model.pt"), "freeze": frozen})
    train(cfg, synth_small, tmp_path / "stt", progress=False, log=quiet)
    stt = load_model(tmp_path / "stt" / "model.pt")
    before, after = base.state_dict(), stt.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)          # every retrieval tensor unchanged
    fresh = build_model(cfg, stt.vocab, load_weights=False).decoder.state_dict()
    assert any(not torch.equal(fresh[k], v) for k, v in stt.decoder.state_dict().items())   # ... the decoder trained
    data = load_dataset(synth_small).split("val")
    r0 = evaluate_model(base, data, progress=False, options=EvalOptions(generation=False))
    r1 = evaluate_model(stt, data, progress=False, options=EvalOptions(generation=False))
    assert (r1["i2t"], r1["t2i"], r1["rsum"]) == (r0["i2t"], r0["t2i"], r0["rsum"])
    log = [json.loads(line) for line in (tmp_path / "stt" / "log.jsonl").read_text().splitlines()]
    assert log[0]["val"]["nll"]["ic"] > log[-1]["val"]["nll"]["ic"]      # the captioner learns


def test_a_frozen_text_side_embeds_each_training_caption_once(synth_small, tmp_path):
    """With ``train.freeze`` naming the text encoder and its projection, caption A's embedding comes from a table
    made once before the stage; a step's loss and gradients are those of running the text encoder in the step."""
    from training.train import train

    train(tiny_config(train={"epochs": 1}), synth_small, tmp_path / "retrieval", progress=False, log=quiet)
    frozen = ["image_proj", "text_encoder", "text_proj"]
    cfg = tiny_config(decoder={**STT, "lambda_sim": 0.0},
                      train={"epochs": 1, "sampling": "image", "freeze": frozen,
                             "init_from": str(tmp_path / "retrieval" / "model.pt")})
    trainer = STTTrainer(cfg, synth_small, tmp_path / "stt", progress=False, log=quiet)
    model = trainer.model
    batch, kind = batch_of(trainer)
    table = trainer._fixed_captions
    assert table is not None and table.shape == (len(trainer.train_ids), cfg.model.embed_dim)
    model.train()
    for name in frozen:                       # as the trainer runs a stage: frozen modules in eval mode
        getattr(model, name).eval()
    losses, grads = [], []
    for fixed in (table, None):
        trainer._fixed_captions = fixed
        model.zero_grad()
        torch.manual_seed(0)                  # the same decoder dropout in both steps
        loss = trainer.batch_loss(batch, kind, warm=False)
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.decoder.parameters()]))
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)
    # a text side that trains is embedded in every step
    trainable = STTTrainer(tiny_config(decoder=STT, train={"epochs": 1, "sampling": "image"}), synth_small,
                           tmp_path / "joint", progress=False, log=quiet)
    batch_of(trainable)
    assert trainable._fixed_captions is None


def test_init_from_and_freeze_refuse_what_cannot_work(synth_small, tmp_path):
    from training.train import train

    train(tiny_config(train={"epochs": 1}), synth_small, tmp_path / "r", progress=False, log=quiet)
    ckpt = str(tmp_path / "r" / "model.pt")
    with pytest.raises(ValueError, match="no module"):
        train(tiny_config(train={"freeze": ["image_projection"]}), synth_small, tmp_path / "a", progress=False,
              log=quiet)
    with pytest.raises(ValueError, match="shapes differ"):                # another width of the text GRU
        train(tiny_config(text={"hidden": 48}, train={"init_from": ckpt}), synth_small, tmp_path / "b",
              progress=False, log=quiet)
    with pytest.raises(ValueError, match="trained on image.backbone smallcnn with preprocessing"):  # other pixels
        train(tiny_config(image={"image_size": 40, "resize": 40}, train={"init_from": ckpt}), synth_small,
              tmp_path / "e", progress=False, log=quiet)
    with pytest.raises(ValueError, match="vocabulary differs"):           # word ids would mean other words
        train(tiny_config(data={"min_word_count": 50}, train={"init_from": ckpt}), synth_small, tmp_path / "c",
              progress=False, log=quiet)
    with pytest.raises(ValueError, match="nothing to train"):
        train(tiny_config(train={"freeze": ["backbone", "image_proj", "text_encoder", "text_proj"]}), synth_small,
              tmp_path / "d", progress=False, log=quiet)
    with pytest.raises(ConfigError, match="freeze"):
        tiny_config(train={"freeze": "decoder"})
