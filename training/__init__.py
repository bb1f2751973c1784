"""jointspace.training — data, vocabulary, encoders, losses, train loop and evaluation.

Nothing here imports ``index`` or ``service``: data flows one way (training → index → service).
"""
__version__ = "0.1.0"
