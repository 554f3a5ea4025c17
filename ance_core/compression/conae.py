"""Embedding compression (ConAE, ../shared/papers/002): a trained retriever's frozen embeddings from h to L dims.

ConAE: separate linear encoders for queries and documents (h -> L, eq. 2) and one linear decoder (L -> h, eq. 4).
Loss (eq. 7) = L_KL + λ (L_q + L_d):
  L_KL (eq. 3)  KL(teacher softmax over its top-k documents for the query || softmax of the compressed scores over
                the same documents), mean over queries;
  L_q, L_d      the tanh margin losses of eq. 5-6: the decoded query against the teacher's positive / negative
                document embeddings, and the teacher's query against the decoded documents. The positive is a
                labelled one, the negative one sampled from the teacher's top-k.
Ablations (Table 3): "w/o Decoder" trains with L_KL only (no decoder is built), "w/o KL" with L_q + L_d only.

Baselines: PCA fitted on the document embeddings, and keeping the first L dimensions. PCA streams: the mean and the
h x h scatter matrix are accumulated chunk by chunk in float64 (from float32 or float16 rows), then the h x h covariance
is eigendecomposed, so its memory is O(h^2 + chunk x h) whatever the corpus size (an SVD of the centred N x h matrix
holds several N x h float64 arrays, the cast, the centred copy and U, 54 GB each at MS MARCO's 8.8M x 768).

Every method ends as a `Projector`: an affine map per side (query, document), saved as `projector.safetensors`
beside a checkpoint's weights; encoding with such a checkpoint applies it (ance_core/retrieval/encode.py).
"""

import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file
from torch import nn

PROJECTOR_FILE = "projector.safetensors"
CONAE_FILE = "conae.safetensors"
PCA_CHUNK_ROWS = 8192  # rows per float64 chunk of the PCA's pass: 8192 x 768 x 8 B = 50 MB at BERT-base


class ConAE(nn.Module):
    def __init__(self, dim: int, compressed: int, decoder: bool = True):
        super().__init__()
        self.query_encoder = nn.Linear(dim, compressed)
        self.doc_encoder = nn.Linear(dim, compressed)
        self.decoder = nn.Linear(compressed, dim) if decoder else None

    def encode_queries(self, q: torch.Tensor) -> torch.Tensor:
        return self.query_encoder(q)

    def encode_docs(self, d: torch.Tensor) -> torch.Tensor:
        return self.doc_encoder(d)

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, folder / CONAE_FILE)

    @classmethod
    def load(cls, folder: str | Path) -> "ConAE":
        state = load_file(Path(folder) / CONAE_FILE)
        compressed, dim = state["query_encoder.weight"].shape
        model = cls(dim, compressed, decoder="decoder.weight" in state)
        model.load_state_dict(state)
        return model


def kl_loss(teacher_scores: torch.Tensor, student_scores: torch.Tensor) -> torch.Tensor:
    """Eq. 3: KL(P_teacher || P_student) over each query's candidate documents, (B, k) scores; mean over queries."""
    p = F.log_softmax(teacher_scores.float(), dim=-1)
    q = F.log_softmax(student_scores.float(), dim=-1)
    return F.kl_div(q, p, log_target=True, reduction="batchmean")


def margin_loss(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """Eq. 5-6: mean over queries of 1 + tanh(f(., d-)) - tanh(f(., d+)), f the dot-product scores given."""
    return (1 + torch.tanh(negative) - torch.tanh(positive)).mean()


def conae_loss(model: ConAE, q: torch.Tensor, cand: torch.Tensor, teacher: torch.Tensor, pos: torch.Tensor,
               neg: torch.Tensor, lam: float = 0.1, kl: bool = True) -> dict[str, torch.Tensor]:
    """One batch: q (B, h) teacher query embeddings, cand (B, k, h) the teacher's top-k documents, teacher (B, k)
    their teacher scores, pos / neg (B, h) a positive and a negative document per query.

    A model without a decoder trains with L_KL alone ("w/o Decoder"); `kl=False` drops L_KL ("w/o KL")."""
    out: dict[str, torch.Tensor] = {}
    if kl:
        out["kl"] = kl_loss(teacher, torch.einsum("bl,bkl->bk", model.encode_queries(q), model.encode_docs(cand)))
    if model.decoder is not None:
        q_hat = model.decoder(model.encode_queries(q))  # (B, h)
        pos_hat, neg_hat = model.decoder(model.encode_docs(pos)), model.decoder(model.encode_docs(neg))
        out["l_q"] = margin_loss((q_hat * pos).sum(-1), (q_hat * neg).sum(-1))
        out["l_d"] = margin_loss((q * pos_hat).sum(-1), (q * neg_hat).sum(-1))
    if not out:
        raise ValueError("ConAE without a decoder and without L_KL has no loss to train with")
    autoencoder = out["l_q"] + out["l_d"] if "l_q" in out else 0.0
    out["loss"] = out["kl"] + lam * autoencoder if kl else autoencoder
    return out


@dataclass(frozen=True)
class Teacher:
    """What ConAE learns from, all from the frozen teacher: the training queries' and the corpus' embeddings, each
    query's top-k documents (rows of `docs`) with their scores, and its labelled positives (rows; at least one)."""

    queries: np.ndarray  # (n, h)
    docs: np.ndarray  # (N, h)
    top: np.ndarray  # (n, k) int rows of docs, best first
    scores: np.ndarray  # (n, k)
    positives: list[np.ndarray]  # n arrays of rows


def train_conae(teacher: Teacher, dim: int, *, lam: float, lr: float, batch_size: int, epochs: int, only_kl: bool,
                no_kl: bool, seed: int, on_step: Callable[[dict], None] | None = None) -> ConAE:
    """Adam over shuffled batches of training queries; each query draws one labelled positive and one negative from
    its teacher top-k (not a positive) per step. `on_step` gets {step, epoch, loss, kl, l_q, l_d} (those trained)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    h = teacher.docs.shape[1]
    model = ConAE(h, dim, decoder=not only_kl)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    docs = torch.from_numpy(np.ascontiguousarray(teacher.docs, dtype=np.float32))
    queries = torch.from_numpy(np.ascontiguousarray(teacher.queries, dtype=np.float32))
    scores = torch.from_numpy(np.ascontiguousarray(teacher.scores, dtype=np.float32))
    negatives = [np.setdiff1d(top, pos) for top, pos in zip(teacher.top, teacher.positives, strict=True)]
    if any(len(n) == 0 for n in negatives):  # (teacher_from leaves such queries out)
        raise ValueError("a training query's teacher top-k holds only its positives")
    step = 0
    for epoch in range(epochs):
        order = rng.permutation(len(queries))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            pos = [rng.choice(teacher.positives[i]) for i in idx]
            neg = [rng.choice(negatives[i]) for i in idx]
            parts = conae_loss(model, queries[idx], docs[torch.from_numpy(teacher.top[idx])], scores[idx], docs[pos],
                               docs[neg], lam=lam, kl=not no_kl)
            if not torch.isfinite(parts["loss"]):  # every step after it would train on NaN, and the projection too
                from ance_core.errors import AnceError

                raise AnceError(f"ConAE to {dim} dimensions: the loss is {float(parts['loss'])} at step {step + 1} "
                                f"(compression.lr {lr:g}); nothing was kept: lower compression.lr")
            optimizer.zero_grad(set_to_none=True)
            parts["loss"].backward()
            optimizer.step()
            step += 1
            if on_step is not None:
                on_step({"step": step, "epoch": epoch + 1} | {k: float(v.detach()) for k, v in parts.items()})
    return model.eval()


@dataclass(frozen=True)
class Projector:
    """An affine map per side: x -> x W^T + b, (h,) -> (L,). ConAE's encoders, PCA and truncation are all of this
    form, so a compressed checkpoint is the teacher plus these four arrays."""

    method: str
    query_weight: np.ndarray  # (L, h)
    query_bias: np.ndarray  # (L,)
    doc_weight: np.ndarray  # (L, h)
    doc_bias: np.ndarray  # (L,)

    @property
    def dim(self) -> int:
        return self.query_weight.shape[0]

    def queries(self, x: np.ndarray) -> np.ndarray:
        return (x @ self.query_weight.T + self.query_bias).astype(np.float32)

    def docs(self, x: np.ndarray) -> np.ndarray:
        return (x @ self.doc_weight.T + self.doc_bias).astype(np.float32)

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / PROJECTOR_FILE
        arrays = {k: np.ascontiguousarray(getattr(self, k), dtype=np.float32)
                  for k in ("query_weight", "query_bias", "doc_weight", "doc_bias")}
        save_numpy(arrays, str(path), metadata={"method": self.method})
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "Projector":
        from safetensors import safe_open

        path = Path(folder) / PROJECTOR_FILE
        with safe_open(str(path), "np") as f:
            method = (f.metadata() or {}).get("method", "unknown")
        return cls(method, **load_numpy(str(path)))

    @classmethod
    def from_conae(cls, model: ConAE, method: str = "conae") -> "Projector":
        w = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        return cls(method, w["query_encoder.weight"], w["query_encoder.bias"], w["doc_encoder.weight"],
                   w["doc_encoder.bias"])

    @classmethod
    def pca(cls, docs: np.ndarray | Iterable[np.ndarray], dim: int) -> "Projector":
        """PCA fitted on document embeddings (the paper's baseline): an (N, h) array or its rows in (n_i, h) chunks,
        streamed (`fit_pca`)."""
        return cls.from_pca(fit_pca(docs, dim))

    @classmethod
    def from_pca(cls, fit: "PcaFit") -> "Projector":
        """Documents map by x -> (x - mean) C, queries by x -> x C: a query centred too would score a document
        q C C^T d - mean C C^T d + const, and the middle term differs per document (even a lossless PCA would reorder
        the teacher's ranking); uncentred, the mean adds q C C^T mean, the same for every document of a query."""
        bias = -(fit.mean @ fit.components)
        return cls("pca", fit.components.T, np.zeros_like(bias), fit.components.T, bias)

    @classmethod
    def truncation(cls, h: int, dim: int) -> "Projector":
        """The first-L-dimensions baseline."""
        weight = np.eye(h, dtype=np.float32)[:dim]
        return cls("truncate", weight, np.zeros(dim, np.float32), weight, np.zeros(dim, np.float32))


@dataclass(frozen=True)
class PcaFit:
    """A PCA of document embeddings, what `Projector.from_pca` turns into the shared query / document map."""

    mean: np.ndarray  # (h,) float32
    components: np.ndarray  # (h, L) float32, orthonormal columns, leading direction first
    explained: np.ndarray  # (L,) float64: the share of the total variance along each component


def row_chunks(arrays: Iterable[np.ndarray], rows: int = PCA_CHUNK_ROWS) -> Iterator[np.ndarray]:
    """The rows of each (n_i, h) array (an in-memory array or a shard's memory map), `rows` at a time, as views."""
    for array in arrays:
        for start in range(0, len(array), rows):
            yield array[start:start + rows]


def mean_and_scatter(chunks: Iterable[np.ndarray]) -> tuple[int, np.ndarray, np.ndarray]:
    """(N, mean (h,), scatter (h, h) = sum of (x - mean)(x - mean)^T) of the rows of the chunks, in one pass in float64.

    Each chunk is centred on its own mean and merged pairwise (Chan, Golub & LeVeque), not summed as x x^T and
    corrected by N mean mean^T at the end: no cancellation when the mean is large against the spread, and the result
    does not depend on how the rows are chunked beyond rounding. Memory: two (h, h) and one chunk in float64."""
    n, mean, scatter = 0, np.zeros(0), np.zeros((0, 0))
    for chunk in chunks:
        if chunk.ndim != 2 or (n and chunk.shape[1] != len(mean)):
            raise ValueError(f"document embeddings: a chunk of shape {chunk.shape} after {n} rows of {len(mean)} dims")
        if not len(chunk):
            continue
        x = np.array(chunk, dtype=np.float64)  # (c, h): a copy, whatever the shard's dtype (float32, float16)
        c, chunk_mean = len(x), x.mean(axis=0)
        x -= chunk_mean
        if n == 0:
            mean, scatter = chunk_mean, x.T @ x
        else:
            delta = chunk_mean - mean  # (h,)
            scatter += x.T @ x + np.outer(delta, delta) * (n * c / (n + c))
            mean = mean + delta * (c / (n + c))
        n += c
        del x  # before the next chunk's copy is made: one chunk in float64 at a time
    if n == 0:
        raise ValueError("document embeddings: no rows to fit PCA on")
    if not np.isfinite(scatter).all():
        raise ValueError("document embeddings hold NaN or infinite values: PCA cannot be fitted")
    return n, mean, scatter


def fit_pca(docs: np.ndarray | Iterable[np.ndarray], dim: int) -> PcaFit:
    """PCA of the rows of `docs`, an (N, h) array or an iterable of (n_i, h) chunks (read once, never joined): the
    eigenvectors of the h x h covariance with the `dim` largest eigenvalues.

    Each component's sign is fixed (its largest-magnitude entry positive) so that a refit on the same rows, chunked
    otherwise, gives the same map. With fewer independent rows than `dim` (N - 1 < dim) the components past the data's
    span have zero variance and are an arbitrary orthonormal completion."""
    chunks = row_chunks([docs]) if isinstance(docs, np.ndarray) else docs
    n, mean, scatter = mean_and_scatter(chunks)
    h = len(mean)
    if not 1 <= dim <= h:
        raise ValueError(f"PCA dimension {dim} is not between 1 and the embeddings' {h}")
    eigenvalues, vectors = np.linalg.eigh(scatter / max(n - 1, 1))  # ascending
    eigenvalues, vectors = np.clip(eigenvalues[::-1][:dim], 0, None), vectors[:, ::-1][:, :dim]  # (L,), (h, L)
    lead = np.abs(vectors).argmax(axis=0)
    vectors = vectors * np.where(vectors[lead, np.arange(dim)] < 0, -1.0, 1.0)
    total = float(np.trace(scatter)) / max(n - 1, 1)
    explained = eigenvalues / total if total > 0 else np.zeros(dim)
    return PcaFit(mean.astype(np.float32), vectors.astype(np.float32), explained)


def teacher_from(docs: np.ndarray, doc_ids: list[str], queries: np.ndarray, query_ids: list[str],
                 positives: dict[str, set[str]], top_k: int) -> Teacher:
    """The training signal: each query's exact top-k by the teacher's inner product, and its labelled positives that
    are in the corpus. Queries without one are left out (they have no d+ for eq. 5-6), and so are those whose top-k
    holds only positives (no negative to draw), with a warning naming them."""
    import faiss

    from ance_core.errors import AnceError

    row = {d: i for i, d in enumerate(doc_ids)}
    keep = [i for i, q in enumerate(query_ids) if any(d in row for d in positives.get(q, ()))]
    if not keep:
        raise AnceError("compression: no training query has a labelled positive in the corpus: nothing to compress "
                        "with")
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(np.ascontiguousarray(docs, dtype=np.float32))
    k = min(top_k, len(docs))
    q = np.ascontiguousarray(queries[keep], dtype=np.float32)
    scores, top = index.search(q, k)
    pos = [np.array(sorted(row[d] for d in positives[query_ids[i]] if d in row)) for i in keep]
    has_negative = [len(np.setdiff1d(top[j], pos[j])) > 0 for j in range(len(keep))]
    usable = [j for j, ok in enumerate(has_negative) if ok]
    if len(usable) < len(keep):
        full = [query_ids[i] for i, ok in zip(keep, has_negative, strict=True) if not ok]
        advice = (f"raise compression.top_k (now {top_k})" if k < len(docs)
                  else f"the corpus ({len(docs)} documents) holds no document outside their positives")
        if not usable:
            raise AnceError(f"compression: every training query's teacher top-{k} holds only its positives (e.g. "
                            f"{', '.join(full[:5])}): no negative to train ConAE with; {advice}")
        warnings.warn(f"compression: {len(full)} training queries left out of ConAE, their teacher top-{k} holding "
                      f"only their positives ({', '.join(full[:5])}{', ...' if len(full) > 5 else ''}); {advice}",
                      stacklevel=2)
    return Teacher(q[usable], docs, top[usable], scores[usable], [pos[j] for j in usable])
