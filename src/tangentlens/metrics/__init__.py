"""tangentlens.metrics."""
