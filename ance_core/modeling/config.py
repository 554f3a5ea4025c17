"""The model's config: which pretrained encoder, its pooling, head and encoding lengths; the numeric precision."""

from typing import Literal

from pydantic import Field

from ance_core.stage_config import StageConfig

Precision = Literal["auto", "fp32", "bf16", "fp16"]


class ModelConfig(StageConfig):
    """BERT-Siamese (ANCE eq. 1-3): shared encoder -> pooled vector -> Linear(h, h) -> LayerNorm, dot product."""

    name: str = Field("minilm", description="'minilm', any Hugging Face model id, or a local path")
    pooling: Literal["mean", "cls"] = Field("mean", description="One vector of a text: the mean of its tokens' "
                                            "vectors, or its [CLS] vector")
    init_temperature: float = Field(
        0.05,
        gt=0,
        description="Head initialisation: identity projection and LayerNorm gain sqrt(1/(T*h)), so q.d of a "
        "fresh head equals the centred cosine of the pooled vectors divided by T",
    )
    query_max_length: int = Field(64, ge=8, description="Tokens of a query (the rest is cut)")
    passage_max_length: int = Field(256, ge=8, description="Tokens of a passage: the document's first (firstp) or "
                                    "each of its windows (maxp)")
    document_mode: Literal["firstp", "maxp"] = Field(
        "firstp", description="firstp: a document is its first passage_max_length tokens. maxp (ANCE §5, document "
        "ranking): its windows of passage_max_length tokens (at most max_passages) are each encoded and indexed, and "
        "it scores as its best window, in retrieval and in mining (a document is one negative, by its best window)")
    max_passages: int = Field(4, ge=1, description="maxp: windows per document (ANCE: 4 of 512 tokens)")
    query_prefix: str = Field("", description="Text put before every query, for a model trained with one (E5: "
                              "'query: '; BGE: 'Represent this sentence for searching relevant passages: '); kept in "
                              "the checkpoint, its sentence-transformers export (prompts) and its MLflow model")
    passage_prefix: str = Field("", description="Text put before every passage (E5: 'passage: '); kept like "
                                "query_prefix")

    UNSAID = {"query_prefix": "", "passage_prefix": ""}  # (no prefix: the keys from before the option)

