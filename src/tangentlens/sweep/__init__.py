"""tangentlens.sweep."""
