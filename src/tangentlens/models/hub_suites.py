"""The catalogue of published checkpoint suites on the Hugging Face hub that the papers measured
(beside Pythia): each suite's hub id, family, loader, revision name per step, tokens seen per step,
the published ``config.json`` fields that shape the model (for the memory plan and the test
caches) and whether all of it was confirmed, with the source. No torch, no model library.

>>> HUB_SUITES["HuggingFaceTB/SmolLM2-360M-intermediate-checkpoints"].revision(160_000)
'step-160000'
>>> resolve_hub_suite("olmo-1b").hub_id
'allenai/OLMo-1B-hf'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HUB_ALIASES",
    "HUB_SUITES",
    "REFUSED_HUB_IDS",
    "HubSuiteEntry",
    "resolve_hub_suite",
]


@dataclass(frozen=True)
class HubSuiteEntry:
    """One published suite: ``revisions`` maps each step (ascending) to its hub revision;
    ``tokens_per_step`` None when unknown; ``loader`` the one ``"auto"`` picks; ``verified``
    says whether the id, the revision names and the tokens were confirmed (``source``);
    ``note`` what is known to be uncertain or special."""

    hub_id: str
    short_name: str
    family: str
    loader: str
    revisions: tuple[tuple[int, str], ...]
    tokens_per_step: int | None
    config: dict[str, Any] = field(hash=False)
    verified: bool
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        steps = [step for step, _ in self.revisions]
        if not steps or steps != sorted(set(steps)):
            raise ValueError(f"{self.hub_id}: revisions must name distinct ascending steps")

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(step for step, _ in self.revisions)

    def revision(self, step: int) -> str:
        """The hub revision (branch) holding ``step``; a ``ValueError`` for another step."""
        for known, name in self.revisions:
            if known == step:
                return name
        raise ValueError(
            f"step {step} is not a checkpoint of {self.hub_id}; steps: {list(self.steps)}"
        )


def _every(first: int, last: int, name: str) -> tuple[tuple[int, str], ...]:
    """Steps ``first, 2·first, …, last`` named ``name.format(step=…)``."""
    return tuple((step, name.format(step=step)) for step in range(first, last + 1, first))


def _llama(hidden: int, layers: int, heads: int, kv: int, mlp: int, vocab: int, ctx: int,
           rope: float, tied: bool) -> dict[str, Any]:  # fmt: skip
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": mlp,
        "vocab_size": vocab,
        "max_position_embeddings": ctx,
        "rope_theta": rope,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
    }


#: OLMo-1B-hf's branches named in public code that loads them (the repository holds ~351, from
#: step1000-tokens4B to step738020-tokens3094B). The tokens in a name are not step × 4,194,304
#: rounded (step738000 is ``tokens3094B``, not 3095), so the names are listed, not computed.
_OLMO_1B_HF = (
    (1000, "step1000-tokens4B"), (2000, "step2000-tokens8B"), (3000, "step3000-tokens12B"),
    (4000, "step4000-tokens16B"), (5000, "step5000-tokens20B"), (10000, "step10000-tokens41B"),
    (20000, "step20000-tokens83B"), (40000, "step40000-tokens167B"),
    (80000, "step80000-tokens335B"), (110000, "step110000-tokens461B"),
    (117850, "step117850-tokens494B"), (330000, "step330000-tokens1383B"),
    (343000, "step343000-tokens1438B"), (369000, "step369000-tokens1547B"),
    (425000, "step425000-tokens1781B"), (460000, "step460000-tokens1928B"),
    (509000, "step509000-tokens2134B"), (593000, "step593000-tokens2486B"),
    (620000, "step620000-tokens2599B"), (640000, "step640000-tokens2683B"),
    (720000, "step720000-tokens3018B"), (738000, "step738000-tokens3094B"),
    (738020, "step738020-tokens3094B"),
)  # fmt: skip

_ENTRIES = (
    HubSuiteEntry(
        hub_id="allenai/OLMo-1B-hf",
        short_name="olmo-1b",
        family="decoder",
        loader="bridge",
        revisions=_OLMO_1B_HF,
        tokens_per_step=2048 * 2048,
        config={
            "architectures": ["OlmoForCausalLM"],
            "model_type": "olmo",
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "intermediate_size": 8192,
            "vocab_size": 50304,
            "max_position_embeddings": 2048,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "attention_bias": False,
            "clip_qkv": None,
            "tie_word_embeddings": True,
            "pad_token_id": 1,
            "eos_token_id": 50279,
        },
        verified=True,
        source="OLMo-1B model card (naming step{N}-tokens{M}B, 2048 × 2048-token batches); "
        "branch names and sizes as public code loading allenai/OLMo-1B-hf uses them "
        "(TransformerLens' OLMo-1B-hf config)",
        note="23 of the repository's ~351 branches: those whose exact names were confirmed offline",
    ),
    HubSuiteEntry(
        hub_id="HuggingFaceTB/SmolLM2-360M-intermediate-checkpoints",
        short_name="smollm2-360m",
        family="decoder",
        loader="bridge",
        revisions=_every(160_000, 2_560_000, "step-{step}"),
        tokens_per_step=1_572_864,
        config=_llama(960, 32, 15, 5, 2560, 49152, 8192, 100000.0, True),
        verified=True,
        source="the repository's model card (a checkpoint every 160,000 steps, ~250B tokens; "
        "global batch 1,572,864 tokens); step-2560000 is the last branch",
    ),
    HubSuiteEntry(
        hub_id="HuggingFaceTB/SmolLM2-1.7B-intermediate-checkpoints",
        short_name="smollm2-1.7b",
        family="decoder",
        loader="bridge",
        revisions=_every(125_000, 5_125_000, "step-{step}"),
        tokens_per_step=2_097_152,
        config=_llama(2048, 24, 32, 32, 8192, 49152, 8192, 130000.0, True),
        verified=True,
        source="branch names step-125000 … step-5125000 as public code loading the repository "
        "lists them; 2,097,152 tokens per step as public evaluation scripts use it",
        note="the card's '~250B tokens per 125,000 steps' reads as 2.0M tokens per step; "
        "2,097,152 (2^21) fits the ~11T tokens of training",
    ),
    HubSuiteEntry(
        hub_id="almanach/Gaperon-1125-1B",
        short_name="gaperon-1.5b",
        family="decoder",
        loader="bridge",
        revisions=((1, "main"),),
        tokens_per_step=None,
        config=_llama(2048, 16, 32, 8, 8192, 128256, 4096, 500000.0, False),
        verified=False,
        source="Gaperon-1125-1B model card (1.5B parameters, Llama 3 architecture and sizes)",
        note="the names of its intermediate revisions were not confirmed offline: step 1 "
        "stands for main, the final checkpoint; the repository is gated (accept its terms)",
    ),
    HubSuiteEntry(
        hub_id="EuroBERT/EuroBERT-210m",
        short_name="eurobert-210m",
        family="encoder",
        loader="hf",
        revisions=((1, "main"),),
        tokens_per_step=None,
        config={
            "architectures": ["EuroBertForMaskedLM"],
            "model_type": "eurobert",
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "num_key_value_heads": 12,
            "intermediate_size": 3072,
            "vocab_size": 128256,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
        },
        verified=False,
        source="repository id from public code loading it; sizes: transformers' EuroBertConfig "
        "defaults (EuroBERT-210m)",
        note="the paper releases intermediate checkpoints; their revision names were not "
        "confirmed offline: step 1 stands for main, the final checkpoint",
    ),
    HubSuiteEntry(
        hub_id="EuroBERT/EuroBERT-610m",
        short_name="eurobert-610m",
        family="encoder",
        loader="hf",
        revisions=((1, "main"),),
        tokens_per_step=None,
        config={
            "architectures": ["EuroBertForMaskedLM"],
            "model_type": "eurobert",
            "hidden_size": 1152,
            "num_hidden_layers": 26,
            "num_attention_heads": 18,
            "num_key_value_heads": 6,
            "intermediate_size": 4096,
            "vocab_size": 128256,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
        },
        verified=False,
        source="repository id from public code loading it",
        note="sizes and intermediate revision names not confirmed offline: step 1 stands for "
        "main, the final checkpoint",
    ),
    HubSuiteEntry(
        hub_id="almanach/moderncamembert-base",
        short_name="moderncamembert-base",
        family="encoder",
        loader="hf",
        revisions=((1, "main"),),
        tokens_per_step=None,
        config={
            "architectures": ["ModernBertForMaskedLM"],
            "model_type": "modernbert",
            "hidden_size": 768,
            "num_hidden_layers": 22,
            "num_attention_heads": 12,
            "intermediate_size": 1152,
            "vocab_size": 32768,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": True,
        },
        verified=False,
        source="repository id as ModernCamemBERT-bio's card names its base model; sizes: "
        "ModernBERT-base's (transformers' ModernBertConfig defaults)",
        note="vocabulary size and intermediate revision names not confirmed offline: step 1 "
        "stands for main, the final checkpoint",
    ),
)

#: Hub id → catalogue entry.
HUB_SUITES: dict[str, HubSuiteEntry] = {entry.hub_id: entry for entry in _ENTRIES}
#: Short name → hub id.
HUB_ALIASES: dict[str, str] = {entry.short_name: entry.hub_id for entry in _ENTRIES}
#: Hub ids that are refused, with the reason and what to use instead.
REFUSED_HUB_IDS: dict[str, str] = {
    "allenai/OLMo-1B": "its checkpoints need the hf_olmo package (ai2-olmo), which no loader "
    "here bridges; use 'allenai/OLMo-1B-hf' (the same run, transformers-native)",
}


def resolve_hub_suite(name: str) -> HubSuiteEntry:
    """The catalogue entry a hub id or short name (:data:`HUB_ALIASES`) names; a refused id
    (:data:`REFUSED_HUB_IDS`) or an unknown name is a ``ValueError``."""
    if name in REFUSED_HUB_IDS:
        raise ValueError(f"suite {name!r} is not supported: {REFUSED_HUB_IDS[name]}")
    hub_id = HUB_ALIASES.get(name, name)
    if hub_id not in HUB_SUITES:
        raise ValueError(
            f"unknown hub suite {name!r}; allowed: {list(HUB_SUITES)} or their short names "
            f"{list(HUB_ALIASES)}"
        )
    return HUB_SUITES[hub_id]
