"""Inference API of the STT decoder: captions from images or image embeddings, paraphrases from sentences.

Every function is batched (one decoder batch per ``batch_size`` inputs) and returns, for each input, a list
of ``(text, score)`` best first, ``score`` being the length-normalised log-probability the hypotheses are
ranked by (``log P / steps ** length_penalty``; ≤ 0, higher is better). Decoding settings default to the
model's ``decoder`` config section. A model without a decoder raises :class:`NoDecoderError`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from training.data.preprocess import embed_side, open_image
from training.data.vocab import tokenize
from training.models.config_schema import RunConfig
from training.models.protocol import EmbeddingModel, has_decoder
from .embedding import device_of, embed_pixels, embed_texts, inference_autocast

Result = list[tuple[str, float]]


class NoDecoderError(ValueError):
    """The model was trained without a decoder (``decoder.enabled: false``): it can only retrieve."""


def require_decoder(model: EmbeddingModel) -> None:
    if not has_decoder(model):
        raise NoDecoderError("this model has no sentence decoder (it was trained with decoder.enabled: false); "
                             "captions and paraphrases need an STT model, e.g. configs/stt.yaml")


@dataclass(frozen=True)
class DecodeSettings:
    """How sentences are decoded (:func:`caption_embeddings`' ``settings``): :func:`decode_settings` fills in the
    ones not given from the ``decoder`` config keys of the same names."""
    beam_size: int
    max_len: int
    length_penalty: float
    no_repeat: bool
    no_repeat_ngram: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_settings(model: EmbeddingModel, beam_size: int | None = None, max_len: int | None = None,
                    length_penalty: float | None = None, no_repeat: bool | None = None,
                    no_repeat_ngram: int | None = None) -> DecodeSettings:
    """The model's decoding defaults (config ``decoder`` section) with the given values replacing them."""
    cfg = model.cfg
    if not isinstance(cfg, RunConfig):         # an ensemble: no decoder
        raise NoDecoderError("an ensemble has no sentence decoder")
    d = cfg.decoder
    out = DecodeSettings(beam_size=d.beam_size if beam_size is None else beam_size,
                         max_len=d.max_len if max_len is None else max_len,
                         length_penalty=d.length_penalty if length_penalty is None else length_penalty,
                         no_repeat=d.no_repeat if no_repeat is None else no_repeat,
                         no_repeat_ngram=d.no_repeat_ngram if no_repeat_ngram is None else no_repeat_ngram)
    if not isinstance(out.beam_size, int) or out.beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {out.beam_size!r}")
    if not isinstance(out.max_len, int) or out.max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {out.max_len!r}")
    if not isinstance(out.no_repeat_ngram, int) or out.no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram must be an integer >= 0, got {out.no_repeat_ngram!r}")
    return out


@torch.no_grad()
def caption_embeddings(model: EmbeddingModel, embeddings: torch.Tensor, n: int = 1,
                       settings: DecodeSettings | None = None, batch_size: int = 64,
                       exclude: Sequence[Sequence[str]] | None = None) -> list[Result]:
    """Decodes common-space vectors ``(B, E)`` into sentences: image embeddings (``model.embed_images``, or
    vectors read back from an index) give captions (STT eq. 10), sentence embeddings give paraphrases
    (eq. 11). ``n`` results per row (the beam is widened to ``n`` when smaller), decoded as ``settings`` say
    (:func:`decode_settings`; None: the model's defaults). ``exclude[i]``: normalised texts
    (``" ".join(tokenize(t))``) never returned for row ``i``."""
    require_decoder(model)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    opts = settings if settings is not None else decode_settings(model)
    extra = 1 if exclude is not None else 0         # room for one excluded hypothesis (the input sentence)
    want = n + extra
    beam = max(opts.beam_size, want)
    decoder = model.decoder
    device = next(decoder.parameters()).device
    was_training = model.training
    model.eval()
    out: list[Result] = []
    for start in range(0, embeddings.shape[0], batch_size):
        z = embeddings[start:start + batch_size].to(device)
        with inference_autocast(model, device):        # the inference policy (embedding.py)
            hyps = decoder.generate(z, beam_size=beam, n=want, max_len=opts.max_len,
                                    length_penalty=opts.length_penalty, no_repeat=opts.no_repeat,
                                    no_repeat_ngram=opts.no_repeat_ngram)
        for row, row_hyps in enumerate(hyps):
            banned = set(exclude[start + row]) if exclude is not None else set()
            texts = [(model.vocab.decode(h.ids), h.score) for h in row_hyps]
            out.append([(t, float(s)) for t, s in texts if t not in banned][:n])
    model.train(was_training)
    return out


@torch.no_grad()
def embed_image_inputs(model: EmbeddingModel,
                       images: Sequence[str | Path | Image.Image], batch_size: int = 32) -> torch.Tensor:
    """Image files or PIL images → common-space vectors, preprocessed as in training (``embedding.embed_pixels``)."""
    out = []
    for start in range(0, len(images), batch_size):
        batch = [im if isinstance(im, Image.Image) else open_image(im, embed_side(model.preprocess))
                 for im in images[start:start + batch_size]]
        out.append(embed_pixels(model, torch.stack([model.preprocess.pixels(im) for im in batch])))
    return torch.cat(out) if out else torch.zeros(0, model.cfg.model.embed_dim, device=device_of(model))


def caption_images(model: EmbeddingModel,
                   images: Sequence[str | Path | Image.Image], n: int = 1, **decode) -> list[Result]:
    """Captions for image files or PIL images (STT eq. 10); ``decode``: :func:`decode_settings`' overrides."""
    require_decoder(model)
    was_training = model.training
    model.eval()
    emb = embed_image_inputs(model, images)
    model.train(was_training)
    return caption_embeddings(model, emb, n=n, settings=decode_settings(model, **decode))


def identical_to(texts: Sequence[str]) -> list[list[str]]:
    """``exclude`` for :func:`caption_embeddings` that leaves out, for each text, a hypothesis that only repeats
    it (the same words, as the decoder writes them)."""
    return [[" ".join(tokenize(t))] for t in texts]


def paraphrase_texts(model: EmbeddingModel, texts: Sequence[str], n: int = 1, drop_identical: bool = True,
                     **decode) -> list[Result]:
    """Paraphrases of sentences (STT eq. 11): each sentence is embedded by the text encoder and decoded
    (``decode``: :func:`decode_settings`' overrides). With ``drop_identical`` a hypothesis that only repeats the
    input (same words) is left out."""
    require_decoder(model)
    was_training = model.training
    model.eval()
    emb = embed_texts(model, list(texts))
    model.train(was_training)
    exclude = identical_to(texts) if drop_identical else None
    return caption_embeddings(model, emb, n=n, settings=decode_settings(model, **decode), exclude=exclude)
