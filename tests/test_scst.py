"""Self-critical sequence training: the CIDEr-D reward, the decoder's sampler, the loss and the stage."""
import json
import math
from collections import Counter

import pytest
import torch

from training.cider import CiderD
from training.data.vocab import END_ID, PAD_ID, START_ID, UNK_ID
from training.models.decoder import SentenceDecoder
from training.scst import leave_one_out_advantage, scst_loss

from conftest import STT_DECODER, tiny_config

REFS = {
    "a": ["a man rides a horse on the beach", "a person riding a brown horse", "a man on a horse near the sea"],
    "b": ["two dogs play in the snow", "a black dog and a white dog run through snow", "dogs playing outside"],
    "c": ["a child eats ice cream", "a little girl with an ice cream cone", "a kid eating a dessert outside"],
}
CANDIDATES = {"a": "a man riding a horse on the sand", "b": "a dog runs in the snow snow snow",
              "c": "a girl eats ice cream"}


def test_cider_d_equals_the_coco_toolkit():
    from pycocoevalcap.cider.cider import Cider

    toolkit, per_image = Cider().compute_score(REFS, {k: [v] for k, v in CANDIDATES.items()})
    ours = CiderD({k: [r.split() for r in refs] for k, refs in REFS.items()})
    assert ours.corpus_score({k: v.split() for k, v in CANDIDATES.items()}) == pytest.approx(toolkit, rel=1e-9)
    for (key, cand), expected in zip(CANDIDATES.items(), per_image):
        assert ours.score(key, cand.split()) == pytest.approx(expected, rel=1e-9)
    # the "-D" parts: a repeated word earns nothing; a length far from the references' is penalised
    assert ours.score("b", "two dogs play in the snow".split()) > ours.score("b", CANDIDATES["b"].split())
    assert ours.score("a", ["horse"]) < ours.score("a", "a man rides a horse".split())
    assert ours.score("a", []) == 0.0


def test_leave_one_out_baseline_and_loss_sign():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])
    adv = leave_one_out_advantage(rewards)
    assert torch.allclose(adv, torch.tensor([[-1.5, 0.0, 1.5], [0.0, 0.0, 0.0]]))
    logp = torch.zeros(6, requires_grad=True)
    scst_loss(logp, rewards).backward()
    # descending the loss raises the log-probability of the better-than-baseline sample, lowers the worse one
    assert logp.grad[2] < 0 < logp.grad[0] and logp.grad[3:].abs().max() == 0
    with pytest.raises(ValueError, match="at least 2 samples"):
        leave_one_out_advantage(torch.ones(3, 1))


def test_samples_follow_the_decoders_masked_distribution():
    """Empirical frequencies of the sampled sentences match exp(returned log-probability)."""
    torch.manual_seed(0)
    dec = SentenceDecoder(7, 4, word_dim=4, hidden=8).eval()      # 3 real words: ids 4, 5, 6
    z = torch.randn(1, 4)
    gen = torch.Generator().manual_seed(0)
    ids, logp = dec.sample(z, n=20000, max_len=3, no_repeat=True, generator=gen)
    assert logp.requires_grad
    counts = Counter(tuple(s) for s in ids)
    probs = {}
    for s, lp in zip(ids, logp.tolist()):
        probs[tuple(s)] = lp
    for s in ids:
        assert 1 <= len(s) <= 3 and not {PAD_ID, START_ID, END_ID, UNK_ID} & set(s)
        assert all(a != b for a, b in zip(s, s[1:]))
    for s, n in counts.most_common(6):
        assert n / len(ids) == pytest.approx(math.exp(probs[s]), abs=0.015)
    # the few possible sentences (3 words, no repeats, at most 3 long) were all drawn: their mass is 1
    assert sum(math.exp(v) for v in probs.values()) == pytest.approx(1.0, abs=0.02)


def test_scst_teaches_a_decoder_the_rewarded_sentences():
    """REINFORCE with the CIDEr-D reward alone (no teacher forcing) drives greedy output to the references."""
    torch.manual_seed(0)
    words = ["<pad>", "<start>", "<end>", "<unk>", "red", "blue", "circle", "square", "big", "small"]
    refs = {0: [["big", "red", "circle"]] * 2, 1: [["small", "blue", "square"]] * 2}
    cider = CiderD(refs)
    dec = SentenceDecoder(len(words), 4, word_dim=8, hidden=32)
    z = torch.eye(4)[:2]
    opt = torch.optim.Adam(dec.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(0)

    def greedy():
        with torch.no_grad():
            hyps = dec.eval().greedy(z, max_len=5)
        dec.train()
        return [[words[w] for w in h.ids] for h in hyps]

    before = greedy()
    for _ in range(150):
        ids, logp = dec.sample(z, n=8, max_len=5, generator=gen)
        rewards = torch.tensor([[cider.score(i // 8, [words[w] for w in s])] for i, s in enumerate(ids)]).view(2, 8)
        opt.zero_grad()
        scst_loss(logp, rewards).backward()
        opt.step()
    after = greedy()
    assert before != [refs[0][0], refs[1][0]]
    assert after == [refs[0][0], refs[1][0]]


def test_scst_stage_trains_the_decoder_only_and_keeps_the_best_checkpoint(synth_small, tmp_path):
    from training.evaluate import EvalOptions, evaluate_model
    from training.models.checkpoint import load_model
    from training.train import train

    base = tmp_path / "xe"
    cfg = tiny_config(decoder=STT_DECODER, train={"epochs": 2, "sampling": "image"})
    train(cfg, synth_small, base, progress=False, log=lambda *_: None)
    out = tmp_path / "scst"
    cfg = tiny_config(decoder=STT_DECODER, train={"epochs": 0, "init_from": str(base / "model.pt")},
                      scst={"steps": 6, "eval_every": 3, "images_per_batch": 4, "samples": 3})
    summary = train(cfg, synth_small, out, progress=False, log=lambda *_: None)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 3, 6] and all(r["stage"] == "scst" for r in log)
    assert all(set(r["val"]) == {"cider_ic", "cider_para"} for r in log)
    assert all(set(r["reward"]) == {"ic", "para"} for r in log[1:])
    best = max(log, key=lambda r: (r["val"]["cider_ic"] + r["val"]["cider_para"], -r["step"]))
    assert summary["scst_best_val_cider"] == pytest.approx((best["val"]["cider_ic"] + best["val"]["cider_para"]) / 2,
                                                           abs=1e-4)
    before, after = load_model(base / "model.pt"), load_model(out / "model.pt")
    assert after.extra["step"] == best["step"]
    changed = {k.split(".")[0] for k, v in after.state_dict().items()
               if not torch.equal(v, before.state_dict()[k])}
    assert changed <= {"decoder"}            # the common space is untouched: retrieval is exactly the same
    if best["step"] > 0:
        assert changed == {"decoder"}
    from training.data.datasets import load_dataset
    data = load_dataset(synth_small)
    retrieval_only = EvalOptions(generation=False)
    r_before = evaluate_model(before, data.split("val"), workers=0, progress=False, options=retrieval_only)
    r_after = evaluate_model(after, data.split("val"), workers=0, progress=False, options=retrieval_only)
    assert r_before["rsum"] == r_after["rsum"]


def test_scst_config_is_checked():
    from training.config import ConfigError

    with pytest.raises(ConfigError, match="scst.samples"):
        tiny_config(decoder=STT_DECODER, scst={"samples": 1})
    with pytest.raises(ConfigError, match="needs a decoder"):
        tiny_config(scst={"steps": 10})
    with pytest.raises(ConfigError, match="scst.steps"):
        tiny_config(decoder=STT_DECODER, scst={"steps": -1})
