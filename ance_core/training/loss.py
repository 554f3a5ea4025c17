"""The NLL loss of ANCE eq. 5 as a pure function of embeddings."""

import torch
import torch.nn.functional as F


def nll_loss(
    q: torch.Tensor, p: torch.Tensor, group_size: int, in_batch: bool, mask: torch.Tensor | None = None,
    hardest: int | None = None,
) -> torch.Tensor:
    """-log softmax score of each query's positive among its own negatives (and, optionally, all other passages).

    q: (B, h) queries. p: (B * G, h) passages in groups of G = 1 + n per query, the positive first.
    in_batch: also contrast against the other queries' passages (columns of the whole batch).
    mask: (B, B * G) bool, True where a column must not count as a negative (e.g. another query's passage that
          is also a labelled positive of this query); only with in_batch.
    hardest: keep only each query's `hardest` highest-scoring negatives (NCE Neg: the hardest in-batch
          negatives); only with in_batch.
    """
    B = q.size(0)
    if in_batch:
        scores = q @ p.T  # (B, B*G)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        target = torch.arange(B, device=q.device) * group_size  # column of each query's own positive
        if hardest is not None:
            own = torch.zeros_like(scores, dtype=torch.bool)
            own[torch.arange(B), target] = True
            others = scores.detach().masked_fill(own, float("-inf"))
            keep = own.clone()
            keep.scatter_(1, others.topk(min(hardest, scores.size(1) - 1), dim=1).indices, True)
            scores = scores.masked_fill(~keep, float("-inf"))
    else:
        scores = torch.einsum("bh,bgh->bg", q, p.view(B, group_size, -1))  # (B, G)
        target = torch.zeros(B, dtype=torch.long, device=q.device)
    return F.cross_entropy(scores.float(), target)


def distill_loss(q: torch.Tensor, p: torch.Tensor, group_size: int, teacher: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) over each query's group (its positive and its mined negatives), batch mean: softmax of
    the teacher's logits (B, G) against the log-softmax of the student's q·p over the same G passages.

    Not sentence-transformers' DistillKLDivLoss, which divides student and teacher scores by one temperature and
    multiplies the loss by T². Here the temperature is the teacher's alone (`TeacherConfig.temperature`, applied
    when its scores are stored: negatives/teacher.py), putting a teacher's scale (cross-encoder logits: 1, a
    bi-encoder's cosines: ~0.05) on the student's; the student keeps its own scale (its q·p, as in the contrastive
    NLL beside it), and there is no T² factor (`train.distill_weight` weighs the term)."""
    B = q.size(0)
    student = torch.einsum("bh,bgh->bg", q, p.view(B, group_size, -1)).float()
    target = F.log_softmax(teacher.float(), dim=1)
    return F.kl_div(F.log_softmax(student, dim=1), target, log_target=True, reduction="batchmean")
