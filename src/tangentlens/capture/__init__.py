"""tangentlens.capture."""
