"""Multimodal query composition (W2VV §IV-C, Fig. 5): a query image's vector plus and/or minus the
predicted vectors of words, e.g. an image of a bicycle street scene − "bicycle" + "motorbike".

In W2VV the space is the visual feature space, so the composed query is φ(x) + Σ r(w_add) − Σ r(w_sub)
with r the sentence-to-visual-feature network; for any other jointspace model the same sum is taken in its
common space before normalisation. The result is normalised by the model's similarity, ready to be scored
against image embeddings (``model.score``) or searched in an index of them.

Query by example (:func:`example_queries`) is the one implementation the command line (``index search --image``)
and the service (``POST /v1/search/images`` with an image) share: an image without words is its own embedding,
as the gallery's images are embedded; with words it is composed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from PIL import Image

from training.data.preprocess import embed_side, open_image
from training.data.vocab import pad_batch
from training.models.protocol import EmbeddingModel, can_compose
from .embedding import device_of, embed_pixels, inference_autocast, pixel_features
from .shapes import Shapes
from .tensor_views import decode_choice, torch_pixels

NO_COMPOSITION = ("query composition (an image ± words) needs a model that embeds an image as one vector; this one "
                  "uses region attention (STT-ATT)")


@torch.no_grad()
def image_features_of(model: EmbeddingModel, image: str | Path | Image.Image) -> torch.Tensor:
    """A query image (path or PIL image) → its backbone features ``(D,)`` (``embed.pixel_features``); a plain JPEG
    decoded and cut into views on the model's device when the decode setting says so (``tensor_views``)."""
    if not isinstance(image, Image.Image):
        device = device_of(model)
        pixels = torch_pixels(model.preprocess, Path(image).read_bytes(), device) \
            if decode_choice(device) == "torch" else None
        if pixels is not None:
            return pixel_features(model, pixels.unsqueeze(0))[0]
    picture = image if isinstance(image, Image.Image) else open_image(image, embed_side(model.preprocess))
    return pixel_features(model, model.preprocess.pixels(picture).unsqueeze(0))[0]     # (1, crops, 3, S, S) in


@torch.no_grad()
def compose_query(model: EmbeddingModel, image_features: torch.Tensor, add: Sequence[str] = (),
                  subtract: Sequence[str] = ()) -> torch.Tensor:
    """W2VV §IV-C: normalise(proj(φ(x)) + Σ_add r(w) − Σ_subtract r(w)) → ``(E,)``.

    ``image_features``: the query image's backbone features ``(D,)`` (``image_features_of``); each entry of
    ``add`` / ``subtract`` is a word or phrase, encoded as a sentence. Raises ValueError on an empty word."""
    for text in [*add, *subtract]:
        if not text or not text.strip():
            raise ValueError("query composition words must not be empty")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with inference_autocast(model, device):        # the inference policy (embedding.py), as for every query
        query = model.project_features(image_features.to(device).view(1, -1))[0]
        for texts, sign in ((add, 1.0), (subtract, -1.0)):
            if texts:
                ids, lengths = pad_batch(model.encode_text_ids(list(texts)))
                query = query + sign * model.project_texts(ids.to(device), lengths.to(device)).sum(0)
        query = model.similarity.normalize(query.view(1, -1))[0].float()
    model.train(was_training)
    return query


@torch.no_grad()
def example_queries(model: EmbeddingModel, pixels: torch.Tensor, words: Sequence[tuple[Sequence[str], Sequence[str]]],
                    shapes: Shapes | None = None) -> torch.Tensor:
    """Query by example: uint8 pixels ``(B, crops, 3, S, S)`` of query images (``model.preprocess.pixels``,
    stacked) and each one's ``(add, subtract)`` words → query vectors ``(B, E)``, float32 on the model's device, at
    the bucket sizes of ``shapes`` when given. An image without words is its embedding (``embed.embed_pixels``);
    one with words is composed (:func:`compose_query`), which a model with region attention cannot do
    (ValueError, :data:`NO_COMPOSITION`). The caller puts the model in eval mode."""
    if not any(add or subtract for add, subtract in words):
        return embed_pixels(model, pixels, shapes=shapes)
    if not can_compose(model):
        raise ValueError(NO_COMPOSITION)
    features = pixel_features(model, pixels, shapes=shapes)
    device = features.device
    rows = []
    for feature, (add, subtract) in zip(features, words):
        if add or subtract:
            rows.append(compose_query(model, feature, add, subtract).to(device))
        else:
            with inference_autocast(model, device):
                rows.append(model.embed_features(feature.view(1, -1))[0].float())
    return torch.stack(rows)
