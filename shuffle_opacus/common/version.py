"""The package version, in a module that imports nothing (the package and its parts read it)."""

__version__ = "0.1.0"
