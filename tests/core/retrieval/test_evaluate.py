import math

import pandas as pd
import pytest

from ance_core.retrieval.evaluate import evaluate_run


def test_metrics_against_hand_computed_values():
    qrels = pd.DataFrame({"query_id": ["1", "1", "2", "3"], "doc_id": ["a", "b", "c", "e"], "relevance": [1, 1, 1, 1]})
    run = pd.DataFrame({"query_id": ["1", "1", "1", "3"], "doc_id": ["x", "a", "b", "e"],
                        "score": [3.0, 2.0, 1.0, 5.0]})
    metrics, per_query = evaluate_run(run, qrels)
    # query 1: relevant at ranks 2 and 3; query 2: nothing retrieved (counts as 0); query 3: relevant at rank 1
    ndcg1 = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert per_query.set_index("query_id").loc["1", "ndcg_at_10"] == pytest.approx(ndcg1)
    assert metrics["ndcg_at_10"] == pytest.approx((ndcg1 + 0 + 1) / 3)
    assert metrics["mrr_at_10"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert metrics["recall_at_100"] == pytest.approx((1 + 0 + 1) / 3)
    assert len(per_query) == 3
