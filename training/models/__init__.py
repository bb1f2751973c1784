"""The model library: image backbones, text encoders, projections, pooling, similarities, losses, the STT
sentence decoder and region attention, the registry (``factory.py``) and the joint embedding model with its
checkpoint (``model.py``).

It imports ``training.data`` (vocabulary, preprocessing, caches) and nothing of the application (the modules of
``training/`` itself). This file imports nothing: import the modules themselves.
"""
