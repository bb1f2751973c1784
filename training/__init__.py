"""jointspace.training: the model library, its data, and the application that trains and evaluates models.

* ``training.models`` — the model library: image backbones, text encoders, projections, pooling, similarities,
  losses, the sentence decoder and region attention, the registry (``factory.py``) and the joint embedding model
  with its ``model.pt`` (``model.py``).
* ``training.data`` — data sets and their readers, vocabulary and tokeniser, the synthetic set, image
  preprocessing, feature and token-state caches, crash-safe file writes.
* ``training`` itself — the application: run configuration, the training loops (retrieval, STT, SCST,
  distributed), evaluation, inference (embedding, generation, composition), the zoo and the commands.

Imports run one way: the application → ``training.models`` → ``training.data``. Nothing here imports ``index``
or ``service``: data flows one way (training → index → service).
"""
__version__ = "0.1.0"
