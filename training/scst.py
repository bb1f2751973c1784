"""Self-critical sequence training (SCST; Rennie et al., CVPR 2017): a decoder-only stage after eq. 12.

Not in the STT paper. Teacher forcing (STT eqs. 10–11) trains the decoder on ground-truth prefixes and scores
it per word; the evaluation scores whole generated sentences with CIDEr. SCST closes that gap with
REINFORCE on the metric itself: for each conditioning vector it samples ``k`` sentences ``w^s`` from the
decoder, rewards each with its CIDEr-D ``r(w^s)`` against the references, and descends

    ∇L = −(r(w^s) − b) ∇ log p(w^s)                                    (Rennie et al. eq. 7)

with the baseline ``b`` of each sample the mean reward of the other ``k − 1`` samples of the same input (Luo,
"A better variant of self-critical sequence training", 2020), which needs no extra greedy decode.

Both STT tasks train this way, weighted by λ1 and λ2 of eq. 12: captioning rewards a sample against the
image's captions (eq. 10); paraphrasing writes from the embedding of one caption A and rewards against the
image's *other* captions, a copy of A earning 0 (eq. 11, and :func:`training.caption_eval.generation_metrics`
never scores a copy of the input as a paraphrase).

The common space is frozen in this stage: embeddings are computed once with the encoders in eval mode and
only the decoder learns, so the retrieval metrics are exactly those of the model the stage starts from.
Validation greedy-decodes the val split and computes CIDEr-D of both tasks with :class:`training.cider.CiderD`
(document frequencies from the val references, as the toolkit does); the stage keeps the best checkpoint.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import cast

import numpy as np
import torch
from tqdm.auto import tqdm

from training.data.vocab import tokenize
from training.inference.embedding import embed_split
from training.models.checkpoint import save_model
from .batches import embed_views, random_view
from .cider import CiderD
from .run_state import rng_state, set_rng_state
from .trainer import plan_stages


def leave_one_out_advantage(rewards: torch.Tensor) -> torch.Tensor:
    """``rewards`` (B, k), k ≥ 2 samples per input → ``r − mean(other k − 1 rewards of the same input)``."""
    samples = rewards.shape[1]
    if samples < 2:
        raise ValueError("the self-critical baseline needs at least 2 samples per input (scst.samples)")
    baseline = (rewards.sum(1, keepdim=True) - rewards) / (samples - 1)
    return rewards - baseline


def scst_loss(logprobs: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Rennie et al. eq. 7 with the leave-one-out baseline: ``logprobs`` (B·k,) of the samples (row-major:
    input i's samples at i·k … i·k + k − 1), ``rewards`` (B, k). Mean over the samples."""
    advantage = leave_one_out_advantage(rewards).reshape(-1).to(logprobs.device, logprobs.dtype)
    return -(advantage * logprobs).mean()


class _Split:
    """One split's conditioning vectors and reference sets for both tasks."""

    def __init__(self, dataset, image_emb: torch.Tensor, caption_emb: torch.Tensor,
                 image_views: torch.Tensor | None = None):
        self.captions = [tokenize(c) for r in dataset.images for c in r.captions]
        self.cap_to_img = [r.image_id for r in dataset.images for _ in r.captions]
        self.image_caps: dict[int, list[int]] = {}
        for j, img in enumerate(self.cap_to_img):
            self.image_caps.setdefault(img, []).append(j)
        self.images = sorted(self.image_caps)            # the images with captions
        self.image_emb, self.caption_emb = image_emb, caption_emb
        self.image_views = image_views                    # (N, V, E) for view augmentation (image.train_crops)
        # captioning: an image against all its captions; paraphrasing: caption j against its image's others
        self.caption_refs = {img: [self.captions[j] for j in caps] for img, caps in self.image_caps.items()}
        self.para_keys = [j for caps in self.image_caps.values() if len(caps) > 1 for j in caps]
        self.para_refs = {j: [self.captions[o] for o in self.image_caps[self.cap_to_img[j]] if o != j]
                          for j in self.para_keys}
        self.caption_cider = CiderD(self.caption_refs)
        self.para_cider = CiderD(self.para_refs) if self.para_refs else None


class SelfCriticalStage:
    """Runs ``scst.steps`` updates of the decoder of an :class:`training.stt.STTTrainer`'s model."""

    def __init__(self, trainer):
        self.trainer, self.cfg = trainer, trainer.cfg
        self.scst, self.decoding = self.cfg.scst, self.cfg.decoder
        model, device = trainer.model, trainer.device
        self.model, self.device = model, device
        self.splits = {}
        for name, dataset in (("train", trainer.train_set), ("val", trainer.val_set)):
            source = trainer.source(dataset, trainable=False, augment=name == "train")
            img, cap, _ = embed_split(model, dataset, device=device, amp=trainer.amp,
                                      workers=self.cfg.train.workers, source=source)
            # image.train_crops: each update reads a random view of each training image
            views = embed_views(model, source) if source.kind == "views" else None
            self.splits[name] = _Split(dataset, img.to(device), cap.to(device), views)
        self.words = model.vocab

    # --- one update ---------------------------------------------------------------------------------
    def _rewards(self, ids: list[list[int]], keys: list, cider: CiderD, copies: list | None) -> torch.Tensor:
        samples = self.scst.samples
        out = np.zeros((len(keys), samples), dtype=np.float32)
        for i, key in enumerate(keys):
            for j in range(samples):
                tokens = [self.words.idx2word[w] for w in ids[i * samples + j]]
                if copies is None or tokens != copies[i]:
                    out[i, j] = cider.score(key, tokens)
        return torch.from_numpy(out)

    def step(self, generator: torch.Generator, sample_generator: torch.Generator | None) -> dict | None:
        """One update's loss and mean rewards; None when the batch gives no task anything to do."""
        split, decoder, samples = self.splits["train"], self.model.decoder, self.scst.samples
        order = torch.randperm(len(split.images), generator=generator)[:self.scst.images_per_batch].tolist()
        images = [split.images[i] for i in order]
        tasks: list[tuple[str, float, torch.Tensor, list[int], CiderD, list[list[str]] | None]] = []
        picks: list[int] = []
        if self.decoding.lambda_ic > 0:
            emb = (split.image_emb[images] if split.image_views is None
                   else random_view(split.image_views[images], generator))
            tasks.append(("ic", self.decoding.lambda_ic, emb, images, split.caption_cider, None))
        if self.decoding.lambda_para > 0 and split.para_cider is not None:
            caps = [split.image_caps[i] for i in images if len(split.image_caps[i]) > 1]
            picks = [c[int(torch.randint(len(c), (1,), generator=generator))] for c in caps]
        if picks:                                       # none when every image drawn has a single caption
            para_cider = cast(CiderD, split.para_cider)     # picks are drawn only when it is set
            tasks.append(("para", self.decoding.lambda_para, split.caption_emb[picks], picks, para_cider,
                          [split.captions[j] for j in picks]))
        if not tasks:
            return None
        # both tasks in one decoder batch, as in eq. 12's teacher-forced training
        z = torch.cat([t[2] for t in tasks])
        ids, logprobs = decoder.sample(z, n=samples, max_len=self.decoding.max_len,
                                       no_repeat=self.decoding.no_repeat, generator=sample_generator)
        loss: float | torch.Tensor = 0.0
        parts, start = {}, 0
        for name, lam, _emb, keys, cider, copies in tasks:
            rows = len(keys) * samples
            rewards = self._rewards(ids[start:start + rows], keys, cider, copies)
            loss = loss + lam * scst_loss(logprobs[start:start + rows], rewards)
            parts[name] = float(rewards.mean())
            start += rows
        return {"loss": loss, "reward": parts}

    # --- validation: greedy CIDEr-D of both tasks on val ------------------------------------------
    @torch.no_grad()
    def validate(self, batch_size: int = 500) -> dict:
        split, decoder = self.splits["val"], self.model.decoder
        was_training = self.model.training
        self.model.eval()

        def greedy(emb: torch.Tensor) -> list[list[str]]:
            out = []
            for s in range(0, emb.shape[0], batch_size):
                hyps = decoder.greedy(emb[s:s + batch_size], self.decoding.max_len, self.decoding.length_penalty,
                                      self.decoding.no_repeat)
                out += [[self.words.idx2word[w] for w in h.ids] for h in hyps]
            return out

        images = split.images
        captions = greedy(split.image_emb[images])
        val = {"cider_ic": split.caption_cider.corpus_score(dict(zip(images, captions)))}
        if split.para_cider is not None:
            para = greedy(split.caption_emb[split.para_keys])
            scores = [0.0 if p == split.captions[j] else split.para_cider.score(j, p)
                      for j, p in zip(split.para_keys, para)]
            val["cider_para"] = float(np.mean(scores))
        self.model.train(was_training)
        return {k: round(v, 5) for k, v in val.items()}

    def selection_score(self, val: dict) -> float:
        weights = {"cider_ic": self.decoding.lambda_ic, "cider_para": self.decoding.lambda_para}
        used = {k: w for k, w in weights.items() if k in val and w > 0}
        return sum(w * val[k] for k, w in used.items()) / sum(used.values())

    # --- the loop -----------------------------------------------------------------------------------
    def save_state(self, step: int, optimizer, generator, sample_generator, best: float, records: list[dict],
                   elapsed: float) -> None:
        """``RUN_DIR/last.pt`` after an update's validation: the weights, the decoder's optimiser, both sampling
        generators and the global RNGs (dropout), the best score and the stage's log records so far."""
        index = len(plan_stages(self.cfg, self.model.backbone_pretrained))      # after every eq. 12 stage
        self.trainer.write_state("scst", index, step, elapsed,
                                 scst={"step": step, "optimizer": optimizer.state_dict(), "rng": rng_state(generator),
                                       "sample_generator": sample_generator.get_state(), "best": best,
                                       "records": records})

    def run(self, out_dir: Path, log_path: Path, progress: bool = True, log=print, state: dict | None = None) -> dict:
        """The stage; ``state`` (a ``last.pt`` written by :meth:`save_state`) continues it after that update."""
        scst, train = self.scst, self.cfg.train
        model, decoder = self.model, self.model.decoder
        params = [p for p in decoder.parameters() if p.requires_grad]
        if not params:
            raise ValueError("scst: the decoder has no trainable parameter (is 'decoder' in train.freeze?)")
        for p in model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        optimizer = torch.optim.Adam(params, lr=scst.lr)
        generator = torch.Generator().manual_seed(train.seed)
        sample_generator = (torch.Generator(device=self.device).manual_seed(train.seed + 1))
        if state is None:
            start = time.time()
            val = self.validate()
            best = self.selection_score(val)
            save_model(model, out_dir / "model.pt", extra={"val": val, "stage": "scst", "step": 0})
            record = {"stage": "scst", "step": 0, "val": val, "best": True,
                      "elapsed_s": round(time.time() - start, 1)}
            records, first = [record], 1
            _append(log_path, record)
            log(f"[scst 0/{scst.steps}] val CIDEr-D (greedy) {val}")
        else:                         # the weights are already the state's (Trainer.run loaded them)
            own = state["scst"]
            optimizer.load_state_dict(own["optimizer"])
            set_rng_state(own["rng"], generator)
            sample_generator.set_state(own["sample_generator"])
            best, records, first = own["best"], list(own["records"]), own["step"] + 1
            start = time.time() - state["elapsed_s"]
            for record in records:    # Trainer.run rewrote log.jsonl with the eq. 12 records only
                _append(log_path, record)
        model.eval()                  # encoders frozen: no dropout there
        decoder.train()               # the samples come from the training-mode decoder (its dropout on)
        rewards, losses = [], []
        bar = tqdm(range(first, scst.steps + 1), desc="scst", disable=not progress, unit="step",
                   initial=first - 1, total=scst.steps)
        for step in bar:
            out = self.step(generator, sample_generator)
            if out is not None:
                optimizer.zero_grad(set_to_none=True)
                out["loss"].backward()
                if train.grad_clip:
                    torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
                optimizer.step()
                losses.append(float(out["loss"].detach()))
                rewards.append(out["reward"])
                bar.set_postfix({f"r_{k}": f"{v:.3f}" for k, v in out["reward"].items()})
            if step % scst.eval_every == 0 or step == scst.steps:
                val = self.validate()
                decoder.train()
                score = self.selection_score(val)
                record = {"stage": "scst", "step": step,
                          "loss": round(float(np.mean(losses)), 5) if losses else None,
                          "reward": {k: round(float(np.mean([r[k] for r in rewards])), 5)
                                     for k in (rewards[0] if rewards else {})},
                          "val": val, "elapsed_s": round(time.time() - start, 1)}
                rewards, losses = [], []
                if score > best:
                    best, record["best"] = score, True
                    save_model(model, out_dir / "model.pt", extra={"val": val, "stage": "scst", "step": step})
                _append(log_path, record)
                records.append(record)
                self.save_state(step, optimizer, generator, sample_generator, best, records, time.time() - start)
                log(f"[scst {step}/{scst.steps}] train reward {record['reward']} val {val}"
                    f"{' (best)' if record.get('best') else ''} {record['elapsed_s']}s")
        return {"scst_best_val_cider": round(best, 5), "scst_seconds": round(time.time() - start, 1)}


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
