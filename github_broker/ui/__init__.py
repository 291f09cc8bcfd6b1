"""The maintainers' dashboard: server-rendered pages over the overview, and offline /docs."""
