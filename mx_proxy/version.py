"""The package version (kept apart so that low modules can read it without importing the package face)."""

__version__ = "0.2.0"
