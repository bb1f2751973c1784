"""jointspace.index — embed a gallery and a caption corpus, FAISS build/add/remove/load, metadata."""
