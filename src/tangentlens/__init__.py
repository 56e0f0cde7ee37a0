"""tangentlens: the geometry of transformer representations during training."""

__version__ = "0.1.0"
