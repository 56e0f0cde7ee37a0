"""tangentlens.data."""
