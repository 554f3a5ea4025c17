"""One thin Prefect task per pipeline stage: it resolves its inputs, has ance_core build the stage's
content-addressed folder (ance_core.artifacts.run_stage) and returns a small ArtifactRef. MLflow stays out of the tasks:
the flows record runs through the `tracking/` package, and the training tasks only add its live-logging callbacks.

  common.py    what every stage task shares: `stage_task` (content cache key, persisted results, retries with
               backoff), `run_task`, `StageLog`, fault injection (ANCE_FAULT)
  data.py      prepare-data: the dataset's tables, with the dev split and the training grades
  model.py     init-model: the starting checkpoint
  bm25.py      bm25-run: a split's BM25 top-k
  encode.py    encode-corpus: the corpus embeddings of a checkpoint
  index.py     build-index: the flat faiss index over them
  retrieve.py  dense-run: a split's dense top-k, and its labelled positives' exact scores
  mine.py      mine-negatives: each training pair's negatives, drawn by the configured sampler
  train.py     train (one round), the dev checks' candidate sets; `SchedulePlan`
  train_async.py train-async (all rounds, negatives refreshed in the background)
  evaluate.py  evaluate: a run's metrics on a split
  report.py    report: a pipeline run's results table
  analysis.py  negative-stats and score-profile: the training analyses
  compress.py  encode-queries, compress, ann-index and search-latency: embedding compression (ConAE)
  refresh.py   no task: the stage chains run for one checkpoint (`refresh_negatives`, `evaluate_stages`)
"""
