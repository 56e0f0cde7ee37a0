"""The built-in probes' own renderers, one module per probe that declares any (named like it):
the tables and figures a probe's ``Reporting`` names by import path (``render=
"tangentlens.probes.render.<probe>:<function>"``). They live beside the probe, not in
:mod:`tangentlens.report`, which only dispatches; they draw with :mod:`tangentlens.drawing`, and
the probe modules import none of them (a probe stays light: recipes and plans import it)."""
