"""Show, Translate and Tell training (STT §3.2–3.3, §4.2): one model that retrieves, captions and paraphrases.

* Samples are ``(image, caption A, caption B)`` with A ≠ B two captions of the same image — the n·(n−1)
  ordered pairs per image of STT Tables 2–3 (20 for five captions). ``train.sampling: caption`` visits every
  ordered pair once per epoch (the paper's 20× epoch); ``image`` visits every image once per epoch with one
  random pair.
* The image and caption A are embedded; the ranking loss (eq. 7, the ``loss`` section) aligns them, and the
  decoder writes caption B from the image embedding (captioning, eq. 10) and from caption A's embedding
  (paraphrasing, eq. 11). Fig. 12: one decoder for both.
* The joint loss is eq. 12, ``L = λ1·L_IC + λ2·L_para + λ3·L_sim`` (:class:`STTLoss`); with λ1 = λ2 = 0 the
  decoder is not run and the loss is exactly the retrieval model's.
* STT-ATT (§3.3): ``L_sim`` ranks with the region–word attention similarity (eqs. 13–17) and, weighted by
  ``attention.pooled_weight``, also with the cosine of the pooled vectors that the decoder (§3.3: "an average
  pooling layer … used as an input to the decoder") and a vector index read.

``L_IC`` and ``L_para`` are eq. 10/11's ``−Σ_t log P(S_t | ·)`` averaged over the target words of the batch
(a per-word mean), so the λs do not depend on batch size or caption length.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from training.data.sources import ImageSource
from training.data.vocab import pad_batch
from training.inference.embedding import autocast, embed_image_source, embed_texts
from training.models.attention import embed_words
from training.models.checkpoint import load_checkpoint
from training.models.config_schema import RunConfig
from .batches import batch_features, image_inputs_to_embedding
from .evaluate import attention_retrieval, public
from .trainer import Stage, Trainer

if TYPE_CHECKING:
    from training.models.decoder import SentenceDecoder


def ordered_pairs(cap_to_img: list[int]) -> list[tuple[int, int, int]]:
    """``(image, caption A, caption B)`` for every ordered pair A ≠ B of captions of one image (caption
    indices into the split). An image with a single caption contributes ``(image, a, a)``."""
    by_image: dict[int, list[int]] = {}
    for cap, img in enumerate(cap_to_img):
        by_image.setdefault(img, []).append(cap)
    triples = []
    for img, caps in by_image.items():
        if len(caps) == 1:
            triples.append((img, caps[0], caps[0]))
        triples += [(img, a, b) for a in caps for b in caps if a != b]
    return triples


class TripleDataset(Dataset):
    """``(image input, encoder ids of caption A, decoder word ids of caption B, image index, caption A's index)``
    for each triple.

    ``caption_ids`` are what the text encoder reads, ``target_ids`` the vocabulary word ids the decoder writes;
    they are the same lists unless the encoder tokenises text itself (MiniLM's WordPiece, BiR's n-grams)."""

    def __init__(self, source: ImageSource, caption_ids: list[list[int]], triples: list[tuple[int, int, int]],
                 target_ids: list[list[int]] | None = None):
        self.source, self.caption_ids, self.triples = source, caption_ids, triples
        self.target_ids = caption_ids if target_ids is None else target_ids

    def __len__(self) -> int:
        return len(self.triples)

    def __getitem__(self, i: int):
        img, a, b = self.triples[i]
        image = self.source.data[img][1] if self.source.kind == "files" else self.source.data[img]
        return image, self.caption_ids[a], self.target_ids[b], img, a


def collate_triples(batch):
    images, ids_a, ids_b, img_idx, cap_idx = zip(*batch)
    a, len_a = pad_batch(list(ids_a))
    b, len_b = pad_batch(list(ids_b))
    return (torch.stack(images), a, len_a, b, len_b, torch.tensor(img_idx, dtype=torch.long),
            torch.tensor(cap_idx, dtype=torch.long))


class STTLoss(torch.nn.Module):
    """Eq. 12: ``L = λ1·L_IC + λ2·L_para + λ3·L_sim``; a term whose λ is 0 is not computed."""

    def __init__(self, lambda_ic: float = 1.0, lambda_para: float = 1.0, lambda_sim: float = 1.0):
        super().__init__()
        self.lambda_ic, self.lambda_para, self.lambda_sim = float(lambda_ic), float(lambda_para), float(lambda_sim)

    def forward(self, l_sim: torch.Tensor, decoder, image_emb: torch.Tensor, caption_emb: torch.Tensor,
                target_ids: torch.Tensor, target_lengths: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """``l_sim``: the ranking loss of the batch (eq. 7); the decoder writes ``target_ids`` (caption B)
        from ``image_emb`` (eq. 10) and from ``caption_emb`` (caption A, eq. 11). Returns the loss and its
        parts (floats) for logging."""
        total = self.lambda_sim * l_sim
        parts = {"sim": float(l_sim.detach())}
        terms = [(name, lam, z) for name, lam, z in (("ic", self.lambda_ic, image_emb),
                                                     ("para", self.lambda_para, caption_emb)) if lam > 0]
        if terms and decoder is not None:
            z = torch.cat([t[2] for t in terms])        # both tasks in one decoder batch
            b = target_ids.shape[0]
            nll = decoder(z, target_ids.repeat(len(terms), 1), target_lengths.repeat(len(terms)))
            per_word = nll.view(len(terms), b, -1).sum((1, 2)) / (target_lengths.to(nll.device) + 1).sum()
            for (name, lam, _), value in zip(terms, per_word):
                total = total + lam * value
                parts[name] = float(value.detach())
        return total, parts


def build_stt_loss(cfg: RunConfig) -> STTLoss:
    decoder = cfg.decoder
    if not decoder.enabled:       # STT-ATT retrieval without a decoder: only the ranking term
        return STTLoss(0.0, 0.0, decoder.lambda_sim)
    return STTLoss(decoder.lambda_ic, decoder.lambda_para, decoder.lambda_sim)


class STTTrainer(Trainer):
    """The training loop of ``train.py`` with STT samples, the eq. 12 loss and decoder validation."""

    def __init__(self, cfg: RunConfig, data, out_dir, progress: bool = True, log=print):
        super().__init__(cfg, data, out_dir, progress=progress, log=log)
        self.stt_loss = build_stt_loss(cfg)
        self.triples = ordered_pairs(self.train_cap_to_img)
        self.target_ids = self.decoder_ids([c for r in self.train_set.images for c in r.captions], self.train_ids)
        self._parts: list[dict] = []
        self._fixed_captions: torch.Tensor | None = None    # see fixed_caption_embeddings

    def decoder_ids(self, texts: list[str], encoder_ids: list[list[int]]) -> list[list[int]]:
        """The vocabulary word ids the decoder writes for ``texts``: ``encoder_ids`` themselves unless the text
        encoder tokenises text its own way (``tokenizes``: WordPiece, n-gram features)."""
        if not self.model.text_encoder.tokenizes:
            return encoder_ids
        return self.model.encode_word_ids(texts)

    # --- training ----------------------------------------------------------------------------------
    def make_loader(self, stage: Stage, train_source: ImageSource, generator: torch.Generator) -> DataLoader:
        train = self.cfg.train
        self._fixed_captions = self.fixed_caption_embeddings()
        data = TripleDataset(train_source, self.train_ids, self.triples, self.target_ids)
        sampler = self.sampler(data, [img for img, _, _ in self.triples], generator)
        return DataLoader(data, batch_size=stage.batch_size, sampler=sampler, collate_fn=collate_triples,
                          drop_last=len(sampler) > stage.batch_size,
                          num_workers=train.workers if train_source.kind == "files" else 0)

    @torch.no_grad()
    def fixed_caption_embeddings(self, batch_size: int = 256) -> torch.Tensor | None:
        """Every training caption's embedding, when the text side cannot change (``train.freeze`` names
        ``text_encoder`` and ``text_proj``, e.g. the decoder stages on a finished model's space) and no attention
        reads the words; else None. A frozen module runs in eval mode, so caption A's embedding is the same in
        every step: it is computed once here (``(M, E)`` on the training device) instead of running the text
        encoder, all of MiniLM's layers say, in every step."""
        model = self.model
        text = [p for m in (model.text_encoder, model.text_proj) for p in m.parameters()]
        if model.attention is not None or any(p.requires_grad for p in text):
            return None
        if self._fixed_captions is not None:
            return self._fixed_captions
        modes = [(m, m.training) for m in (model.text_encoder, model.text_proj)]
        for m, _ in modes:
            m.eval()
        out = []
        for start in range(0, len(self.train_ids), batch_size):
            ids, lengths = pad_batch(self.train_ids[start:start + batch_size])
            with autocast(self.device, self.amp):
                out.append(model.embed_texts(ids.to(self.device), lengths.to(self.device)))
        for m, mode in modes:
            m.train(mode)
        return torch.cat(out)

    def embed_batch(self, images: torch.Tensor, kind: str, ids_a, len_a, img_idx, warm: bool,
                    cap_idx: torch.Tensor | None = None):
        """Image and caption-A embeddings of a batch and its ranking loss ``L_sim``."""
        model = self.model
        fixed = self._fixed_captions
        cap_emb = fixed[cap_idx] if fixed is not None and cap_idx is not None else model.embed_texts(ids_a, len_a)
        if model.attention is None:
            img_emb = image_inputs_to_embedding(model, kind, images)
            return img_emb, cap_emb, self.ranking_loss(model.score(img_emb, cap_emb), img_idx, warm)
        feats = batch_features(model, kind, images)
        regions = model.embed_regions(feats)
        img_emb = model.similarity.normalize(regions.mean(1))           # §3.3 average pooling
        words, mask = embed_words(model, ids_a, len_a)
        l_sim = self.ranking_loss(model.attention(regions, words, mask), img_idx, warm)   # eqs. 13-17 in eq. 7
        pooled = self.cfg.attention.pooled_weight
        if pooled > 0:
            l_sim = l_sim + pooled * self.ranking_loss(model.score(img_emb, cap_emb), img_idx, warm)
        return img_emb, cap_emb, l_sim

    def batch_loss(self, batch, kind: str, warm: bool) -> torch.Tensor:
        images, ids_a, len_a, ids_b, len_b, img_idx, cap_idx = (x.to(self.device) for x in batch)
        img_emb, cap_emb, l_sim = self.embed_batch(images, kind, ids_a, len_a, img_idx, warm, cap_idx)
        loss, parts = self.stt_loss(l_sim, self.model.decoder, img_emb, cap_emb, ids_b, len_b)
        self._parts.append(parts)
        return loss

    def epoch_log(self) -> dict:
        parts, self._parts = self._parts, []
        if not parts:
            return {}
        return {"loss_parts": {k: round(float(np.mean([p[k] for p in parts if k in p])), 5) for k in parts[0]}}

    def run(self, resume: bool = False) -> dict:
        """The eq. 12 stages, then (``scst.steps > 0``) the self-critical stage from their best checkpoint. A
        resumed run goes on where its ``last.pt`` was written: in an eq. 12 stage, or in the self-critical
        stage (which writes it at every validation) with its decoder, optimiser and random-number states."""
        summary = super().run(resume=resume)
        if self.cfg.scst.steps > 0:
            from .scst import SelfCriticalStage

            state = self.resumed_state
            scst_state = state if state is not None and state["stage"] == "scst" else None
            if scst_state is None and self.best_score > float("-inf"):   # a best eq. 12 checkpoint: start there
                self.model.load_state_dict(load_checkpoint(self.out_dir / "model.pt")["state_dict"])
            stage = SelfCriticalStage(self)
            summary.update(stage.run(self.out_dir, self.out_dir / "log.jsonl", progress=self.progress, log=self.log,
                                     state=scst_state))
            self.log(json.dumps(summary))
        return summary

    # --- validation ---------------------------------------------------------------------------------
    def validate(self, source: ImageSource) -> dict:
        val = super().validate(source)
        if self.model.attention is not None:   # STT-ATT: select on the attention similarity's R-sum
            att = public(attention_retrieval(self.model, self.val_set, source, device=self.device))
            val = {**att, "pooled": {k: val[k] for k in ("i2t", "t2i", "rsum")}}
        if self.model.decoder is not None:
            val["nll"] = self.validation_nll(source)
        return val

    @torch.no_grad()
    def validation_nll(self, source: ImageSource, batch_size: int = 256) -> dict:
        """Teacher-forced per-word NLL on val: caption B = the next caption of the same image, written from
        the image (``ic``) and from caption A (``para``)."""
        model = self.model
        decoder = cast("SentenceDecoder", model.decoder)     # an STT model has one
        was_training = model.training
        model.eval()
        img_emb = embed_image_source(model, source, workers=self.cfg.train.workers).to(self.device)
        texts = [c for r in self.val_set.images for c in r.captions]
        caps = model.encode_text_ids(texts)
        cap_emb = embed_texts(model, texts, batch_size=512)
        targets = self.decoder_ids(texts, caps)
        pairs = []
        start = 0
        for r in self.val_set.images:
            n = len(r.captions)
            pairs += [(r.image_id, start + i, start + (i + 1) % n) for i in range(n)]
            start += n
        sums, words = {"ic": 0.0, "para": 0.0}, 0
        for s in range(0, len(pairs), batch_size):
            chunk = pairs[s:s + batch_size]
            ids, lengths = pad_batch([targets[b] for _, _, b in chunk])
            ids, lengths = ids.to(self.device), lengths.to(self.device)
            img = img_emb[torch.tensor([i for i, _, _ in chunk], device=self.device)]
            cap = cap_emb[torch.tensor([a for _, a, _ in chunk], device=self.device)]
            sums["ic"] += float(decoder(img, ids, lengths).sum())
            sums["para"] += float(decoder(cap, ids, lengths).sum())
            words += int((lengths + 1).sum())
        model.train(was_training)
        return {k: round(v / max(words, 1), 5) for k, v in sums.items()}
