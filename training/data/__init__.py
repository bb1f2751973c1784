"""Data: captioned image data sets and their readers (``datasets.py``), vocabulary and tokeniser, the
synthetic set, image preprocessing, the feature and token-state caches, where a split's images come from
(``sources.py``), and crash-safe file writes.

It imports nothing of ``training.models`` or of the application. This file imports nothing: import the modules
themselves.
"""
