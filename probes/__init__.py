"""The probe catalogue, installed as ``tangentlens.probes``.

Each probe module declares one :class:`~tangentlens.contract.Probe` (``PROBE``): its name, its
frozen config dataclass (defined in the module: a recipe validates without importing torch), what
it needs captured, its scope and a ``rows`` function turning one step's
:class:`~tangentlens.capture.Capture` (what ``tangentlens.capture_model`` returns, and what a
sweep's step unit builds) into tidy result rows (:mod:`tangentlens.results`); the tangent probes
also read proxies ``{site: {method: basis}}`` (fitted by :mod:`~tangentlens.proxies`, or your
own through :mod:`~tangentlens.user_proxies`). The package's names are its modules, found in
its folder (a new probe is its module: nothing here lists it) and imported on first use; the
subpackage ``render`` holds the renderers a probe's reporting names by import path.
"""

import importlib
import pkgutil
from types import ModuleType

__all__ = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.ispkg)


def __getattr__(name: str) -> ModuleType:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
