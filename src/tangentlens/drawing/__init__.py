"""The drawing kit every renderer shares, the report's (:mod:`tangentlens.report`) and the
probes' own (``tangentlens.probes.render``): table cells, step labels and a steps × columns
table (:mod:`~tangentlens.drawing.tables`), lines with their interval as a band and the steps
axis (:mod:`~tangentlens.drawing.plots`), what a figure of ``compare`` reads of a comparison
(:mod:`~tangentlens.drawing.compared`). It sits below the probes, so a probe's renderer draws as
the report does without importing it; it names no probe."""
