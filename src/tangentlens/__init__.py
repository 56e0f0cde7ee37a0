"""tangentlens: the geometry of transformer representations during training.

From a notebook: ``tangentlens.measure(model, texts)`` runs the per-step probes on a model in
memory and returns a :class:`ResultTable`; ``tangentlens.capture_model(model, texts)`` captures
once for many measurements (a :class:`Capture`, which saves and reloads); ``open_suite`` loads
checkpoints; ``compare(runs)`` puts run directories side by side (a :class:`Comparison`). The
names are imported on first use.
"""

from tangentlens._lazy import lazy_exports

__version__ = "0.1.0"

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".notebook": ("capture_model", "measure"),
        ".results": ("ResultTable",),
        ".capture.captured": ("Capture",),
        ".models.suites": ("open_suite",),
        ".comparison": ("Comparison", "compare"),
    },
)
