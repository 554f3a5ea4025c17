"""The inferencer's configs: corpus encoding and where its shards run, the faiss index, BM25, evaluation depth."""

from typing import Literal

from pydantic import Field

from ance_core.modeling.config import Precision
from ance_core.stage_config import StageConfig


class BM25Config(StageConfig):
    """bm25s with a Snowball stemmer; title and text are indexed together."""

    k1: float = Field(0.9, gt=0, description="Term-frequency saturation (0.9 with b 0.4: Anserini's BEIR setting)")
    b: float = Field(0.4, ge=0, le=1, description="Document-length normalisation: 0 none, 1 full")
    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = Field(
        "lucene", description="bm25s's BM25 variant (lucene: Lucene's, as Anserini scores); under every "
        "one a document that matches no query term scores 0 (bm25l and bm25+ are shifted so)")
    stemmer: str | None = Field("english", description="Snowball stemmer language (PyStemmer); null: no stemming")
    stopwords: str | None = Field("en", description="bm25s's stop-word list (a language code); null: every word "
                                  "indexed")
    top_k: int = Field(1000, ge=1, description="Depth of BM25's evaluation run (below 1000, BM25's R@1000 reads "
                       "recall at this depth: a run warns)")

    def scoring(self) -> "BM25Config":
        """This config without the evaluation depth: what an index and a ranking depend on (the BM25 index's key,
        the warm-up's candidates), so that changing `top_k` re-runs only the evaluation."""
        return self.model_copy(update={"top_k": type(self).model_fields["top_k"].default})


class EncodeConfig(StageConfig):
    """Corpus/query encoding: length-sorted dynamic padding, streamed to .npy shards."""

    UNSAID = {"batch_tokens": None, "compile": False}  # (added after stage keys existed: left out while unset)
    NOT_IN_KEY = ("compile",)  # how the forward runs, not what it computes

    batch_size: int = Field(64, ge=1, description="Texts per encoding batch")
    batch_tokens: int | None = Field(
        None, ge=1, description="Batches of at most this many padded tokens (texts x the longest one's tokens) instead "
        "of batch_size texts: long texts in small batches, short ones in large, the same work per batch. Set, the "
        "texts are also tokenized by a producer thread a chunk at a time while the model encodes the chunk before "
        "(each chunk sorted by length): on a GPU tokenizing was 20-32% of encoding. Unset: a shard tokenized first, "
        "then sorted as a whole")
    shard_size: int = Field(50_000, ge=1, description="Documents per shard: each is its own task (on the execution "
                            "runner) and .npy file (bounds memory); MaxP writes a row per window")
    precision: Precision = Field("auto", description="auto: bf16 on a CPU with bf16 in hardware (AVX512-BF16, AMX) "
                                 "and on CUDA GPUs that have it (else fp16), fp32 on other CPUs")
    dtype: Literal["float16", "float32"] = Field(
        "float16", description="How the shards store the embeddings: float16 halves the disk of every refresh (768-d "
        "MS MARCO: 13.5 GB instead of 27 GB); the index and the scores are computed in float32 from them")
    compile: bool = Field(
        False, repr=False, description="torch.compile the encoder's forward for corpus encodings and dev checks "
        "(inductor, dynamic shapes: one compile serves nearly every batch shape). Same embeddings to the precision's "
        "rounding; in no stage's key. Pays on large corpora, where the compile's seconds are small beside the "
        "encoding's (bench/encode_compile.py, BENCHMARKS.md)")


class ExecutionConfig(StageConfig):
    """Where the corpus-encoding shard tasks run. Not part of any stage's cache key: the results do not depend on it
    (tests/tasks/test_execution.py checks that Ray's are byte-identical to local ones)."""

    task_runner: Literal["local", "ray"] = Field(
        "local", description="local: the shards one after another in the flow's process (nothing to start). ray: "
        "prefect-ray's RayTaskRunner, one Ray task per shard")
    address: str | None = Field(
        None, description="An existing Ray cluster (auto, or ray://<head>:10001); unset: start a local Ray of "
        "`workers` workers in the run's process. A remote cluster's workers need this project installed and work_dir "
        "on storage they share")
    workers: int = Field(2, ge=1, description="Shard tasks a local Ray runs at once")
    threads_per_worker: int = Field(1, ge=1, description="CPU threads of each shard task (Ray num_cpus, torch threads)")
    gpus_per_task: float = Field(0, ge=0, description="ray: GPUs reserved per shard task (1 on GPU workers)")

    @property
    def on_gpu_workers(self) -> bool:
        """Whether the tasks run on Ray workers given GPUs, whose devices are theirs, not this process's (a recipe
        search's trials checked on a CPU-only driver would be refused fp16 or a GPU index they can use)."""
        return self.task_runner == "ray" and self.gpus_per_task > 0


class IndexConfig(StageConfig):
    """The faiss index the training rounds mine from: exact IndexFlatIP (the paper's, the default) or an approximate
    IVF-Flat or HNSW one, in `shards` parts searched together (faiss IndexShards); on the GPU when faiss-gpu and CUDA
    are present (one part per GPU), or, for a flat index where CUDA is present and faiss has no GPU support, by torch
    (`backend`). Evaluation always searches an exact flat index."""

    UNSAID = {"backend": "auto"}  # (added after stage keys existed: left out at its default)
    KEY_UNSAID = {"ivf_storage": "flat"}  # (the default before auto: the key IVF indexes of float32 lists always had)
    NOT_IN_KEY = ("backend",)  # where the exact search runs, not what it finds

    type: Literal["flat", "ivf", "hnsw"] = Field(
        "flat", description="flat: exact inner product (the paper's); ivf: IVF-Flat, nprobe of nlist lists; hnsw: "
        "HNSW graph (CPU only). Used for mining in the rounds; evaluation searches a flat index")
    shards: int = Field(1, ge=1, description="Index parts searched together (faiss IndexShards): one per GPU on GPU "
                        "machines, threads in one process on CPU; a flat index gives the same results (documents "
                        "of equal score aside: which of them make the top k may differ)")
    nlist: int | None = Field(None, ge=1, description="ivf: inverted lists; unset: 4 * sqrt(vectors), at least 39 "
                              "vectors per list")
    ivf_storage: Literal["auto", "flat", "sq8", "fp16"] = Field(
        "auto", description="ivf: how the lists store the vectors. flat: float32 (IndexIVFFlat); sq8: 8-bit scalar "
        "quantisation, a quarter of flat's bytes; fp16: half (IndexIVFScalarQuantizer, residuals to the list's "
        "centroid); auto: fp16 once float32 lists would take 1 GiB (700k vectors of 384 dimensions, 350k of 768), "
        "flat below (fp16 found what flat found at SciFact's size and at 1M synthetic vectors; sq8 lost 1.6 points of "
        "the exact top-10 at 1M: BENCHMARKS.md). Scores within the probed lists come from the stored vectors")
    nprobe: int = Field(32, ge=1, description="ivf: lists searched per query (applied when the index is searched: "
                        "changing it reuses the built index)")
    hnsw_m: int = Field(32, ge=4, description="hnsw: graph neighbours per vector")
    ef_search: int = Field(128, ge=1, description="hnsw: search breadth (at least the k searched for; applied when the "
                           "index is searched: changing it reuses the built index)")
    device: Literal["auto", "cpu", "gpu"] = Field("auto", description="Where faiss builds and searches the index: "
                                                  "auto (a GPU when faiss has one), cpu, gpu")
    gpu_float16: bool = Field(False, description="On a GPU, keep the index's vectors in float16 (faiss "
                              "GpuClonerOptions.useFloat16): half the GPU memory of a flat or IVF index, scores from "
                              "float16 vectors (what the shards store by default)")
    search_batch_size: int = Field(4096, ge=1, description="Queries per faiss search call (BLAS-sized)")
    backend: Literal["auto", "faiss", "torch"] = Field(
        "auto", repr=False, description="What searches a flat index. auto: faiss (on the GPU with faiss-gpu), or torch "
        "on a CUDA GPU when faiss has no GPU support (retrieval/torch_index.py: blocked float32 products of float16 "
        "vectors, the same rankings as faiss's, a corpus larger than GPU memory searched a block at a time); faiss; "
        "torch: on the GPU when CUDA is present, else on the CPU. Approximate indexes are always faiss's")

    def drop_unsaid(self, data: dict) -> dict:
        """Also without `ivf_storage` where the index has no lists (flat, hnsw): the keys of those stay."""
        data = super().drop_unsaid(data)
        if self.type != "ivf":
            data.pop("ivf_storage", None)
        return data

    def __repr_args__(self):
        return [(k, v) for k, v in super().__repr_args__() if not (k == "ivf_storage" and self.type != "ivf")]

    def exact(self) -> "IndexConfig":
        """The flat index of the same placement (evaluation's)."""
        return self.model_copy(update={"type": "flat"})


class EvalConfig(StageConfig):
    """The evaluation of every model on the dev and evaluation splits: how deep each run retrieves, and which hits
    are left out before scoring (nDCG@10, MRR@10, R@100, R@1000 by pytrec_eval)."""

    top_k: int = Field(1000, ge=1, description="Retrieval depth of the evaluation run (below 1000, R@1000 reads "
                       "recall at this depth: a run warns)")
    ignore_identical_ids: bool = Field(
        True, description="Drop a hit whose document id is the query's id before scoring, as BEIR's evaluator does "
        "(ArguAna and Quora put each query in the corpus: kept, it ranks first and counts as non-relevant). Applied "
        "to every model's run and to BM25's; not where the collection's qrels judge a document relevant to the query "
        "of its id (its queries and documents are numbered apart, as in classic collections: said in the log)")
    relevant_grade: int = Field(
        1, ge=1, description="The lowest qrels grade MRR@10 and recall count as relevant (trec_eval -l). 1: every "
        "document judged relevant; 2: TREC Deep Learning's convention on its graded passage collections (grades 2 "
        "and 3; its grade 1 is 'related'), for figures comparable with published ones. nDCG@10 gains by the grades "
        "themselves either way, and is what chooses the run's result")

    UNSAID = {"relevant_grade": 1}  # (added after the whole config's digest existed)

