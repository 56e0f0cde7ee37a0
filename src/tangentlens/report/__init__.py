"""The run's report and the comparison's: console tables, PNG figures, progress. They dispatch
to what each present probe declares (:mod:`tangentlens.reporting`), drawing the declared tables
and figures themselves or loading the probe's own renderer by import path; no probe is named
here."""
