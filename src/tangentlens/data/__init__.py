"""tangentlens.data: corpora, tokenizer training, packing, token frequencies and masks.

No model library is imported here: only ``tokenizers``, numpy and torch.
"""

from tangentlens.data.corpus import (
    CORPUS_SPEC_FORMS,
    Corpus,
    CorpusSplit,
    Document,
    corpus_from_records,
    from_hf_dataset,
    from_path,
    load_corpus,
    shakespeare,
)
from tangentlens.data.frequency import FrequencyBins, FrequencyTable
from tangentlens.data.masks import (
    ANALYSIS_EXCLUSION_REASONS,
    EXCLUSION_REASONS,
    MaskPolicy,
    MaskResult,
    analysis_mask,
    token_mask,
)
from tangentlens.data.mlm import IGNORE_INDEX, mlm_corrupt
from tangentlens.data.packing import (
    FAMILIES,
    BatchEncoder,
    SpecialTokens,
    document_encoder,
    iter_batches,
    limit_tokens,
    pack_causal,
    pack_encoder,
    pack_rows,
    special_tokens_of,
    tokenize_corpus,
)
from tangentlens.data.tokenizer import (
    DECODER_SPECIAL_TOKENS,
    ENCODER_SPECIAL_TOKENS,
    batch_encoder,
    decoder_special_ids,
    encoder_special_ids,
    train_bpe_tokenizer,
)

__all__ = [
    "ANALYSIS_EXCLUSION_REASONS",
    "CORPUS_SPEC_FORMS",
    "DECODER_SPECIAL_TOKENS",
    "ENCODER_SPECIAL_TOKENS",
    "EXCLUSION_REASONS",
    "FAMILIES",
    "IGNORE_INDEX",
    "BatchEncoder",
    "Corpus",
    "CorpusSplit",
    "Document",
    "FrequencyBins",
    "FrequencyTable",
    "MaskPolicy",
    "MaskResult",
    "SpecialTokens",
    "analysis_mask",
    "batch_encoder",
    "corpus_from_records",
    "decoder_special_ids",
    "document_encoder",
    "encoder_special_ids",
    "from_hf_dataset",
    "from_path",
    "iter_batches",
    "limit_tokens",
    "load_corpus",
    "mlm_corrupt",
    "pack_causal",
    "pack_encoder",
    "pack_rows",
    "shakespeare",
    "special_tokens_of",
    "token_mask",
    "tokenize_corpus",
    "train_bpe_tokenizer",
]
