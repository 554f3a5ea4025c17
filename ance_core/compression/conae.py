"""Embedding compression (ConAE, ../shared/papers/002): a trained retriever's frozen embeddings from h to L dims.

ConAE: separate linear encoders for queries and documents (h -> L, eq. 2) and one linear decoder (L -> h, eq. 4).
Loss (eq. 7) = L_KL + λ (L_q + L_d):
  L_KL (eq. 3)  KL(teacher softmax over its top-k documents for the query || softmax of the compressed scores over
                the same documents), mean over queries;
  L_q, L_d      the tanh margin losses of eq. 5-6: the decoded query against the teacher's positive / negative
                document embeddings, and the teacher's query against the decoded documents. The positive is a
                labelled one, the negative one sampled from the teacher's top-k.
Ablations (Table 3): "w/o Decoder" trains with L_KL only (no decoder is built), "w/o KL" with L_q + L_d only.

Baselines: PCA fitted on the document embeddings, and keeping the first L dimensions.

Every method ends as a `Projector`: an affine map per side (query, document), saved as `projector.safetensors`
beside a checkpoint's weights; encoding with such a checkpoint applies it (ance_core/retrieval/encode.py).
"""

from collections.abc import Callable
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
    if any(len(n) == 0 for n in negatives):
        raise ValueError("a training query's teacher top-k holds only its positives: raise compression.top_k")
    step = 0
    for epoch in range(epochs):
        order = rng.permutation(len(queries))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            pos = [rng.choice(teacher.positives[i]) for i in idx]
            neg = [rng.choice(negatives[i]) for i in idx]
            parts = conae_loss(model, queries[idx], docs[torch.from_numpy(teacher.top[idx])], scores[idx], docs[pos],
                               docs[neg], lam=lam, kl=not no_kl)
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
    def pca(cls, docs: np.ndarray, dim: int) -> "Projector":
        """PCA fitted on document embeddings (the paper's baseline); queries and documents share the map
        x -> (x - mean) C = x C - mean C."""
        mean, components = fit_pca(docs, dim)
        bias = -(mean @ components)
        return cls("pca", components.T, bias, components.T, bias)

    @classmethod
    def truncation(cls, h: int, dim: int) -> "Projector":
        """The first-L-dimensions baseline."""
        weight = np.eye(h, dtype=np.float32)[:dim]
        return cls("truncate", weight, np.zeros(dim, np.float32), weight, np.zeros(dim, np.float32))


def fit_pca(docs: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean (h,), components (h, L)) of the rows of `docs`, leading directions first."""
    docs = docs.astype(np.float64)
    mean = docs.mean(axis=0)
    _, _, vt = np.linalg.svd(docs - mean, full_matrices=False)
    return mean.astype(np.float32), vt[:dim].T.astype(np.float32)


def teacher_from(docs: np.ndarray, doc_ids: list[str], queries: np.ndarray, query_ids: list[str],
                 positives: dict[str, set[str]], top_k: int) -> Teacher:
    """The training signal: each query's exact top-k by the teacher's inner product, and its labelled positives that
    are in the corpus. Queries without one are left out (they have no d+ for eq. 5-6)."""
    import faiss

    row = {d: i for i, d in enumerate(doc_ids)}
    keep = [i for i, q in enumerate(query_ids) if any(d in row for d in positives.get(q, ()))]
    if not keep:
        raise ValueError("no training query has a labelled positive in the corpus: nothing to compress with")
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(np.ascontiguousarray(docs, dtype=np.float32))
    q = np.ascontiguousarray(queries[keep], dtype=np.float32)
    scores, top = index.search(q, min(top_k, len(docs)))
    pos = [np.array(sorted(row[d] for d in positives[query_ids[i]] if d in row)) for i in keep]
    return Teacher(q, docs, top, scores, pos)
