import math

import torch

from ance_core.training.loss import nll_loss


def test_nll_matches_hand_computation_without_in_batch():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[2.0, 0.0], [1.0, 0.0],   # query 0: positive score 2, negative 1
                      [0.0, 1.0], [0.0, 3.0]])  # query 1: positive score 1, negative 3
    expected = (-math.log(math.e**2 / (math.e**2 + math.e)) - math.log(math.e / (math.e + math.e**3))) / 2
    assert math.isclose(nll_loss(q, p, 2, in_batch=False).item(), expected, rel_tol=1e-6)


def test_in_batch_adds_other_queries_passages_and_mask_removes_them():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    s0 = [2.0, 1.0, 0.0, 0.0]  # query 0 against all four passages
    s1 = [0.0, 0.0, 1.0, 3.0]
    ce = lambda s, t: -s[t] + math.log(sum(math.exp(x) for x in s))  # noqa: E731
    assert math.isclose(nll_loss(q, p, 2, in_batch=True).item(), (ce(s0, 0) + ce(s1, 2)) / 2, rel_tol=1e-6)
    mask = torch.zeros(2, 4, dtype=torch.bool)
    mask[0, 2] = mask[0, 3] = True  # those two are also positives of query 0: not negatives
    masked = (ce(s0[:2], 0) + ce(s1, 2)) / 2
    assert math.isclose(nll_loss(q, p, 2, in_batch=True, mask=mask).item(), masked, rel_tol=1e-6)


def test_loss_is_low_when_positive_dominates():
    q = torch.tensor([[10.0, 0.0]])
    p = torch.tensor([[10.0, 0.0], [0.0, 10.0], [0.0, -10.0]])
    assert nll_loss(q, p, 3, in_batch=False).item() < 1e-30 + 1e-6


def test_nce_keeps_only_the_hardest_in_batch_negatives():
    """Group size 1 (no mined negatives): each query contrasts with the other queries' positives; `hardest=1`
    keeps only the highest-scoring one of them."""
    ce = lambda s, t: -s[t] + math.log(sum(math.exp(x) for x in s))  # noqa: E731
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    p = torch.tensor([[2.0, 0.0], [0.5, 1.0], [3.0, 0.5]])
    scores = q @ p.T  # row 0: [2.0, 0.5, 3.0]  row 1: [0.0, 1.0, 0.5]  row 2: [2.0, 1.5, 3.5]
    hardest = [ce([2.0, 3.0], 0), ce([1.0, 0.5], 0), ce([3.5, 2.0], 0)]  # positive + its best-scoring other
    assert math.isclose(nll_loss(q, p, 1, in_batch=True, hardest=1).item(), sum(hardest) / 3, rel_tol=1e-6)
    everything = [ce(scores[i].tolist(), i) for i in range(3)]
    assert math.isclose(nll_loss(q, p, 1, in_batch=True, hardest=2).item(), sum(everything) / 3, rel_tol=1e-6)
