"""ConAE's model, loss and training, the projectors and the compressed indexes, on toy tensors."""

import math

import numpy as np
import pytest
import torch

from ance_core.compression.conae import (
    ConAE,
    Projector,
    conae_loss,
    fit_pca,
    kl_loss,
    margin_loss,
    teacher_from,
    train_conae,
)


def test_kl_is_zero_when_compressed_scores_equal_the_teachers_and_positive_otherwise():
    teacher = torch.tensor([[3.0, 1.0, 0.0], [0.5, 0.2, 2.0]])
    assert kl_loss(teacher, teacher).abs().item() < 1e-7
    assert kl_loss(teacher, teacher + 5.0).abs().item() < 1e-6  # a softmax does not see a shift
    p = torch.softmax(teacher, -1)
    flipped = teacher.flip(-1)
    by_hand = (p * (torch.log_softmax(teacher, -1) - torch.log_softmax(flipped, -1))).sum(-1).mean()
    assert kl_loss(teacher, flipped).item() == pytest.approx(by_hand.item(), rel=1e-6) and by_hand > 0.1


def test_margin_loss_by_hand():
    pos, neg = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    expected = ((1 + math.tanh(1.0) - math.tanh(2.0)) + (1 + math.tanh(1.0) - math.tanh(0.0))) / 2
    assert math.isclose(margin_loss(pos, neg).item(), expected, rel_tol=1e-6)


def test_shapes_ablations_and_weighting():
    torch.manual_seed(0)
    model = ConAE(16, 4)
    q, cand, teacher = torch.randn(3, 16), torch.randn(3, 5, 16), torch.randn(3, 5)
    pos, neg = cand[:, 0], cand[:, 1]
    assert model.encode_queries(q).shape == (3, 4) and model.encode_docs(cand).shape == (3, 5, 4)
    assert model.decoder(model.encode_queries(q)).shape == (3, 16)
    full = conae_loss(model, q, cand, teacher, pos, neg, lam=0.1)
    assert torch.isclose(full["loss"], full["kl"] + 0.1 * (full["l_q"] + full["l_d"]))
    no_kl = conae_loss(model, q, cand, teacher, pos, neg, kl=False)  # Table 3 "w/o KL"
    assert set(no_kl) == {"l_q", "l_d", "loss"} and torch.isclose(no_kl["loss"], full["l_q"] + full["l_d"])
    without_decoder = ConAE(16, 4, decoder=False)  # Table 3 "w/o Decoder": L_KL only
    only_kl = conae_loss(without_decoder, q, cand, teacher, pos, neg)
    assert set(only_kl) == {"kl", "loss"} and torch.equal(only_kl["loss"], only_kl["kl"])
    with pytest.raises(ValueError, match="no loss"):
        conae_loss(without_decoder, q, cand, teacher, pos, neg, kl=False)
    full["loss"].backward()
    assert model.decoder.weight.grad is not None and model.query_encoder.weight.grad is not None


def test_the_model_and_the_projector_round_trip(tmp_path):
    model = ConAE(16, 4)
    model.save(tmp_path)
    again = ConAE.load(tmp_path)
    x = torch.randn(2, 16)
    assert torch.equal(model.encode_queries(x), again.encode_queries(x)) and again.decoder is not None
    ConAE(16, 4, decoder=False).save(tmp_path / "nd")
    assert ConAE.load(tmp_path / "nd").decoder is None

    projector = Projector.from_conae(model)
    projector.save(tmp_path)
    loaded = Projector.load(tmp_path)
    assert loaded.method == "conae" and loaded.dim == 4
    xs = x.numpy()
    with torch.no_grad():
        assert np.allclose(loaded.queries(xs), model.encode_queries(x).numpy(), atol=1e-6)
        assert np.allclose(loaded.docs(xs), model.encode_docs(x).numpy(), atol=1e-6)


def test_pca_and_truncation_projectors():
    rng = np.random.default_rng(0)
    docs = (rng.normal(size=(500, 8)) * np.array([10, 5, 1, 0.1, 0.1, 0.1, 0.1, 0.1])).astype(np.float32)
    fit = fit_pca(docs, 2)
    assert fit.components.shape == (8, 2)
    assert np.allclose(fit.components[:2], np.eye(2), atol=0.05)  # the two high-variance axes, signs made positive
    pca = Projector.pca(docs, 2)
    assert np.allclose(pca.docs(docs), (docs - fit.mean) @ fit.components, atol=1e-4)
    assert np.allclose(pca.queries(docs[:3]), docs[:3] @ fit.components, atol=1e-4)  # the same C, queries uncentred
    cut = Projector.truncation(8, 3)
    assert np.array_equal(cut.docs(docs), docs[:, :3]) and cut.method == "truncate"


def _easy_set(n_docs=200, h=32, intrinsic=6, seed=0):
    """Unit vectors in a 6-dim subspace of a 32-dim space; queries are noisy copies of the first 80 documents."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(h, intrinsic)))[0].T  # (6, 32) orthonormal rows
    low = rng.normal(size=(n_docs, intrinsic))
    docs = (low / np.linalg.norm(low, axis=1, keepdims=True)) @ basis * 3
    queries = docs[:80] + rng.normal(scale=0.01, size=(80, h))
    return docs.astype(np.float32), queries.astype(np.float32)


def test_compressed_index_returns_the_same_top1_as_the_full_one_on_an_easy_set():
    import faiss

    docs, queries = _easy_set()
    doc_ids, query_ids = [f"d{i}" for i in range(len(docs))], [f"q{i}" for i in range(len(queries))]

    def top1(d: np.ndarray, q: np.ndarray) -> np.ndarray:
        index = faiss.IndexFlatIP(d.shape[1])
        index.add(np.ascontiguousarray(d))
        return index.search(np.ascontiguousarray(q), 1)[1][:, 0]

    full = top1(docs, queries)
    assert (full == np.arange(80)).all()  # the set is easy: every query finds the document it copies
    teacher = teacher_from(docs, doc_ids, queries, query_ids, {q: {f"d{i}"} for i, q in enumerate(query_ids)}, 20)
    assert teacher.top.shape == (80, 20) and (teacher.top[:, 0] == np.arange(80)).all()
    losses = []
    model = train_conae(teacher, 8, lam=0.1, lr=1e-2, batch_size=16, epochs=60, only_kl=False, no_kl=False, seed=0,
                        on_step=losses.append)
    assert losses[-1]["kl"] < 0.2 * losses[0]["kl"]  # it learns the teacher's distribution
    for projector in (Projector.from_conae(model), Projector.pca(docs, 8)):
        compressed = top1(projector.docs(docs), projector.queries(queries))
        assert (compressed == full).all(), projector.method


def test_a_loss_that_is_not_finite_stops_conae_in_one_line():
    """Found by a review: at a learning rate far too high the weights, then the loss, became NaN, and the NaN
    projection was kept (compressed embeddings of NaN, searched as if they were embeddings)."""
    from ance_core.errors import AnceError

    docs, queries = _easy_set()
    doc_ids, query_ids = [f"d{i}" for i in range(len(docs))], [f"q{i}" for i in range(len(queries))]
    teacher = teacher_from(docs, doc_ids, queries, query_ids, {q: {f"d{i}"} for i, q in enumerate(query_ids)}, 20)
    with pytest.raises(AnceError, match=r"ConAE to 8 dimensions: the loss is nan at step \d+ \(compression.lr "
                                        r"1e\+20\); nothing was kept: lower compression.lr"):
        train_conae(teacher, 8, lam=0.1, lr=1e20, batch_size=16, epochs=3, only_kl=False, no_kl=False, seed=0)


def test_config_refuses_contradictory_ablations_and_repeated_entries():
    from pydantic import ValidationError

    from ance_core.compression.config import CompressConfig

    with pytest.raises(ValidationError, match="only_kl and no_kl"):
        CompressConfig(only_kl=True, no_kl=True)
    with pytest.raises(ValidationError, match="dims lists one twice"):
        CompressConfig(dims=[128, 128])
    with pytest.raises(ValidationError):
        CompressConfig(methods=["svd"])


def test_a_query_whose_top_k_holds_only_positives_is_left_out_with_a_warning(recwarn):
    from ance_core.errors import AnceError

    docs, queries = _easy_set()
    doc_ids, query_ids = [f"d{i}" for i in range(len(docs))], [f"q{i}" for i in range(len(queries))]
    positives = {q: {f"d{i}"} for i, q in enumerate(query_ids)}
    top5 = np.argsort(-(queries[:1] @ docs.T), axis=1)[0, :5]
    positives["q0"] = {f"d{i}" for i in top5}  # q0's whole top-5 is relevant: no negative to draw
    with pytest.warns(UserWarning, match=r"1 training queries left out of ConAE.*\(q0\); raise compression.top_k"):
        teacher = teacher_from(docs, doc_ids, queries, query_ids, positives, 5)
    assert len(teacher.queries) == 79 and len(teacher.positives) == len(teacher.top) == 79
    train_conae(teacher, 4, lam=0.1, lr=1e-2, batch_size=16, epochs=1, only_kl=False, no_kl=False, seed=0)
    with pytest.raises(AnceError, match="the corpus \\(2 documents\\) holds no document outside their positives"):
        teacher_from(docs[:2], doc_ids[:2], queries[:2], query_ids[:2], {"q0": {"d0", "d1"}, "q1": {"d0", "d1"}}, 20)
