"""tangentlens.models."""
