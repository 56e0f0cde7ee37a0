"""tangentlens.models: checkpoint suites, loading without weight processing, hook sites, the
mini suites' training and the untrained-block experiment. The only package that imports
transformer_lens and transformers."""

from tangentlens.models.loading import (
    DECODER_ARCHITECTURES,
    ENCODER_ARCHITECTURES,
    load_local_checkpoint,
    load_pythia_checkpoint,
)
from tangentlens.models.schedule import (
    PYTHIA_STEPS,
    PYTHIA_TOKENS_PER_STEP,
    log_spaced_schedule,
    select_steps,
)
from tangentlens.models.sites import (
    SITE_KINDS,
    hook_name,
    model_family,
    parse_site,
    residual_sites,
    site_kinds,
)
from tangentlens.models.suites import (
    SUITE_KINDS,
    CheckpointSuite,
    LocalSuite,
    MiniSuite,
    PythiaSuite,
    ensure_mini_suite,
    open_suite,
)
from tangentlens.models.training import MINI_SUITE_CONFIGS, MiniSuiteConfig

__all__ = [
    "DECODER_ARCHITECTURES",
    "ENCODER_ARCHITECTURES",
    "MINI_SUITE_CONFIGS",
    "PYTHIA_STEPS",
    "PYTHIA_TOKENS_PER_STEP",
    "SITE_KINDS",
    "SUITE_KINDS",
    "CheckpointSuite",
    "LocalSuite",
    "MiniSuite",
    "MiniSuiteConfig",
    "PythiaSuite",
    "ensure_mini_suite",
    "hook_name",
    "load_local_checkpoint",
    "load_pythia_checkpoint",
    "log_spaced_schedule",
    "model_family",
    "open_suite",
    "parse_site",
    "residual_sites",
    "select_steps",
    "site_kinds",
]
