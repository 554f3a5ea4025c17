"""MLflow tracking of pipeline runs, which never slows or stops the pipeline; the only package that imports mlflow.

Embedded default: a SQLite store `<work_dir>/mlflow.db` with artifacts in `<work_dir>/mlartifacts/`, so a run logs
everything with no server; `MLFLOW_TRACKING_URI` points it at a server instead (`make up` starts one).

- `client`: `Tracker`, the MLflow client through which every call goes. When the store or server fails, a warning is
  printed once, calls go straight to the spool for a while before MLflow is tried again, and each call that was not
  delivered is appended to `<work_dir>/mlflow-undelivered.jsonl`. Also the store's file lock, the tracking URI, and
  MLflow's settings (`configure_mlflow`: telemetry off, short HTTP retries), applied before mlflow is imported.
- `live`: `LiveMetrics`, training steps streamed from a background thread while a stage trains (failed batches are
  retried), and `live_callbacks`, through which the training task joins it.
- `run`: `PipelineTracking`, the parent run and a nested run per model, opened at flow start and completed at flow
  end (metrics, negatives statistics, checkpoints, evaluations, plots, results table, registry and champion alias);
  `run_url`, a run's page on a tracking server.
- `registry`: model versions of `ance-<dataset>`, the `champion` alias moved on the dev split,
  `champion_checkpoint`, `models:/ance-<dataset>@champion` downloaded for `retrain`, and
  `download_registered_model`, any version downloaded (with what the registry knows of it) for `ance export`.
- `uploads`: `log_checkpoint`, a checkpoint logged as an MLflow model once per experiment (a run whose checkpoint an
  earlier run holds is tagged `checkpoint_in_run` with that run's id).
- `closing`: `closing_lines`, what a run prints when it ends.

Importing any of them sets nothing and does not import mlflow.
"""
