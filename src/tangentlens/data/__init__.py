"""tangentlens.data: corpora, tokenizer training, packing, token frequencies and masks.

No model library is imported here: only ``tokenizers``, numpy and torch. The package's names are
imported on first use, each from its own module.
"""

from tangentlens._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".corpus": (
            "CORPUS_SPEC_FORMS",
            "Corpus",
            "CorpusSplit",
            "Document",
            "corpus_from_records",
            "from_hf_dataset",
            "from_path",
            "load_corpus",
            "shakespeare",
        ),
        ".frequency": ("FrequencyBins", "FrequencyTable"),
        ".masks": (
            "ANALYSIS_EXCLUSION_REASONS",
            "EXCLUSION_REASONS",
            "MaskPolicy",
            "MaskResult",
            "analysis_mask",
            "token_mask",
        ),
        ".mlm": ("IGNORE_INDEX", "mlm_corrupt"),
        ".packing": (
            "FAMILIES",
            "BatchEncoder",
            "SpecialTokens",
            "document_encoder",
            "iter_batches",
            "limit_tokens",
            "pack_causal",
            "pack_encoder",
            "pack_rows",
            "special_tokens_of",
            "tokenize_corpus",
        ),
        ".tokenizer": (
            "DECODER_SPECIAL_TOKENS",
            "ENCODER_SPECIAL_TOKENS",
            "batch_encoder",
            "decoder_special_ids",
            "encoder_special_ids",
            "train_bpe_tokenizer",
        ),
    },
)
