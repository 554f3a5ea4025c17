"""ANCE core library: a pure library (torch, transformers, faiss, pandas, numpy; never prefect or mlflow).

Its rooms, each a subpackage that imports only the foundation and rooms below it (tests/test_layering.py):

  foundation    errors.py, faults.py, artifacts.py (stage folders), stage_config.py (the base of every config),
                work_folder.py (the folders a command writes to), run_records.py (the stages each run uses),
                retention.py (what a work folder keeps), allocator.py (the `ance` command's malloc), system_metrics.py
  data/         the collection, validated; the dev split
  compression/  ConAE, PCA and truncation projectors
  modeling/     the BERT-Siamese model and its checkpoints
  retrieval/    the inferencer: encode, index, search; BM25; evaluation
  negatives/    samplers, mining, the async trainer's refreshed negatives, negatives statistics
  training/     the trainer: loss, optimizer, loop, resumable state, torch.distributed
  pipeline/     a run's config, recipes, results table and plots
  export/       a checkpoint outside the pipeline: Encoder, sentence-transformers folder
"""

import os

# JAX, where installed with CUDA (bm25s imports it for its top-k), takes 75% of the GPU's memory the first time it
# starts a backend: torch's encoding then ran out of memory on an H200 (BENCHMARKS.md). BM25 needs no GPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

__version__ = "0.2.0"
