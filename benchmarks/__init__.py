"""Side-by-side benchmarks of tangentlens against reference implementations (``make bench``)."""
