"""Compression stages (ConAE, ../shared/papers/002): the teacher's query embeddings, a projector per (method, L)
with the compressed corpus and checkpoint, approximate indexes, and the search-latency measurement.

A `compress` folder is shaped like an `encode` folder (emb_*.npy shards + docids.txt, now L-dimensional), so the
index and retrieval stages take it as they are, plus `model/`: the compressed checkpoint (the teacher's files and
`projector.safetensors`) that `ance search` and `ance evaluate` use like any other.
"""

import json
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from ance_core.artifacts import DOCIDS, EMBEDDINGS, TRAIN_LOG, ArtifactRef, id_lines, run_stage
from ance_core.compression.conae import Projector, fit_pca, row_chunks, teacher_from, train_conae
from ance_core.compression.config import CompressConfig, CompressMethod, IndexType
from ance_core.data.dataset import read_tables
from ance_core.modeling.devices import pick_device
from ance_core.modeling.model import load_checkpoint, write_compressed_checkpoint
from ance_core.retrieval.ann import build_ann_index, search_latency
from ance_core.retrieval.config import EncodeConfig, IndexConfig
from ance_core.retrieval.encode import encode_queries, iter_shards, map_shards, read_docids
from ance_core.retrieval.index import SearchIndex, index_bytes
from tasks.common import stage_task

QUERY_EMBEDDINGS, QUERY_IDS = "queries.npy", "query_ids.txt"
TRAIN_FIELDS = ("top_k", "lam", "lr", "batch_size", "epochs", "only_kl", "no_kl", "seed")  # what ConAE's fit uses


@stage_task("encode-queries")
def encode_split_queries(checkpoint: ArtifactRef, data: ArtifactRef, split: str, cfg: EncodeConfig,
                         work_dir: str) -> ArtifactRef:
    """A split's query embeddings with a checkpoint (queries.npy, rows in query_ids.txt order)."""

    def build(out: Path) -> dict:
        queries = read_tables(data.path, corpus_columns=[]).split_queries(split)
        model, tokenizer, meta = load_checkpoint(checkpoint.path, pick_device())
        emb = encode_queries(model, tokenizer, queries["text"].tolist(), meta, cfg)
        np.save(out / QUERY_EMBEDDINGS, emb)
        (out / QUERY_IDS).write_text("\n".join(queries["query_id"]) + "\n", encoding="utf-8")
        return {"queries": len(queries), "dim": emb.shape[1]}

    inputs = {"checkpoint": checkpoint.digest, "data": data.digest}
    return run_stage(work_dir, "query-embeddings", {"split": split, "encode": cfg}, inputs, build)


def read_query_embeddings(ref: ArtifactRef) -> tuple[np.ndarray, list[str]]:
    folder = Path(ref.path)
    return np.load(folder / QUERY_EMBEDDINGS), id_lines(folder / QUERY_IDS)


@stage_task("compress")
def compress(checkpoint: ArtifactRef, embeddings: ArtifactRef, train_queries: ArtifactRef, data: ArtifactRef,
             split: str, method: CompressMethod, dim: int, cfg: CompressConfig, work_dir: str) -> ArtifactRef:
    """Fit one (method, L) projector on the teacher's frozen embeddings; write the compressed corpus shards (one per
    teacher shard) and the compressed checkpoint (`model/`). ConAE also keeps its full model with the decoder and its
    training curve. PCA and truncation read the shards through memory maps and never hold the corpus; ConAE loads it
    whole (its teacher top-k is an exact search over it, and its batches draw documents from anywhere in it)."""

    def build(out: Path) -> dict:
        doc_ids = read_docids(embeddings.path)
        h = embedding_dim(embeddings.path)
        if dim >= h:
            raise ValueError(f"compression dimension {dim} is not below the model's {h}")
        summary: dict = {"method": method, "dim": dim, "from_dim": h}
        if method == "conae":
            docs = np.concatenate(list(iter_shards(embeddings.path)))
            queries, query_ids = read_query_embeddings(train_queries)
            positives = read_tables(data.path, corpus_columns=[]).positives(split)
            teacher = teacher_from(docs, doc_ids, queries, query_ids, positives, cfg.top_k)
            with open(out / TRAIN_LOG, "w") as log:
                model = train_conae(teacher, dim, **{k: getattr(cfg, k) for k in TRAIN_FIELDS if k != "top_k"},
                                    on_step=lambda r: log.write(json.dumps(r) + "\n"))
            model.save(out)
            projector = Projector.from_conae(model)
            summary |= {"train_queries": len(teacher.queries), "steps": sum(1 for _ in open(out / TRAIN_LOG))}
        elif method == "pca":
            fit = fit_pca(row_chunks(map_shards(embeddings.path)), dim)  # streamed: O(h^2 + chunk x h) memory
            projector = Projector.from_pca(fit)
            summary["explained_variance"] = round(float(fit.explained.sum()), 6)
        else:
            projector = Projector.truncation(h, dim)
        for k, shard in enumerate(map_shards(embeddings.path)):  # (rows, h) -> (rows, L) float32, a shard at a time
            np.save(out / EMBEDDINGS.format(k), projector.docs(shard))
        (out / DOCIDS).write_text("\n".join(doc_ids) + "\n", encoding="utf-8")
        write_compressed_checkpoint(checkpoint.path, projector, out / "model")
        return summary

    config = {"method": method, "dim": dim, "split": split}
    inputs = {"checkpoint": checkpoint.digest, "embeddings": embeddings.digest}
    if method == "conae":  # only ConAE learns from queries and labels
        config |= {k: getattr(cfg, k) for k in TRAIN_FIELDS}
        inputs |= {"train_queries": train_queries.digest, "data": data.digest}
    return run_stage(work_dir, "compress", config, inputs, build)


def embedding_dim(folder: str) -> int:
    """h of an encode folder's embeddings, from its first shard's header."""
    first = next(map_shards(folder), None)
    if first is None:
        raise ValueError(f"{folder}: no embedding shards (emb_*.npy) to compress")
    return first.shape[1]


def compressed_model(ref: ArtifactRef) -> ArtifactRef:
    """The compressed checkpoint inside a compress folder, as a checkpoint reference."""
    return ArtifactRef(str(Path(ref.path) / "model"), f"{ref.digest}-model", ref.seconds, ref.cached)


def projector_of(ref: ArtifactRef | None) -> Projector | None:
    return None if ref is None else Projector.load(Path(ref.path) / "model")


@stage_task("ann-index")
def ann_index(embeddings: ArtifactRef, kind: IndexType, cfg: CompressConfig, work_dir: str) -> ArtifactRef:
    """An approximate faiss index (HNSW or IVF-PQ) over encoded or compressed shards."""
    params = {"hnsw": ("hnsw_m", "hnsw_ef_search"), "ivfpq": ("ivf_nlist", "ivf_nprobe", "pq_dims_per_code")}[kind]
    config = {"type": kind} | {k: getattr(cfg, k) for k in params}
    return run_stage(work_dir, "index", config, {"embeddings": embeddings.digest},
                     lambda out: build_ann_index(embeddings.path, out, kind, cfg))


@task(name="search-latency", cache_policy=NO_CACHE, persist_result=False)
def measure_latency(indexes: list[tuple[ArtifactRef, ArtifactRef | None]], eval_queries: ArtifactRef, top_k: int,
                    batch: int, index_cfg: IndexConfig) -> list[dict]:
    """Index size and median search latency per query (batched and single) of every (index, projector) pair, all
    measured in this one run, in turn and 5 times over, on the evaluation queries' embeddings (projected for the
    compressed indexes). Not cached: a re-run measures again."""
    queries, _ = read_query_embeddings(eval_queries)
    pairs = [(SearchIndex(index_ref.path, index_cfg), queries if projector is None
              else projector_of(projector).queries(queries)) for index_ref, projector in indexes]
    latencies = search_latency(pairs, top_k, batch)
    return [{"index_bytes": index_bytes(index_ref.path)} | latency
            for (index_ref, _), latency in zip(indexes, latencies, strict=True)]
