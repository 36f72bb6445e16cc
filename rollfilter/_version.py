"""The package's version, alone in a module: what needs it imports this, never the package root."""

__version__ = "0.2.0"
