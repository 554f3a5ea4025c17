"""`ance-tune`: the recipe chosen on the user's own dev split (ance_core/pipeline/tune.py: candidates, rungs,
decision). Every trial is a pipeline run of one candidate under one seed, a cached Prefect task (`trial`), run where
`execution` says (one after another in the flow's process, or as Ray tasks), with its MLflow run nested under the
search's; the search's report (tune/<key>/: tune.md, tune.json, and recipe.yaml, the winner's whole config for `ance
run --config`) is a stage folder of its own.

`recipe: auto` (`ance run --recipe auto`) is this search followed by the pipeline with the winner's config: its run
under the first seed is one of the trials (every stage cached), so the search's cost is the whole cost.
"""

import json
import math
import time
from pathlib import Path

import yaml
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from ance_core.artifacts import ArtifactRef, read_manifest, run_stage, write_json
from ance_core.data.dataset import read_tables
from ance_core.pipeline.config import PipelineConfig, apply_sets
from ance_core.pipeline.report import DEV_KEY, markdown_table
from ance_core.pipeline.tune import Candidate, Rung, Scores, TuneConfig, candidates, decide, rungs, survivors
from ance_core.retention import live_run
from flows.ance_pipeline import train_and_evaluate
from flows.book import Trial, flow_tags
from tasks.common import run_task, stage_task
from tasks.data import prepare_data
from tasks.execution import run_mapped
from tracking.client import Tracker, flatten

EXPERIMENT = "ance-tune"
TRIAL_JSON, TUNE_JSON, TUNE_MD, RECIPE_YAML = "trial.json", "tune.json", "tune.md", "recipe.yaml"
SEED_FIELDS = ("warmup", "ance", "mining", "bm25_negatives")


def trial_config(base: PipelineConfig, candidate: Candidate, seed: int, full: bool) -> PipelineConfig:
    """The pipeline config of a trial: the base with the candidate's overrides, the seed of every stage, and (the
    warm-up rung) no rounds."""
    raw = apply_sets(base.model_dump(mode="json"), [*candidate.sets(), *(f"{f}.seed={seed}" for f in SEED_FIELDS)],
                     PipelineConfig)
    if not full:
        raw["rounds"] = 0
    return PipelineConfig.model_validate(raw)


def dense_score(result: dict) -> tuple[str, float]:
    """The dense model a run delivers (its best on the dev split, the starting one included; no hybrid row) and its
    dev nDCG@10."""
    dense = [r for r in result["results"] if r["model"] != "BM25" and not r["model"].endswith(" + BM25")
             and DEV_KEY in r]
    best = max(reversed(dense), key=lambda r: r[DEV_KEY])  # (a tie: the later, as the run's own selection)
    return best["model"], best[DEV_KEY]


@stage_task("trial", ignore=("parent_run", "name"))
def trial(config: PipelineConfig, data_digest: str, parent_run: str | None = None, name: str = "trial"
          ) -> ArtifactRef:
    """One pipeline run of a search (`config`: a candidate under a seed), its result kept as trial.json: every model's
    dev and evaluation metrics, the dense model it delivers and its dev nDCG@10 (the trial's score)."""

    def build(out):
        started = time.time()
        result = train_and_evaluate(config, Trial(EXPERIMENT, parent_run, name))
        model, score = dense_score(result)
        record = {"score": score, "model": model, "selected": result["selected"], "results": result["results"],
                  "started_from": result.get("started_from"), "seconds": round(time.time() - started, 1),
                  "mlflow_run_id": result.get("mlflow_run_id")}
        write_json(out / TRIAL_JSON, record)
        return {"score": score, "model": model}

    return run_stage(config.work_dir, "trial", {"pipeline": config}, {"data": data_digest}, build)


def read_trial(ref: ArtifactRef) -> dict:
    return json.loads(Path(ref.path, TRIAL_JSON).read_text())


class Search:
    """The trials of one search: what ran, their scores and seconds, the budget left."""

    def __init__(self, base: PipelineConfig, cfg: TuneConfig, data_digest: str, tracker: Tracker,
                 parent: str | None):
        self.base, self.cfg, self.data_digest, self.tracker, self.parent = base, cfg, data_digest, tracker, parent
        self.started = time.time()
        self.trials: list[dict] = []
        self.stopped: str | None = None

    def seconds_left(self) -> float:
        return self.cfg.budget_minutes * 60 - (time.time() - self.started)

    def estimate(self, full: bool) -> float:
        """A trial's expected seconds: the mean of those of its kind built so far (cached ones took none)."""
        built = [t["seconds"] for t in self.trials if t["full"] == full and not t["cached"]]
        return sum(built) / len(built) if built else 0.0

    def run(self, scores: Scores, chosen: list[Candidate], rung: Rung) -> None:
        """The rung's trials of `chosen` not run yet, while the budget lasts (in order: the simplest first)."""
        calls = [(c, seed) for c in chosen for seed in rung.seeds
                 if (seed, rung.full) not in scores.values.get(c.name, {})]
        execution = self.base.execution
        batch = 1 if execution.task_runner == "local" else execution.workers
        for start in range(0, len(calls), batch):
            part = calls[start:start + batch]
            if self.seconds_left() < self.estimate(rung.full) * math.ceil(len(part) / batch):
                self.stopped = (f"the budget of {self.cfg.budget_minutes:g} minutes stopped the search at rung "
                                f"{rung.number} ({len(calls) - start} of its trials not run)")
                return
            kwargs = [{"config": trial_config(self.base, c, seed, rung.full), "data_digest": self.data_digest,
                       "parent_run": self.parent, "name": f"{c.name} · seed {seed}"
                       + ("" if rung.full else " · warm-up only")} for c, seed in part]
            began = time.time()
            refs = run_mapped(trial, kwargs, execution)
            for (c, seed), ref in zip(part, refs, strict=True):
                record = read_trial(ref)
                scores.add(c.name, seed, rung.full, record["score"])
                self.trials.append({"candidate": c.name, "seed": seed, "full": rung.full, "rung": rung.number,
                                    "score": record["score"], "model": record["model"], "cached": ref.cached,
                                    "seconds": 0.0 if ref.cached else round((time.time() - began) / len(part), 1),
                                    "path": ref.path, "mlflow_run_id": record.get("mlflow_run_id")})
                print(f"trial {c.name} · seed {seed}{'' if rung.full else ' · warm-up only'}: dev nDCG@10 "
                      f"{record['score']:.4f} ({record['model']}){' (cached)' if ref.cached else ''}")


def search(base: PipelineConfig, cfg: TuneConfig, data: ArtifactRef, tracker: Tracker, parent: str | None
           ) -> tuple[Candidate, dict, list[Candidate], Search]:
    tables = read_tables(data.path, corpus_columns=[])
    train = tables.split_qrels(base.data.train_split)
    grades = sorted(int(g) for g in set(train.loc[train["relevance"] > 0, "relevance"]))
    pool = candidates(cfg, base.warmup.learning_rate, base.data.train_min_relevance, base.warmup.epochs, grades)
    baseline = pool[0]
    scores, state = Scores([c.name for c in pool]), Search(base, cfg, data.digest, tracker, parent)
    print(f"recipe search: {len(pool)} candidates, rungs over seeds {cfg.seeds}, eta {cfg.eta}, margin "
          f"{cfg.margin}, budget {cfg.budget_minutes:g} minutes")
    alive = pool
    for rung in rungs(cfg):
        state.run(scores, [baseline, *(c for c in alive if c is not baseline)], rung)
        if state.stopped:
            break
        ranked = survivors(scores, [c.name for c in alive], rung, cfg.eta)
        alive = [c for c in pool if c.name in ranked]
        if rung.full and len(rung.seeds) == len(cfg.seeds):
            break
    winner, evidence = decide(scores, baseline.name, cfg.margin)
    return next(c for c in pool if c.name == winner), evidence, pool, state


def report(pool: list[Candidate], state: Search, winner: Candidate, evidence: dict) -> str:
    """tune.md: every candidate's scores by seed (warm-up rung, then the whole recipe), mean, paired difference."""
    table = evidence["table"]
    rows = []
    for c in pool:
        runs = {(t["seed"], t["full"]): t["score"] for t in state.trials if t["candidate"] == c.name}
        warm = runs.get((state.cfg.seeds[0], False))
        full = [f"{runs[(s, True)]:.4f}" if (s, True) in runs else "—" for s in state.cfg.seeds]
        row = table.get(c.name, {})
        diff = row.get("paired_diff")
        rows.append([f"**{c.name}** (chosen)" if c == winner else c.name, ", ".join(c.sets()) or "—",
                     f"{warm:.4f}" if warm is not None else "—", *full,
                     f"{row['mean']:.4f}" if row else "—", f"{diff:+.4f}" if diff is not None else "—"])
    header = ["candidate", "overrides", f"warm-up only, seed {state.cfg.seeds[0]}",
              *(f"seed {s}" for s in state.cfg.seeds), "mean", "paired diff to baseline"]
    spent = sum(t["seconds"] for t in state.trials)
    return (f"## Recipe search (dev nDCG@10 of the dense model each trial delivers)\n\n{markdown_table(header, rows)}"
            f"\n\n**Chosen: {winner.name}** — {evidence['reason']}."
            + (f" {state.stopped[0].upper()}{state.stopped[1:]}." if state.stopped else "")
            + f"\n\n{len(state.trials)} trials ({sum(t['cached'] for t in state.trials)} cached), {spent:.0f} s.\n")


@flow(name="ance-tune", log_prints=True)
def tune_recipe(config: PipelineConfig = PipelineConfig(), tune: TuneConfig = TuneConfig()) -> dict:
    """Choose the recipe on the dev split of `config`'s dataset (module docstring); `config` is the base the
    candidates vary (a recipe's config, with the user's `--set`s). Returns the winner's name, overrides and whole
    config, and where the search's report is."""
    if config.data.dev_split is None:
        from ance_core.errors import AnceError

        raise AnceError("ance tune chooses on the dev split, and data.dev_split is null")
    with live_run(config.work_dir, "ance-tune"):
        data = run_task(prepare_data, config.data, config.work_dir)
        tracker = Tracker(config.work_dir, EXPERIMENT)
        tags = {k: v for k, v in flow_tags().items() if v} | {"dataset": config.data.dataset}
        parent = tracker.start_run(f"{EXPERIMENT} {tags.get('prefect.flow_run_name', '')}".strip(), tags=tags)
        tracker.log_params(parent, flatten(tune) | {f"base.{k}": v for k, v in flatten(config).items()})
        winner, evidence, pool, state = search(config, tune, data, tracker, parent)
        chosen = trial_config(config, winner, tune.seeds[0], True)
        markdown = report(pool, state, winner, evidence)

        def build(out):
            write_json(out / TUNE_JSON, {"winner": winner.name, "overrides": winner.overrides,
                                         "candidates": [{"name": c.name, "overrides": c.overrides} for c in pool],
                                         "trials": state.trials, "evidence": evidence, "stopped": state.stopped})
            (out / TUNE_MD).write_text(markdown)
            (out / RECIPE_YAML).write_text(yaml.safe_dump(chosen.model_dump(mode="json"), sort_keys=False))

        trials = sorted(t["path"] for t in state.trials)
        folder = run_stage(config.work_dir, "tune", {"tune": tune, "base": config, "trials": trials},
                           {"data": data.digest}, build)
        print(markdown)
        for name, row in evidence["table"].items():
            safe = "".join(ch if ch.isalnum() else "_" for ch in name)[:60]
            tracker.log_metrics(parent, {f"mean_dev_ndcg_at_10.{safe}": row["mean"]})
        tracker.set_tags(parent, {"winner": winner.name, "reason": evidence["reason"][:5000]})
        for name in (TUNE_MD, TUNE_JSON, RECIPE_YAML):
            tracker.log_artifact(parent, Path(folder.path, name), "tune")
        tracker.end_run(parent)
        create_markdown_artifact(markdown, key="ance-tune", description="the recipe search and its choice")
    return {"winner": winner.name, "overrides": winner.overrides, "config": chosen.model_dump(mode="json"),
            "report_dir": folder.path, "markdown": markdown, "reason": evidence["reason"], "stopped": state.stopped,
            "trials": state.trials, "mlflow_run_id": parent, "summary": read_manifest(folder.path).get("summary")}
