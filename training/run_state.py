"""A training run's state between epochs: ``RUN_DIR/last.pt`` (what ``jointspace train --resume`` reads) and the
random generators saved in it and put back."""
from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import torch


STATE_FORMAT = "jointspace-train-state/1"
STATE_FILE = "last.pt"


def _state_globals() -> list:
    """The classes a ``last.pt`` may hold besides tensors and plain values: numpy's random state (an array of
    uint32 and its dtype). Nothing else is unpickled."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return [np.ndarray, np.dtype, _reconstruct, type(np.dtype(np.uint32))]


def load_train_state(run_dir: str | Path) -> dict:
    """The ``last.pt`` of a run directory (``jointspace train --resume``), unpickled with ``weights_only=True``
    and only numpy's random state allowed besides (:func:`_state_globals`): a file that holds any other object
    is refused, never run."""
    path = Path(run_dir) / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: nothing to resume (a run writes it after its first epoch)")
    try:
        with torch.serialization.safe_globals(_state_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path} holds objects a training state does not (only tensors, plain values and numpy's "
                         f"random state are read): {str(err).splitlines()[0]}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path} is not a jointspace training state (expected format {STATE_FORMAT})")
    return state


def rng_state(generator: torch.Generator) -> dict:
    """The sampler's generator and the global generators (dropout, shuffles) at an epoch's end."""
    out = {"sampler": generator.get_state(), "torch": torch.get_rng_state(), "numpy": np.random.get_state(),
           "python": random.getstate()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def seed_rank(seed: int, rank: int) -> None:
    """Rank ``rank``'s global generators (dropout, augmentation) in a multi-process run: rank 0 keeps the stream
    one process has, each other rank starts its own."""
    if rank == 0:
        return
    derived = (seed * 1_000_003 + rank) % (1 << 31)
    random.seed(derived)
    np.random.seed(derived)
    torch.manual_seed(derived)


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    """Puts back what :func:`rng_state` saved."""
    generator.set_state(state["sampler"])
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
