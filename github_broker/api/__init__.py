"""The HTTP layer: FastAPI app, routes, auth and the error table."""
