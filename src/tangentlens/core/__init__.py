"""tangentlens.core: the measurement core that a notebook call (:func:`tangentlens.measure`) and a
sweep (:mod:`tangentlens.sweep`) share — the recipe (:mod:`~tangentlens.core.recipe`), the recipe
resolved once against its suite or model (:mod:`~tangentlens.core.resolve`: the checks, what each
capture keeps, the memory plan of :mod:`~tangentlens.core.memory`, the estimator notes of
:mod:`~tangentlens.core.estimators`), the analysis data of a run (:mod:`~tangentlens.core.data`)
and one step's capture and probe rows (:mod:`~tangentlens.core.step`). The sweep adds planning,
units, executors and the store around it."""
