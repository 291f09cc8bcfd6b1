"""github-broker: turns GitHub issues into a work queue for AI coding agents."""

__version__ = "0.2.0"
