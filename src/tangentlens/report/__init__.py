"""tangentlens.report."""
