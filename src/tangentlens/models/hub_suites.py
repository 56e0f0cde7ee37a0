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


def _eurobert(hidden: int, layers: int, heads: int, kv: int, mlp: int) -> dict[str, Any]:
    """A EuroBERT config: the Llama layout (vocabulary 128,256, 8192 positions, untied) as a
    masked-LM encoder, without a ``rope_theta`` of its own (the model type's default)."""
    config = _llama(hidden, layers, heads, kv, mlp, 128256, 8192, 0.0, False)
    del config["rope_theta"]
    return {**config, "architectures": ["EuroBertForMaskedLM"], "model_type": "eurobert"}


#: OLMo-1B-hf's branches whose exact names public code loading the repository spells out (it holds
#: 351, step1000-tokens4B … step738020-tokens3094B). The run's checkpoint steps are listed in
#: allenai/OLMo ``checkpoints/official/OLMo-1B.csv``, but the tokens in a name are neither step ×
#: 4,194,304 rounded nor floored (step330000 is ``tokens1383B`` for 1384.1B; step738000 is
#: ``tokens3094B`` for 3095.4B), and they differ from allenai/OLMo-1B's own branches, which do round
#: (``step20000-tokens84B`` there, ``step20000-tokens83B`` here): listed, not computed.
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
        source="the allenai/OLMo-1B card https://huggingface.co/allenai/OLMo-1B (naming "
        "step{N}-tokens{M}B, a checkpoint every 1000 steps, revisions.txt) and allenai/OLMo "
        "configs/official/OLMo-1B.yaml (2048 × 2048-token batches); each of the 23 branch "
        "names as public code passes it to from_pretrained/snapshot_download for "
        "allenai/OLMo-1B-hf (checkpoint lists of 5 to 13 names in training-dynamics and "
        "interpretability repositories, offline corpus); sizes: TransformerLens' OLMo-1B-hf "
        "config",
        note="23 of the repository's 351 branches, each name seen verbatim in public code; the "
        "run's other checkpoint steps are in allenai/OLMo checkpoints/official/OLMo-1B.csv "
        "(~350 rows, 1000 … 738020), but which of them are branches here, and their token "
        "suffixes, were not found offline and cannot be derived (see above); "
        "list_repo_refs('allenai/OLMo-1B-hf') gives them all",
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
        source="https://huggingface.co/HuggingFaceTB/SmolLM2-1.7B-intermediate-checkpoints "
        "(revisions step-{N}, a checkpoint every 125,000 steps); branch names step-125000 … "
        "step-5125000 as public code loading the repository lists them; 2,097,152 tokens per "
        "step: a public evaluation script (TOK_PER_IT=2097152) and the 1.7B run's nanotron "
        "config (https://huggingface.co/nouamanetazi/smollm2_8T config.yaml: "
        "consumed_train_samples 3,927,040,000 at step 3,835,000, i.e. 1024 sequences a step)",
        note="1024 sequences a step × 2048 tokens (the sequence length is inferred from the "
        "script's 2^21, not read from the config excerpt); the card's '~250B tokens per 125,000 "
        "steps' is that rounded (125,000 × 2^21 = 262B), and 5,125,000 × 2^21 = 10.7T fits ~11T",
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
        source="https://huggingface.co/almanach/Gaperon-1125-1B (1.5B parameters, Llama 3: "
        "hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192, vocabulary 128,256, context "
        "4096, RoPE θ 500,000, ~3T tokens); untied embeddings: NathanGodey/gapetron "
        "configs/models/1B/llama.json (tie_word_embeddings false); the Gaperon paper "
        "(arXiv 2510.25771) releases 'hundreds of intermediate checkpoints'",
        note="how and under which names the 1B intermediate checkpoints are published was not "
        "confirmed offline (no hub revision of this repository is named in any source found; "
        "public evaluation code names 8B/24B checkpoints only as local folders "
        "step-{N}_tokens-{M}B-phase{K}), nor its tokens per step: step 1 stands for "
        "main, the final checkpoint; the repository is gated (accept its terms)",
    ),
    HubSuiteEntry(
        hub_id="EuroBERT/EuroBERT-210m",
        short_name="eurobert-210m",
        family="encoder",
        loader="hf",
        revisions=((1, "main"),),
        tokens_per_step=None,
        config=_eurobert(768, 12, 12, 12, 3072),
        verified=False,
        source="https://huggingface.co/EuroBERT/EuroBERT-210m (public, ungated); sizes: its "
        "hub config.json as a public transformers audit of the EuroBERT family tabulates it "
        "(hidden 768, 12 layers, 12 heads, 12 KV heads, MLP 3072, vocabulary 128,256, 8192 "
        "positions, untied, RoPE θ 250,000), equal to transformers' EuroBertConfig defaults",
        note="the EuroBERT paper (arXiv 2503.05500) releases intermediate checkpoints, but "
        "neither their revision/branch names nor a separate repository for them nor the tokens "
        "per step were confirmed offline: step 1 stands for main, the final checkpoint",
    ),
    HubSuiteEntry(
        hub_id="EuroBERT/EuroBERT-610m",
        short_name="eurobert-610m",
        family="encoder",
        loader="hf",
        revisions=((1, "main"),),
        tokens_per_step=None,
        config=_eurobert(1152, 26, 18, 6, 4096),
        verified=False,
        source="https://huggingface.co/EuroBERT/EuroBERT-610m (public, ungated); sizes: its "
        "hub config.json as a public transformers audit of the EuroBERT family tabulates it "
        "(hidden 1152, 26 layers, 18 heads, 6 KV heads, MLP 4096, vocabulary 128,256, 8192 "
        "positions, untied, RoPE θ 250,000)",
        note="the EuroBERT paper (arXiv 2503.05500) releases intermediate checkpoints, but "
        "neither their revision/branch names nor a separate repository for them nor the tokens "
        "per step were confirmed offline: step 1 stands for main, the final checkpoint",
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
        source="https://huggingface.co/almanach/moderncamembert-base (ModernBERT pretrained "
        "with MLM on 1T French tokens, context 1024 then 8192, the CamemBERTaV2 tokenizer; "
        "arXiv 2504.08716); 22 layers, hidden 768, 12 heads, 8192 context as the cards of "
        "models continued from it state (almanach/ModernCamemBERT-bio-base, rntc/cpt-fr-base); "
        "MLP 1152: ModernBERT-base's (transformers' ModernBertConfig default)",
        note="vocabulary size (32,768 assumed) and MLP width not confirmed offline; the paper's "
        "second model almanach/moderncamembert-cv2-base (trained on CamemBERTaV2's data) also "
        "exists. Intermediate checkpoints: public code names a separate repository "
        "almanach/moderncamembert-base-ckpts with no weights at its root (sub-folders, as "
        "almanach/camembertv2-base-ckpts keeps post/ckpt-{N}/pt/), not hub revisions of this "
        "one; its layout and steps were not confirmed offline: step 1 stands for main, the "
        "final checkpoint",
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
