"""One batch of queries → one forward pass of an encoder → one index search. What the batchers run.

Runs on the service's single compute thread (never on the event loop). On CUDA the forward pass runs under
fp16 autocast (``amp``); on CPU in float32. The index (a :class:`index.gallery.Gallery`) can be swapped for a
newer generation at any time: each batch reads ``self.gallery`` once.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


class Engine:
    def __init__(self, model, gallery, device: str | torch.device = "cpu", amp: bool = True):
        self.model, self.gallery = model, gallery
        self.device = torch.device(device)
        self.amp = amp and self.device.type == "cuda"

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp)

    @torch.inference_mode()
    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        with self._autocast():
            emb = self.model.embed_sentences(list(texts), batch_size=max(len(texts), 1))
        return emb.float().cpu().numpy()

    @torch.inference_mode()
    def embed_pixels(self, pixels: Sequence[torch.Tensor]) -> np.ndarray:
        """uint8 ``(crops, 3, S, S)`` tensors (``model.preprocess.pixels``) → image embeddings."""
        batch = torch.stack(list(pixels)).to(self.device, non_blocking=True)
        with self._autocast():
            emb = self.model.embed_images(self.model.preprocess.normalize(batch))
        return emb.float().cpu().numpy()

    def search_texts(self, items: Sequence[tuple[str, int]]) -> list[list[tuple[int, float]]]:
        """``(text, k)`` queries → best-first ``(image id, score)`` lists."""
        gallery = self.gallery
        hits = gallery.search_images(self.embed_texts([t for t, _ in items]), max(k for _, k in items))
        return [h[:k] for h, (_, k) in zip(hits, items)]

    def search_pixels(self, items: Sequence[tuple[torch.Tensor, int]]) -> list[list[tuple[int, float]]]:
        """``(pixels, k)`` queries → best-first ``(caption id, score)`` lists."""
        gallery = self.gallery
        hits = gallery.search_captions(self.embed_pixels([p for p, _ in items]), max(k for _, k in items))
        return [h[:k] for h, (_, k) in zip(hits, items)]

    def search_image_id(self, image_id: int, k: int) -> list[tuple[int, float]]:
        """Captions for a gallery image, from its stored embedding (no forward pass); KeyError if unknown."""
        gallery = self.gallery
        vector = gallery.images.reconstruct(image_id)
        return gallery.search_captions(vector[None, :], k)[0]
