"""The STT sentence decoder: teacher forcing, greedy and beam search (STT §3.2)."""
import pytest
import torch

from training.data.vocab import END_ID, PAD_ID, START_ID, UNK_ID, Vocabulary
from training.models.decoder import SentenceDecoder


def make_decoder(vocab_size=30, embed_dim=12, end_bias=0.0, rnn="gru", seed=0):
    torch.manual_seed(seed)
    dec = SentenceDecoder(vocab_size, embed_dim, word_dim=8, hidden=16, rnn=rnn).eval()
    with torch.no_grad():
        dec.out.bias[END_ID] += end_bias      # some rows finish early, some run to max_len
    return dec


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("end_bias,no_repeat", [(0.0, True), (0.4, False), (0.4, True)])
def test_beam_of_one_is_greedy(rnn, end_bias, no_repeat):
    dec = make_decoder(end_bias=end_bias, rnn=rnn)
    z = torch.randn(16, 12)
    greedy = dec.greedy(z, max_len=9, length_penalty=0.7, no_repeat=no_repeat)
    beam = dec.beam_search(z, beam_size=1, n=1, max_len=9, length_penalty=0.7, no_repeat=no_repeat)
    if end_bias:      # both kinds of rows are exercised: closed by <end>, and cut at max_len
        assert {h.finished for h in greedy} == {True, False}
    for g, (b,) in zip(greedy, beam):
        assert g.ids == b.ids and g.finished == b.finished
        assert g.logprob == pytest.approx(b.logprob, abs=1e-5) and g.score == pytest.approx(b.score, abs=1e-5)


def teacher_forced_logprob(dec, z, ids):
    """log P(ids <end> | z) from the training path, for checking search scores."""
    with torch.no_grad():
        nll = dec(z.view(1, -1), torch.tensor([ids]), torch.tensor([len(ids)]))
    return -nll.sum().item()


def test_beam_results_are_sorted_valid_and_scored_like_training():
    dec = make_decoder(end_bias=0.4)
    z = torch.randn(5, 12)
    results = dec.generate(z, beam_size=4, n=4, max_len=8, length_penalty=1.0, no_repeat=True)
    assert [len(r) for r in results] == [4] * 5
    for row, hyps in enumerate(results):
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.ids) for h in hyps}) == len(hyps)               # distinct hypotheses
        for h in hyps:
            assert 1 <= len(h.ids) <= 8
            assert not {PAD_ID, START_ID, END_ID, UNK_ID} & set(h.ids)
            assert all(a != b for a, b in zip(h.ids, h.ids[1:]))          # no immediate repeats
            steps = len(h.ids) + int(h.finished)
            assert h.score == pytest.approx(h.logprob / steps, abs=1e-6)
            if h.finished:
                assert h.logprob == pytest.approx(teacher_forced_logprob(dec, z[row], h.ids), abs=1e-4)
    assert any(h.finished for hyps in results for h in hyps)


def test_generate_rejects_bad_settings():
    dec = make_decoder()
    with pytest.raises(ValueError, match="n <= beam_size"):
        dec.generate(torch.randn(1, 12), beam_size=2, n=3)
    with pytest.raises(ValueError, match="max_len"):
        dec.generate(torch.randn(1, 12), max_len=0)


def test_teacher_forcing_ignores_padding():
    dec = make_decoder()
    z = torch.randn(2, 12)
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    nll = dec(z, ids, torch.tensor([3, 5]))
    alone = dec(z[:1], torch.tensor([[5, 6, 7]]), torch.tensor([3]))
    assert nll.shape == (2, 6)
    assert torch.allclose(nll[0, :4], alone[0], atol=1e-5) and (nll[0, 4:] == 0).all()
    assert (nll[1] > 0).all()      # five words and <end> all scored


def test_overfit_decoder_reproduces_its_captions():
    """Five captions, each tied to its own vector: after training, greedy and beam search write them back."""
    captions = ["a red circle left of a blue square", "a small green star", "there is a big yellow triangle",
                "a purple disc above an orange star on the right", "an image of a tiny blue diamond"]
    vocab = Vocabulary.build(captions)
    torch.manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(len(captions), 16), dim=-1)
    dec = SentenceDecoder(len(vocab), 16, word_dim=16, hidden=48)
    from training.data.vocab import pad_batch
    ids, lengths = pad_batch([vocab.encode(c) for c in captions])
    opt = torch.optim.Adam(dec.parameters(), lr=1e-2)
    for _ in range(300):
        loss = dec(z, ids, lengths).sum() / (lengths + 1).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dec.eval()
    greedy = [vocab.decode(h[0].ids) for h in dec.generate(z, beam_size=1, max_len=15)]
    beam = [vocab.decode(h[0].ids) for h in dec.generate(z, beam_size=3, max_len=15)]
    assert greedy == captions and beam == captions


def test_conditioning_dropout_acts_in_training_only():
    torch.manual_seed(0)
    plain = SentenceDecoder(20, 16, word_dim=8, hidden=12)
    dropped = SentenceDecoder(20, 16, word_dim=8, hidden=12, cond_dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    z, ids, lengths = torch.randn(6, 16), torch.randint(4, 20, (6, 5)), torch.full((6,), 5)
    plain.eval(), dropped.eval()
    assert torch.equal(plain(z, ids, lengths), dropped(z, ids, lengths))       # inference: no effect
    assert plain.generate(z, beam_size=2) == dropped.generate(z, beam_size=2)
    dropped.train()
    torch.manual_seed(1)
    first = dropped(z, ids, lengths)
    torch.manual_seed(2)
    assert not torch.allclose(first, dropped(z, ids, lengths))                # training: a new mask each call
    # each training row is decoded from a copy of z with about half of its units dropped (the rest scaled by 2)
    c, _ = dropped.condition(z)
    zeroed = (c == 0).float().mean().item()
    assert 0.35 < zeroed < 0.65


def test_decoder_dropouts_are_validated():
    from training.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="cond_dropout"):
        load_config(None, overrides=["decoder.cond_dropout=1.0"])


def repeats_an_ngram(ids, m):
    grams = [tuple(ids[i:i + m]) for i in range(len(ids) - m + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("m", [1, 2, 3])
def test_no_repeat_ngram_blocks_every_repeated_m_gram(m):
    """A small vocabulary and long sentences make repeats likely; with the ban none is left, in greedy and beam."""
    dec = make_decoder(vocab_size=10, seed=3)
    z = torch.randn(24, 12)
    plain = dec.generate(z, beam_size=3, n=3, max_len=12, no_repeat=False)
    assert any(repeats_an_ngram(h.ids, m) for hyps in plain for h in hyps)      # the ban has work to do
    for beam in (1, 3):
        results = dec.generate(z, beam_size=beam, n=beam, max_len=12, no_repeat=False, no_repeat_ngram=m)
        hyps = [h for row in results for h in row]
        assert hyps and all(not repeats_an_ngram(h.ids, m) for h in hyps)
        assert all(len(h.ids) >= 1 for h in hyps)
    # beam 1 is still greedy with the ban
    greedy = dec.greedy(z, max_len=12, no_repeat=False, no_repeat_ngram=m)
    beam1 = dec.beam_search(z, 1, 1, 12, 1.0, False, no_repeat_ngram=m)
    assert [g.ids for g in greedy] == [b[0].ids for b in beam1]


def test_no_repeat_ngram_only_bans_what_completes_a_repeat():
    from training.models.decoder import ban_repeated_ngrams

    history = torch.tensor([[5, 6, 7, 5, 6], [5, 6, 7, 8, 9]])
    logp = torch.zeros(2, 12)
    ban_repeated_ngrams(logp, history, 3)            # row 0 ends "5 6", seen before followed by 7
    assert torch.isinf(logp[0]).nonzero().view(-1).tolist() == [PAD_ID, 7]
    assert torch.isinf(logp[1]).nonzero().view(-1).tolist() == [PAD_ID]
    with pytest.raises(ValueError, match="no_repeat_ngram"):
        make_decoder().generate(torch.randn(1, 12), no_repeat_ngram=-1)
