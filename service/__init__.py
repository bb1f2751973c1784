"""jointspace.service — the HTTP front: FastAPI app, dynamic batcher, schemas; also the CLI entry point."""
