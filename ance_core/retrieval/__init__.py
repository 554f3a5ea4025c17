"""The inferencer of ANCE Fig. 2 and BM25: encoding the corpus and the queries, faiss indexes, dense search, the
BM25 baseline, and evaluation of a run (nDCG@10, MRR@10, recall)."""
