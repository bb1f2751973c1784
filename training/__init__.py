"""jointspace.training: the model library (its three subpackages) and the application that trains and evaluates
models (the modules of ``training/`` itself).

The library, all that ``index`` and ``service`` import of ``training``:

* ``training.data`` — data sets and their readers, vocabulary and tokeniser, the synthetic set, image
  preprocessing, where a split's images come from (feature and pixel caches), token-state caches, crash-safe
  file writes.
* ``training.models`` — image backbones, text encoders, projections, pooling, similarities, losses, the sentence
  decoder and region attention, the registry (``factory.py``) and the joint embedding model with its
  ``model.pt`` (``model.py``).
* ``training.inference`` — embedding, batch shapes, generation, composition, device resolution, the shipped
  models and the query bank a checkpoint carries.

The application: run configuration, the training loops (retrieval, STT, SCST, distributed), evaluation, the zoo
and the ``jointspace`` training commands (``cli.py``).

Imports run one way: the application → ``training.inference`` → ``training.models`` → ``training.data``
(docs/architecture.md). Nothing here imports ``index`` or ``service``: data flows one way (training → index →
service).
"""
__version__ = "0.1.0"
