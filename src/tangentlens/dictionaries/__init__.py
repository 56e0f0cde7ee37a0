"""tangentlens.dictionaries."""
