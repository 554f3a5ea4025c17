"""Prefect flows: each composes the stage tasks of `tasks/` (every stage a cached task with a content-addressed
folder), which do the work, and assembles their results into tables and reports; the pipeline, compare and compress
flows record their runs in MLflow through the `tracking/` package. prefect.yaml deploys them (`make deploy`); the
`ance` command runs them in-process.

  ance_pipeline.py  `ance-train` (deployments ance-train and ance-train-gpu; `ance run`, `ance demo`): BM25 warm-up,
                    ANCE rounds (sync or async refresh), every model evaluated, the results report, the registry;
                    `retrain` (deployment retrain, weekly when its schedule is on): the rounds again from the
                    registry's champion (the work folder's newest trained model when there is none)
  stages.py         `bm25-warmup` and `refresh-negatives` (deployments of the same names): the warm-up alone (the
                    pipeline with `warmup_only`), and the inferencer alone (encode, index, mine with a checkpoint)
  evaluate.py       `evaluate` (deployment evaluate; `ance evaluate`): a checkpoint's metrics on a split;
                    `bm25-baseline` (`ance bm25`)
  compare.py        `compare-negatives` (deployment compare-negatives; `ance compare`): each negative sampler trained
                    from one BM25 warm-up checkpoint, side by side
  compress.py       `compress` (deployment compress; `ance compress`, and the pipeline's `compression` option): ConAE,
                    PCA and truncation of a trained model's embeddings, quality, index size and latency
  book.py           no flow: the bookkeeping of an ance-train or compare-negatives run (`RunBook`), the MLflow link
  start.py          no flow: where `retrain` and `compress` start (a given checkpoint, else the registry's champion,
                    else <work_dir>/latest.json, which every pipeline run records)
"""
