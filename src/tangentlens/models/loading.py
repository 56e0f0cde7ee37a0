"""Load checkpoints into TransformerLens with no weight processing, through one of two loaders.

No LayerNorm folding, no centring of writing weights or of the unembedding, no value-bias
folding: centring deletes exactly the mean direction this toolkit measures. The loaded model
reproduces the Hugging Face model's hidden states and logits (tested to ≤ 1e-4 in float32).

Loaders (:data:`~tangentlens.models.catalog.LOADERS`): ``"hooked"`` converts the weights into a
``HookedTransformer`` / ``HookedEncoder``; ``"bridge"`` boots a ``TransformerBridge`` around the
Hugging Face model itself (:func:`boot_bridge`: raw weights, eager attention, nothing converted);
``"hf"`` loads a EuroBERT or ModernBERT masked-LM checkpoint as the Hugging Face model itself
(:func:`load_hf_encoder`: raw weights, SDPA attention) inside an
:class:`~tangentlens.models.hf_lens.HfLens`. All are read through :mod:`tangentlens.models.lens`.

* :func:`load_local_checkpoint` reads a Hugging Face-format folder (config, safetensors or bin
  weights, tokenizer files) and makes no hub call of any kind. Decoders: the architectures in
  :data:`DECODER_ARCHITECTURES`; BERT-style MLM encoders become ``HookedEncoder`` with their MLM
  head; a plain ``BertModel`` (:data:`HEADLESS_ARCHITECTURES`: no language-modelling head)
  becomes a ``HookedEncoder`` whose head is NaN, marked headless (:func:`has_lm_head`): its
  activations are the model's, it has no loss and so no gradients.
* :func:`load_pythia_checkpoint` loads ``EleutherAI/pythia-*`` at a training step through
  TransformerLens, from the local cache only when offline (see :mod:`tangentlens.models.hub`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformer_lens import HookedEncoder, HookedTransformer, HookedTransformerConfig
from transformer_lens.loading_from_pretrained import (
    convert_hf_model_config,
    get_pretrained_state_dict,
)
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.pretrained.weight_conversions.bert import convert_bert_weights
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    BertForMaskedLM,
    BertModel,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from tangentlens.models.catalog import ENCODER_MODEL_TYPES, HEADLESS_ARCHITECTURES, resolve_loader
from tangentlens.models.hf_lens import HF_ENCODERS, HfLens
from tangentlens.models.hub import hf_offline_mode, hub_cache_dir, offline_requested
from tangentlens.models.lens import lens_model
from tangentlens.models.weights import check_finite_weights, verify_weight_files

logger = logging.getLogger(__name__)

HookedModel = HookedTransformer | HookedEncoder

#: Hugging Face decoder architectures that load from local folders (TransformerLens converters).
DECODER_ARCHITECTURES: tuple[str, ...] = (
    "GPTNeoXForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
)
#: Decoder architectures TransformerLens bridges but does not convert from a local folder
#: (OLMo: its ``HookedTransformer`` config is keyed on hub names): loader ``"bridge"`` only (their
#: model types are :data:`~tangentlens.models.catalog.BRIDGE_MODEL_TYPES`).
BRIDGE_ONLY_ARCHITECTURES: tuple[str, ...] = ("OlmoForCausalLM",)
#: BERT-style encoders (loaded with their MLM head into ``HookedEncoder``).
ENCODER_ARCHITECTURES: tuple[str, ...] = ("BertForMaskedLM",)
#: Files that hold a tokenizer's vocabulary (one of them must be in a checkpoint folder).
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model")
NO_PROCESSING: dict[str, bool] = {
    "fold_ln": False,
    "center_writing_weights": False,
    "center_unembed": False,
    "fold_value_biases": False,
    "refactor_factored_attn_matrices": False,
}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """TransformerLens announces loads with print() and transformers draws progress bars: route
    the announcements to our log and switch the bars off while loading."""
    announced = io.StringIO()
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stdout(announced):
            yield
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
        if announced.getvalue().strip():
            logger.info(announced.getvalue().strip())


def read_hf_config(folder: Path) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict, with a clear error when missing or malformed."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError as error:
        raise ValueError(
            f"{str(folder)!r} is not a Hugging Face checkpoint: no config.json (expected "
            "config.json, weights and tokenizer files)"
        ) from error
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def checkpoint_architecture(folder: Path) -> str:
    """The folder's Hugging Face architecture, refused unless this module can load it (one
    with a language-modelling head first, when ``config.json`` names several)."""
    architectures = read_hf_config(folder).get("architectures") or []
    supported = (
        *DECODER_ARCHITECTURES,
        *BRIDGE_ONLY_ARCHITECTURES,
        *ENCODER_ARCHITECTURES,
        *HEADLESS_ARCHITECTURES,
    )
    for name in supported:
        if name in architectures:
            return name
    raise ValueError(
        f"checkpoint {str(folder)!r} has architectures {architectures}; allowed: {list(supported)}"
    )


def _tl_config(
    folder: Path, architecture: str, device: str, dtype: torch.dtype
) -> HookedTransformerConfig:
    # TransformerLens picks some architectures from substrings of the name ("llama", "gemma"),
    # without reading the config: convert from a copy of config.json in a neutral folder, naming
    # the architecture loaded. It reads every BERT config as BertForMaskedLM's: a headless
    # BertModel is converted as one and keeps its own name (see has_lm_head).
    config = read_hf_config(folder)
    config["architectures"] = [
        "BertForMaskedLM" if architecture in HEADLESS_ARCHITECTURES else architecture
    ]
    with tempfile.TemporaryDirectory(prefix="tangentlens-config-") as neutral:
        (Path(neutral) / "config.json").write_text(json.dumps(config))
        cfg_dict = convert_hf_model_config(neutral)
    cfg_dict.update(
        model_name=Path(folder).name,
        original_architecture=architecture,
        device=device,
        dtype=dtype,
        init_weights=False,
        n_devices=1,
    )
    return HookedTransformerConfig(**cfg_dict)


def _nan_linear(n_out: int, n_in: int | None) -> SimpleNamespace:
    """A stand-in ``nn.Linear`` (``n_in`` None: a LayerNorm) whose weights are all NaN."""
    shape = (n_out,) if n_in is None else (n_out, n_in)
    return SimpleNamespace(weight=torch.full(shape, math.nan), bias=torch.full((n_out,), math.nan))


def _bert_state_dict(
    encoder: BertModel, predictions: Any | None, cfg: HookedTransformerConfig
) -> dict:
    """TransformerLens' BERT converter expects BertForPreTraining; an MLM checkpoint has no
    pooler and no next-sentence head, which HookedEncoder holds but never uses for MLM: they get
    zero weights. A headless checkpoint (``predictions`` None: no MLM head) gets a NaN MLM head:
    HookedEncoder computes its logits on every forward pass, and NaN logits cannot pass for
    predictions."""
    d_model, n_types = cfg.d_model, encoder.embeddings.token_type_embeddings.weight.shape[0]
    if n_types != 2:  # HookedEncoder's TokenTypeEmbed holds types 0 and 1 (only 0 is used)
        raise ValueError(
            f"checkpoint has {n_types} token-type embeddings (type_vocab_size); HookedEncoder "
            "loads exactly 2"
        )
    if predictions is None:
        predictions = SimpleNamespace(
            transform=SimpleNamespace(
                dense=_nan_linear(d_model, d_model), LayerNorm=_nan_linear(d_model, None)
            ),
            decoder=_nan_linear(cfg.d_vocab, d_model),
        )
    zeros = SimpleNamespace(weight=torch.zeros(d_model, d_model), bias=torch.zeros(d_model))
    nsp = SimpleNamespace(weight=torch.zeros(2, d_model), bias=torch.zeros(2))
    view = SimpleNamespace(
        bert=SimpleNamespace(
            embeddings=encoder.embeddings,
            encoder=encoder.encoder,
            pooler=SimpleNamespace(dense=zeros),
        ),
        cls=SimpleNamespace(predictions=predictions, seq_relationship=nsp),
    )
    return {k: v.detach() for k, v in convert_bert_weights(view, cfg).items()}


def has_lm_head(model: Any) -> bool:
    """Whether ``model`` has a language-modelling head, hence a loss and gradients. A headless
    checkpoint (:data:`HEADLESS_ARCHITECTURES`) loads with a NaN head: only its activations are
    meaningful (``HookedEncoder``: its architecture in ``model.cfg.original_architecture``;
    ``TransformerBridge``: the checkpoint's ``config.json`` architectures)."""
    return lens_model(model).has_lm_head


def _load_encoder_weights(model: HookedEncoder, state_dict: dict) -> None:
    # HookedEncoder leaves its parameters uninitialised (NaN): every parameter must be loaded;
    # only the attention buffers (causal mask, IGNORE constant) are built by the module itself.
    result = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(("attn.mask", "attn.IGNORE"))]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"encoder weights do not match HookedEncoder: missing {missing}, unexpected "
            f"{result.unexpected_keys}"
        )


def _local_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    # transformers 5 builds an empty two-token tokenizer from the model type when the files are
    # missing, without a word: check that the folder holds a vocabulary first.
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        raise ValueError(
            f"checkpoint {str(folder)!r} has no tokenizer files; expected one of {TOKENIZER_FILES}"
        )
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(
            f"cannot load the tokenizer of {str(folder)!r} (expected tokenizer.json or the "
            f"tokenizer files save_pretrained writes): {error}"
        ) from error


def check_vocabulary(tokenizer: PreTrainedTokenizerBase, d_vocab: int, where: str) -> None:
    """Refuse a tokenizer whose ids do not fit the model's embedding (``len(tokenizer) >
    d_vocab``); a larger embedding than the tokenizer (padded vocabularies, as Pythia's) is fine."""
    if len(tokenizer) > d_vocab:
        raise ValueError(
            f"tokenizer of {where} has {len(tokenizer)} tokens but the model's vocabulary holds "
            f"{d_vocab}; tokenizer and model must match (allowed: at most {d_vocab} tokens)"
        )


def _load_hf_model(folder: Path, architecture: str, dtype: torch.dtype) -> PreTrainedModel:
    options: dict[str, Any] = {"local_files_only": True, "dtype": dtype}
    if architecture in HEADLESS_ARCHITECTURES:
        cls, options["add_pooling_layer"] = BertModel, False  # HookedEncoder's pooler is unused
    elif architecture in ENCODER_ARCHITECTURES:
        cls = BertForMaskedLM
    else:
        cls = AutoModelForCausalLM
    try:
        return cls.from_pretrained(folder, **options).eval()
    except (OSError, ValueError, RuntimeError) as error:
        raise ValueError(f"cannot load the weights of {str(folder)!r}: {error}") from error


def _nan_head(bridge: TransformerBridge) -> None:
    """A headless checkpoint boots into ``BertForMaskedLM`` with a freshly drawn MLM head the
    checkpoint does not hold: set it to NaN (as :func:`_bert_state_dict` does for
    ``HookedEncoder``), so nothing can pass it for predictions. The input embedding the decoder
    ties to is left alone."""
    embedding = bridge.original_model.get_input_embeddings().weight
    for parameter in bridge.original_model.cls.parameters():
        if parameter is not embedding:
            parameter.fill_(math.nan)


def boot_bridge(
    source: str | Path,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    tokenizer: PreTrainedTokenizerBase | None = None,
    revision: str | None = None,
) -> TransformerBridge:
    """A ``TransformerBridge`` of ``source`` (a checkpoint folder or a hub name at ``revision``)
    with **no** weight processing (raw Hugging Face weights; the bridge forces eager
    attention), in eval mode. Hub and cache access follow the caller's offline mode."""
    with _quiet(), torch.no_grad():
        bridge = TransformerBridge.boot_transformers(
            str(source), device=device, dtype=dtype, tokenizer=tokenizer, revision=revision
        )
    return bridge.eval()


#: The attention implementation ``"hf"`` loads with: SDPA and eager agree to ~1e-7 in float32
#: (``tests/integration/test_hf_encoders.py``), and SDPA keeps no attention pattern for the
#: backward pass (no probe of this loader reads patterns).
HF_ATTENTION = "sdpa"


def load_hf_encoder(
    folder: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> HfLens:
    """A EuroBERT / ModernBERT masked-LM checkpoint folder (``config.json`` naming
    ``EuroBertForMaskedLM`` / ``ModernBertForMaskedLM``, weights, tokenizer files) as the
    Hugging Face model itself, raw weights, in eval mode, in an :class:`HfLens` with its
    tokenizer. Reads only ``folder``; weights the checkpoint lacks (a head drawn at random)
    are a ``ValueError``."""
    folder = Path(folder).expanduser()
    config = read_hf_config(folder)
    model_type = config.get("model_type")
    parts = HF_ENCODERS.get(str(model_type))
    architectures = config.get("architectures") or []
    if parts is None or parts.architecture not in architectures:
        allowed = [p.architecture for p in HF_ENCODERS.values()]
        raise ValueError(
            f"checkpoint {str(folder)!r} has model type {model_type!r} and architectures "
            f"{architectures}; loader 'hf' loads {allowed} (a masked-LM head: the loss)"
        )
    verify_weight_files(folder)
    with hf_offline_mode(), _quiet(), torch.no_grad():
        tokenizer = _local_tokenizer(folder)
        try:
            model, info = AutoModelForMaskedLM.from_pretrained(
                folder,
                local_files_only=True,
                dtype=dtype,
                attn_implementation=HF_ATTENTION,
                output_loading_info=True,
            )
        except (OSError, ValueError, RuntimeError) as error:
            raise ValueError(f"cannot load the weights of {str(folder)!r}: {error}") from error
    if info["missing_keys"]:
        raise ValueError(
            f"checkpoint {str(folder)!r} lacks weights {sorted(info['missing_keys'])}: "
            f"{parts.architecture} would draw them at random"
        )
    check_finite_weights(model.named_parameters(), f"checkpoint {str(folder)!r}")
    lens = HfLens(model.to(device).eval(), tokenizer=tokenizer, model_name=folder.name)
    check_vocabulary(tokenizer, lens.d_vocab, repr(str(folder)))
    return lens


def load_local_checkpoint(
    folder: str | Path,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    loader: str = "hooked",
) -> HookedModel | TransformerBridge | HfLens:
    """A Hugging Face-format checkpoint folder as a model tangentlens reads, tokenizer attached:
    ``loader="hooked"`` a ``HookedTransformer`` / ``HookedEncoder`` (converted weights),
    ``"bridge"`` a ``TransformerBridge`` around the Hugging Face model (see :func:`boot_bridge`),
    ``"hf"`` an :class:`~tangentlens.models.hf_lens.HfLens` of a EuroBERT / ModernBERT encoder
    (see :func:`load_hf_encoder`; the only loader of those), ``"auto"`` the one
    :func:`~tangentlens.models.catalog.resolve_loader` picks for the folder's model type.

    Reads only ``folder`` (the hub is switched off while loading). A headless checkpoint loads
    without a usable head: see :func:`has_lm_head`.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ValueError(f"checkpoint folder {str(folder)!r} does not exist or is not a folder")
    model_type = read_hf_config(folder).get("model_type")
    family = "encoder" if model_type in ENCODER_MODEL_TYPES else "decoder"
    loader = resolve_loader(loader, family, model_type)
    if loader == "hf":
        return load_hf_encoder(folder, device=device, dtype=dtype)
    architecture = checkpoint_architecture(folder)
    verify_weight_files(folder)
    if loader == "bridge":
        with hf_offline_mode():
            tokenizer = _local_tokenizer(folder)
            bridge = boot_bridge(folder, device=device, dtype=dtype, tokenizer=tokenizer)
        check_vocabulary(tokenizer, lens_model(bridge).d_vocab, repr(str(folder)))
        check_finite_weights(
            bridge.original_model.named_parameters(), f"checkpoint {str(folder)!r}"
        )
        bridge.cfg.model_name = folder.name
        if architecture in HEADLESS_ARCHITECTURES:
            with torch.no_grad():
                _nan_head(bridge)
        return bridge
    # no autograd while converting: a recorded dtype cast would keep every source tensor alive
    with hf_offline_mode(), _quiet(), torch.no_grad():
        tokenizer = _local_tokenizer(folder)
        hf_model = _load_hf_model(folder, architecture, dtype)
        check_finite_weights(hf_model.named_parameters(), f"checkpoint {str(folder)!r}")
        cfg = _tl_config(folder, architecture, device, dtype)
        check_vocabulary(tokenizer, cfg.d_vocab, repr(str(folder)))
        if architecture in HEADLESS_ARCHITECTURES or architecture in ENCODER_ARCHITECTURES:
            model: HookedModel = HookedEncoder(cfg, tokenizer=tokenizer, move_to_device=False)
            if architecture in HEADLESS_ARCHITECTURES:  # BertModel: the encoder alone
                weights = _bert_state_dict(hf_model, None, cfg)
            else:
                weights = _bert_state_dict(hf_model.bert, hf_model.cls.predictions, cfg)
            _load_encoder_weights(model, weights)
        else:
            state_dict = get_pretrained_state_dict(str(folder), cfg, hf_model, dtype=dtype)
            del hf_model  # the state dict holds what is needed; free the rest before converting
            model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
            model.load_and_process_state_dict(state_dict, **NO_PROCESSING)
        return model.to(device).eval()


def _require_cached(model_name: str, revision: str) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    how = (
        f"download it where the hub is reachable (`hf download {model_name} --revision "
        f"{revision}`) or run without offline mode"
    )
    try:
        folder = Path(snapshot_download(model_name, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as error:
        raise ValueError(
            f"{model_name} at step {revision.removeprefix('step')} (revision {revision!r}) is not "
            f"in the local Hugging Face cache ({hub_cache_dir()}); {how}"
        ) from error
    if not (folder / "config.json").exists():
        raise ValueError(f"cached {model_name} revision {revision!r} has no config.json; {how}")
    verify_weight_files(folder)


def _from_pretrained(
    model_name: str, step: int, device: str, dtype: torch.dtype, loader: str
) -> HookedTransformer | TransformerBridge:
    if loader == "bridge":
        bridge = boot_bridge(model_name, device=device, dtype=dtype, revision=f"step{step}")
        bridge.cfg.checkpoint_value = step
        return bridge
    # no autograd while converting: a recorded dtype cast would keep every source tensor alive
    with _quiet(), torch.no_grad():
        return HookedTransformer.from_pretrained_no_processing(
            model_name, checkpoint_value=step, device=device, dtype=dtype
        )


def load_pythia_checkpoint(
    model_name: str,
    step: int,
    *,
    offline: bool | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    loader: str = "hooked",
) -> HookedTransformer | TransformerBridge:
    """``EleutherAI/pythia-*`` at training ``step`` (revision ``step{step}``), no processing,
    as a ``HookedTransformer`` (``loader="hooked"``) or a ``TransformerBridge`` (``"bridge"``).

    Offline (see :func:`~tangentlens.models.hub.offline_requested`), only the local Hugging Face
    cache is read; a revision missing from it is a ``ValueError`` saying how to get it.
    """
    loader = resolve_loader(loader, "decoder", "gpt_neox")
    if offline_requested(offline):
        with hf_offline_mode():
            _require_cached(model_name, f"step{step}")
            model = _from_pretrained(model_name, step, device, dtype, loader)
    else:
        model = _from_pretrained(model_name, step, device, dtype, loader)
    check_finite_weights(model.named_parameters(), f"{model_name} at step {step}")
    return model.eval()
