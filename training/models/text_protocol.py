"""What training, the model and checkpoints use of a sentence encoder (``text.encoder``): the :class:`TextEncoder`
protocol, as models/protocol.py is the common-space model's, and :class:`TextEncoderBase`, the module every
encoder subclasses, with the defaults of the optional hooks (text_encoders.py says what each hook is for). The
hooks are called by name, never looked up; a hook an encoder does not need is the base class's no-op."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
from torch import nn

from training.data.vocab import Vocabulary


class TextEncoder(Protocol):
    """A sentence encoder (``text.encoder``): padded ids ``(B, T)`` and lengths ``(B,)`` → ``(B, out_dim)``, and
    the hooks training calls (text_encoders.py says what each does; ``TextEncoderBase`` gives the defaults)."""

    out_dim: int
    tokenizes: bool          # encode_text makes ids of its own (WordPiece, n-gram features), not vocabulary word ids

    def __call__(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor: ...
    def fit(self, texts: Sequence[str], vocab: Vocabulary, log: Callable[..., None] = print) -> None: ...
    def encode_text(self, text: str, vocab: Vocabulary, max_len: int | None = None) -> list[int]: ...
    def encode_texts(self, texts: Sequence[str], vocab: Vocabulary, max_len: int | None = None) -> list[list[int]]: ...
    def cache_inputs(self, id_lists: Sequence[Sequence[int]], cache_dir: str | Path, dtype: str = "float16",
                     progress: bool = True, log: Callable[..., None] = print) -> None: ...
    def regularizer(self) -> torch.Tensor | None: ...
    @property
    def training(self) -> bool: ...
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...
    def train(self, mode: bool = True) -> Any: ...
    def eval(self) -> Any: ...


class TextEncoderBase(nn.Module):
    """Padded ids ``(B, T)`` and lengths ``(B,)`` → sentence vectors ``(B, out_dim)``, and the hooks training calls
    (module docstring), each a no-op here unless an encoder overrides it."""

    out_dim: int
    tokenizes: bool = False     # True: ``encode_text`` makes ids of its own (not the vocabulary's word ids)

    def fit(self, texts: Sequence[str], vocab: Vocabulary, log: Callable[..., None] = print) -> None:
        """Learns data-dependent state from the training captions (nothing by default)."""

    def encode_text(self, text: str, vocab: Vocabulary, max_len: int | None = None) -> list[int]:
        """The ids this encoder reads for ``text``: ``vocab``'s word ids unless it tokenises itself."""
        return vocab.encode(text, max_len=max_len)

    def encode_texts(self, texts: Sequence[str], vocab: Vocabulary, max_len: int | None = None) -> list[list[int]]:
        """:meth:`encode_text` of each of ``texts``, in one call (an encoder with a batch tokeniser overrides it)."""
        return [self.encode_text(t, vocab, max_len) for t in texts]

    def cache_inputs(self, id_lists: Sequence[Sequence[int]], cache_dir: str | Path, dtype: str = "float16",
                     progress: bool = True, log: Callable[..., None] = print) -> None:
        """Runs a frozen bottom once over the training sentences (nothing by default)."""

    def regularizer(self) -> torch.Tensor | None:
        """A term the training loss adds, from the last forward (None by default)."""
        return None
