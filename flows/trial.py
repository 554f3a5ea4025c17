"""One trial of a recipe search (flows/tune.py): a candidate under a seed, run as a whole pipeline run (its warm-up
only on the warm-up rung) and kept as a stage folder of its own, trial.json: its models' metrics and its score."""

import json
import time
from pathlib import Path

from ance_core.artifacts import ArtifactRef, run_stage, write_json
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.loading import apply_sets
from ance_core.pipeline.tune import Candidate, trial_score
from ance_core.retrieval.config import ExecutionConfig
from flows.ance_pipeline import train_and_evaluate
from flows.book import Trial
from tasks.common import stage_task

EXPERIMENT = "ance-tune"
TRIAL_JSON = "trial.json"
SEED_FIELDS = ("warmup", "ance", "mining", "bm25_negatives")


def trial_config(base: PipelineConfig, candidate: Candidate, seed: int, full: bool, local: bool = False
                 ) -> PipelineConfig:
    """The pipeline config of a trial: the base with the candidate's overrides and the seed of every stage; the
    warm-up rung (not `full`) trains the warm-up only, planned as in the whole recipe (`warmup_only`: the same
    warm-up, which the whole recipe's trial then reuses). `local`: the trial's own stages in its process (a trial
    that is itself a Ray task)."""
    raw = apply_sets(base.model_dump(mode="json"), [*candidate.sets(), *(f"{f}.seed={seed}" for f in SEED_FIELDS)],
                     PipelineConfig)
    raw["warmup_only"] = not full  # (a base config's own warmup_only would make every whole trial a warm-up)
    if local:
        raw["execution"] = {"task_runner": "local"}
    return PipelineConfig.model_validate(raw)


@stage_task("trial", ignore=("parent_run", "name"))
def trial(config: PipelineConfig, data_digest: str, parent_run: str | None = None, name: str = "trial"
          ) -> ArtifactRef:
    """One pipeline run of a search (`config`: a candidate under a seed; under `selection: cv` a run per dev fold,
    nested under it), its result kept as trial.json: every model's
    dev and evaluation metrics, and the trial's score (`trial_score`) with its model."""

    def build(out):
        started = time.time()
        result = train_and_evaluate(config, Trial(EXPERIMENT, parent_run, name))
        model, score = trial_score(result, full=not config.warmup_only)
        record = {"score": score, "model": model, "selected": result["selected"], "results": result["results"],
                  "started_from": result.get("started_from"), "seconds": round(time.time() - started, 1),
                  "mlflow_run_id": result.get("mlflow_run_id"),
                  "stages": [{k: s[k] for k in ("for", "stage", "path", "seconds", "cached")}
                             for s in result["stages"]]}
        write_json(out / TRIAL_JSON, record)
        return {"score": score, "model": model}

    # (a trial under one-se scores the model that rule delivers since session 9; before, the best dense one: a new
    # key for those only, so trials under `best`, whose scores did not change, stay cached; under cv, pooled)
    scored = {"best": {}, "cv": {"scores": "the delivered dense model, pooled over the dev folds"}}.get(
        getattr(config, "selection", "best"), {"scores": "the delivered dense model"})
    keyed = config.model_copy(update={"execution": ExecutionConfig()})  # where its shards ran changes no result
    # (SimANS centres each pair on its own positive since session 29: a trial of a recipe that mines with it trained
    # on other negatives, a new key for those only)
    if config.mining.sampler == "simans" and config.rounds and not config.warmup_only:
        scored |= {"simans_centre": "own positive"}
    return run_stage(config.work_dir, "trial", {"pipeline": keyed} | scored, {"data": data_digest}, build)


def read_trial(ref: ArtifactRef) -> dict:
    return json.loads(Path(ref.path, TRIAL_JSON).read_text())
