"""tangentlens.models: checkpoint suites, loading without weight processing, hook sites, the
mini suites' training and the untrained-block experiment. The only package that imports
transformer_lens and transformers.

Its names are imported on first use: the catalogue of suites and their steps
(:mod:`~tangentlens.models.catalog`), the schedules and the configs
(:mod:`~tangentlens.models.configs`) load without torch or any model library.
"""

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".catalog": (
            "DEFAULT_LOADERS",
            "HEADLESS_ARCHITECTURES",
            "LOADERS",
            "SUITE_KINDS",
            "resolve_loader",
            "suite_loader",
        ),
        ".hub_suites": ("HUB_SUITES", "HubSuiteEntry"),
        ".configs": ("MINI_SUITE_CONFIGS", "MiniSuiteConfig"),
        ".adapter": ("LensModel",),
        ".lens": ("BridgeLens", "HookedLens", "lens_model"),
        ".loading": (
            "DECODER_ARCHITECTURES",
            "ENCODER_ARCHITECTURES",
            "boot_bridge",
            "has_lm_head",
            "load_local_checkpoint",
            "load_pythia_checkpoint",
        ),
        ".schedule": (
            "PYTHIA_STEPS",
            "PYTHIA_TOKENS_PER_STEP",
            "log_spaced_schedule",
            "select_steps",
        ),
        ".sites": ("SITE_KINDS",),
        ".suites": (
            "CatalogueSuite",
            "CheckpointSuite",
            "HubSuite",
            "LocalSuite",
            "MiniSuite",
            "PythiaSuite",
            "ensure_mini_suite",
            "open_suite",
        ),
    },
)
