"""The STT sentence decoder (STT §3.2, Figs. 12–13): an RNN that writes a sentence from a common-space vector.

One decoder serves both tasks of the paper: fed an image embedding it captions the image (eq. 10), fed a
sentence embedding it paraphrases the sentence (eq. 11). The conditioning vector ``z`` (B, E) sets the RNN's
initial state and is also concatenated to every input word, so the decoder never loses sight of it.

Training is teacher-forced (§3.2: "the groundtruth words are passed as input at current timestep"):
input ``<start> w1 … wn``, target ``w1 … wn <end>``. Inference is greedy or batched beam search
(:meth:`SentenceDecoder.generate`) with length normalisation, a maximum length, ``<unk>`` never emitted,
no empty sentence, and optionally no word repeated twice in a row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.data.vocab import END_ID, PAD_ID, START_ID, UNK_ID
from .config_schema import RunConfig

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    ids: list[int]          # words, without <start>/<end>
    logprob: float          # sum of log P over the words and the closing <end> (if it closed)
    score: float            # logprob / steps ** length_penalty: the ranking score
    finished: bool          # False when max_len cut it before <end>


class SentenceDecoder(nn.Module):
    """GRU or LSTM language model conditioned on a common-space embedding (STT Fig. 13)."""

    def __init__(self, vocab_size: int, embed_dim: int, word_dim: int = 300, hidden: int = 1024, layers: int = 1,
                 rnn: str = "gru", dropout: float = 0.0, cond_dropout: float = 0.0):
        super().__init__()
        if rnn not in ("gru", "lstm"):
            raise ValueError(f"decoder.rnn must be 'gru' or 'lstm', got {rnn!r}")
        self.kind, self.layers, self.hidden, self.vocab_size = rnn, layers, hidden, vocab_size
        self.cond_norm = nn.LayerNorm(embed_dim)      # unit-norm embeddings → unit-variance inputs
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=PAD_ID)
        n_states = 2 if rnn == "lstm" else 1          # LSTM: initial hidden and cell state
        self.init_state = nn.Linear(embed_dim, n_states * layers * hidden)
        cls = nn.GRU if rnn == "gru" else nn.LSTM
        self.rnn = cls(word_dim + embed_dim, hidden, num_layers=layers, batch_first=True,
                       dropout=dropout if layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        # training only: drops units of the conditioning vector, so the decoder cannot key on one training
        # image's exact embedding (its captions are all seen 4 × 5 times an epoch, Tables 2-3)
        self.cond_dropout = nn.Dropout(cond_dropout)
        self.out = nn.Linear(hidden, vocab_size)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    # --- pieces -------------------------------------------------------------------------------------
    def condition(self, z: torch.Tensor):
        """``z`` (B, E) → (normalised z, initial RNN state)."""
        c = self.cond_dropout(self.cond_norm(z.float()))
        h0 = torch.tanh(self.init_state(c)).view(z.shape[0], -1, self.layers, self.hidden).permute(1, 2, 0, 3)
        state = h0[0].contiguous() if self.kind == "gru" else (h0[0].contiguous(), h0[1].contiguous())
        return c, state

    def _run(self, c: torch.Tensor, words: torch.Tensor, state):
        """``words`` (B, T) → RNN outputs (B, T, H) and the new state, ``c`` fed at every step."""
        x = self.dropout(self.embed(words))
        x = torch.cat([x, c.unsqueeze(1).expand(-1, words.shape[1], -1)], dim=-1)
        return self.rnn(x, state)

    # --- training: teacher forcing (STT eqs. 10, 11) ---------------------------------------------------
    def forward(self, z: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Per-word negative log-likelihood of the target sentences.

        ``ids`` (B, T) are word ids without ``<start>``/``<end>`` right-padded with ``<pad>``, ``lengths``
        their lengths. Returns ``(B, T + 1)`` NLL of ``w1 … wn <end>`` given ``<start> w1 … wn``, zero on
        padding: ``−log P(S_t | z)`` of eqs. 10 and 11, before summing.
        """
        b, t = ids.shape
        inputs = torch.cat([ids.new_full((b, 1), START_ID), ids], dim=1)            # <start> w1 … wn (pad)
        targets = torch.cat([ids, ids.new_full((b, 1), PAD_ID)], dim=1)
        targets[torch.arange(b, device=ids.device), lengths.to(ids.device)] = END_ID  # w1 … wn <end>
        c, state = self.condition(z)
        hidden, _ = self._run(c, inputs, state)
        keep = targets != PAD_ID
        logits = self.out(self.dropout(hidden[keep]))       # only real positions reach the softmax
        nll = hidden.new_zeros(b, t + 1, dtype=torch.float32)
        nll[keep] = F.cross_entropy(logits.float(), targets[keep], reduction="none")
        return nll

    # --- inference ----------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, z: torch.Tensor, beam_size: int = 3, n: int = 1, max_len: int = 20,
                 length_penalty: float = 1.0, no_repeat: bool = True,
                 no_repeat_ngram: int = 0) -> list[list[Hypothesis]]:
        """Decodes every row of ``z`` (B, E); ``beam_size == 1`` is greedy decoding.

        Returns for each row its ``n`` best hypotheses (``n <= beam_size``), best first by
        ``score = logprob / steps ** length_penalty`` (steps = words + the closing ``<end>``; 0 = raw sum
        of log-probabilities, 1 = mean per step). ``<unk>``, ``<pad>`` and ``<start>`` are never emitted,
        ``<end>`` not as the first word, with ``no_repeat`` no word directly follows itself, and with
        ``no_repeat_ngram = m > 0`` no m-gram occurs twice in a sentence ("on a skateboard on a skateboard").
        """
        if not isinstance(no_repeat_ngram, int) or no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be an integer >= 0, got {no_repeat_ngram!r}")
        if beam_size < 1 or not 1 <= n <= beam_size:
            raise ValueError(f"need 1 <= n <= beam_size, got n={n}, beam_size={beam_size}")
        if max_len < 1:
            raise ValueError(f"max_len must be at least 1, got {max_len}")
        if beam_size == 1:
            return [[h] for h in self.greedy(z, max_len, length_penalty, no_repeat, no_repeat_ngram)]
        return self.beam_search(z, beam_size, n, max_len, length_penalty, no_repeat, no_repeat_ngram)

    def _step_logprobs(self, c, words, state, step: int, no_repeat: bool, history: torch.Tensor | None = None,
                       no_repeat_ngram: int = 0):
        """Next-word log-probabilities with the bans applied; ``history`` (rows, step) the words so far."""
        hidden, state = self._run(c, words.unsqueeze(1), state)
        logp = F.log_softmax(self.out(hidden[:, 0]).float(), dim=-1)
        logp.masked_fill_(self._banned(words, step, no_repeat), NEG_INF)
        if no_repeat_ngram and history is not None and history.shape[1] >= no_repeat_ngram:
            ban_repeated_ngrams(logp, history, no_repeat_ngram)
        return logp, state

    def _banned(self, words: torch.Tensor, step: int, no_repeat: bool) -> torch.Tensor:
        """(rows, V) words never emitted after ``words``: the specials, ``<end>`` first (no empty sentence) and,
        with ``no_repeat``, the previous word (never ``<end>``: it is not an input)."""
        mask = torch.zeros(words.shape[0], self.vocab_size, dtype=torch.bool, device=words.device)
        mask[:, [PAD_ID, START_ID, UNK_ID]] = True
        if step == 0:
            mask[:, END_ID] = True
        elif no_repeat:
            mask.scatter_(1, words.view(-1, 1), True)
        return mask

    def sample(self, z: torch.Tensor, n: int = 1, max_len: int = 20, no_repeat: bool = True,
               generator: torch.Generator | None = None) -> tuple[list[list[int]], torch.Tensor]:
        """Draws ``n`` sentences per row of ``z`` (B, E) from the decoder's own distribution, with gradients.

        The self-critical stage's samples ``w^s`` (Rennie et al. 2017, eq. 7): the same word bans as
        :meth:`generate` (no ``<unk>``/``<pad>``/``<start>``, no empty sentence, optional no immediate repeat), the
        distribution renormalised over the allowed words. Returns the ``B·n`` word-id lists (row ``i``'s samples
        at ``i·n … i·n + n − 1``, without ``<end>``) and their log-probabilities ``log p(w^s)`` (``B·n``,
        differentiable): the sum over the words and the closing ``<end>`` when one was drawn.
        """
        if n < 1 or max_len < 1:
            raise ValueError(f"need n >= 1 and max_len >= 1, got n={n}, max_len={max_len}")
        rows = z.shape[0] * n
        c, state = self.condition(z.repeat_interleave(n, 0))
        words = torch.full((rows,), START_ID, dtype=torch.long, device=z.device)
        alive = torch.ones(rows, dtype=torch.bool, device=z.device)
        total = torch.zeros(rows, dtype=torch.float32, device=z.device)
        out: list[list[int]] = [[] for _ in range(rows)]
        for step in range(max_len):
            hidden, state = self._run(c, words.unsqueeze(1), state)
            logits = self.out(self.dropout(hidden[:, 0])).float()
            logp = F.log_softmax(logits.masked_fill(self._banned(words, step, no_repeat), NEG_INF), dim=-1)
            drawn = torch.multinomial(logp.detach().exp(), 1, generator=generator).view(-1)
            total = total + torch.where(alive, logp.gather(1, drawn.view(-1, 1)).view(-1), torch.zeros_like(total))
            for i in (alive & (drawn != END_ID)).nonzero().view(-1).tolist():
                out[i].append(int(drawn[i]))
            alive = alive & (drawn != END_ID)
            if not alive.any():
                break
            words = drawn
        return out, total

    @staticmethod
    def _normalise(logprob: float, steps: int, length_penalty: float) -> float:
        return logprob / (steps ** length_penalty) if length_penalty else logprob

    @torch.no_grad()
    def greedy(self, z: torch.Tensor, max_len: int = 20, length_penalty: float = 1.0,
               no_repeat: bool = True, no_repeat_ngram: int = 0) -> list[Hypothesis]:
        b = z.shape[0]
        c, state = self.condition(z)
        words = torch.full((b,), START_ID, dtype=torch.long, device=z.device)
        out: list[list[int]] = [[] for _ in range(b)]
        total = torch.zeros(b, dtype=torch.float64, device=z.device)
        done = torch.zeros(b, dtype=torch.bool, device=z.device)
        history = torch.zeros(b, 0, dtype=torch.long, device=z.device)
        for step in range(max_len):
            logp, state = self._step_logprobs(c, words, state, step, no_repeat, history, no_repeat_ngram)
            best, words = logp.max(1)
            history = torch.cat([history, words.unsqueeze(1)], dim=1)
            total += torch.where(done, torch.zeros_like(total), best.double())
            for i in (~done).nonzero().view(-1).tolist():
                if words[i].item() != END_ID:
                    out[i].append(words[i].item())
            done |= words == END_ID
            if done.all():
                break
        return [Hypothesis(out[i], float(total[i]), self._normalise(float(total[i]), len(out[i]) + int(done[i]),
                                                                     length_penalty), bool(done[i]))
                for i in range(b)]

    @torch.no_grad()
    def beam_search(self, z: torch.Tensor, beam_size: int, n: int, max_len: int, length_penalty: float,
                    no_repeat: bool, no_repeat_ngram: int = 0) -> list[list[Hypothesis]]:
        """Batched beam search: the B × K beams advance as one RNN batch.

        A beam that emits ``<end>`` is moved to its row's finished list and its slot scored −inf, so the next
        step refills the slot from the live beams. A row is done once it holds ``beam_size`` finished
        hypotheses; at ``max_len`` the live beams are added unfinished.
        """
        b, k, dev = z.shape[0], beam_size, z.device
        c, state = self.condition(z)
        c = c.repeat_interleave(k, 0)
        state = (tuple(s.repeat_interleave(k, 1) for s in state) if isinstance(state, tuple)
                 else state.repeat_interleave(k, 1))
        words = torch.full((b * k,), START_ID, dtype=torch.long, device=dev)
        scores = torch.full((b, k), NEG_INF, dtype=torch.float64, device=dev)
        scores[:, 0] = 0.0                                   # the first step expands one beam per row
        history = torch.zeros(b, k, 0, dtype=torch.long, device=dev)
        finished: list[list[Hypothesis]] = [[] for _ in range(b)]
        done = [False] * b
        for step in range(max_len):
            logp, state = self._step_logprobs(c, words, state, step, no_repeat,
                                              history.reshape(b * k, history.shape[2]), no_repeat_ngram)
            cand = (scores.unsqueeze(-1) + logp.double().view(b, k, -1)).view(b, -1)     # (B, K·V)
            top, idx = cand.topk(k, dim=1)
            beam, word = idx // self.vocab_size, idx % self.vocab_size
            history = torch.cat([history.gather(1, beam.unsqueeze(-1).expand(-1, -1, history.shape[2])),
                                 word.unsqueeze(-1)], dim=2)
            flat = (beam + torch.arange(b, device=dev).view(-1, 1) * k).view(-1)
            state = tuple(s[:, flat] for s in state) if isinstance(state, tuple) else state[:, flat]
            scores = top.clone()
            ended = (word == END_ID) & torch.isfinite(top)
            for row, slot in ended.nonzero().tolist():
                if not done[row]:
                    lp = float(top[row, slot])
                    finished[row].append(Hypothesis(history[row, slot, :-1].tolist(), lp,
                                                    self._normalise(lp, step + 1, length_penalty), True))
            scores[ended] = NEG_INF
            for row in range(b):
                if not done[row] and len(finished[row]) >= k:
                    done[row] = True
                if done[row]:
                    scores[row] = NEG_INF
            words = word.view(-1)
            if all(done):
                break
        for row in range(b):
            if not done[row]:             # max_len reached: the live beams count, unfinished
                for slot in range(k):
                    lp = float(scores[row, slot])
                    if lp > NEG_INF:
                        finished[row].append(Hypothesis(history[row, slot].tolist(), lp,
                                                        self._normalise(lp, history.shape[2], length_penalty),
                                                        False))
        return [sorted(hyps, key=lambda h: -h.score)[:n] for hyps in finished]


def ban_repeated_ngrams(logp: torch.Tensor, history: torch.Tensor, m: int) -> None:
    """Sets to −inf, in place, each row's next words that would complete an m-gram already in its ``history``
    (rows, t): the m-grams of the history whose first m − 1 words equal its last m − 1 words."""
    windows = history.unfold(1, m, 1)                                   # (rows, t − m + 1, m)
    prefix = history[:, history.shape[1] - (m - 1):]                    # the last m − 1 words
    match = (windows[:, :, :m - 1] == prefix.unsqueeze(1)).all(-1)
    # <pad> is banned already: a harmless target for the windows that do not match
    logp.scatter_(1, torch.where(match, windows[:, :, -1], torch.full_like(match, PAD_ID, dtype=torch.long)),
                  NEG_INF)


def build_decoder(cfg: RunConfig, vocab_size: int) -> SentenceDecoder:
    """``cfg`` is the whole config; the decoder reads the common space of size ``model.embed_dim``."""
    decoder = cfg.decoder
    return SentenceDecoder(vocab_size, cfg.model.embed_dim, word_dim=decoder.word_dim, hidden=decoder.hidden,
                           layers=decoder.layers, rnn=decoder.rnn, dropout=decoder.dropout,
                           cond_dropout=decoder.cond_dropout)
