"""tangentlens.core: the measurement core that a notebook call (:func:`tangentlens.measure`) and a
sweep (:mod:`tangentlens.sweep`) share — the recipe (:mod:`~tangentlens.core.recipe`), the analysis
data of a run (:mod:`~tangentlens.core.data`) and one step's capture and probe rows
(:mod:`~tangentlens.core.step`). The sweep adds planning, units, executors and the store around
it."""
