"""ANCE core library: data, BM25, BERT-Siamese model, training, encoding, index, mining, evaluation.

Pure library: imports torch, transformers, faiss, pandas, numpy -- never prefect or mlflow.
"""

__version__ = "0.2.0"
