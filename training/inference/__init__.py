"""The inference API: what ``index`` and ``service`` use of a trained model besides the model itself — embedding
images, files, texts and data splits (``embedding.py``), the image tower's CPU inference backend (OpenVINO, ONNX
Runtime: ``backend.py``), the fixed batch shapes of a server (``shapes.py``),
captions and paraphrases (``generate.py``), query composition (``compose.py``), the device a command runs on
(``device.py``), the shipped models (``pretrained.py``) and hubness correction: QB-Norm, the query bank a
checkpoint carries and making one (``querybank.py``).

It imports ``training.models`` and ``training.data`` and nothing of the application (the modules of
``training/`` itself). This file imports nothing: import the modules themselves.
"""
