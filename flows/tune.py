"""`ance-tune`: the recipe chosen on the user's own dev split (ance_core/pipeline/tune.py: candidates, rungs,
decision). Every trial is a pipeline run of one candidate under one seed (under `selection: cv`, one per dev fold,
scored pooled over them), a cached Prefect task (`trial`, flows/trial.py), run where `execution` says (one after
another in the flow's process, or as Ray tasks), with its MLflow run nested under the search's; the search's report
(tune/<key>/: tune.md, tune.json, and recipe.yaml, the winner's whole config for `ance run --config`) is a stage
folder of its own.

`recipe: auto` (`ance run --recipe auto`) is this search followed by the pipeline with the winner's config: when the
winner ran whole under the first seed, that run is one of its trials (every stage cached), else it trains now.
"""

import os
import tempfile
import time
from pathlib import Path

import yaml
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from ance_core.artifacts import MANIFEST, ArtifactRef, read_manifest, run_stage, write_json
from ance_core.data.dataset import read_tables
from ance_core.data.splits import fold_count
from ance_core.errors import AnceError, warn
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.recipes import recipe_config, recipe_drift
from ance_core.pipeline.tune import (
    FULL_OVER_WARM,
    Candidate,
    Rung,
    Scores,
    TuneConfig,
    batch_costs,
    candidate_metrics,
    candidates,
    decide,
    rungs,
    survivors,
    training_pairs,
    whole_reserve,
)
from ance_core.run_records import live_run
from flows.ance_pipeline import check_dev_folds, check_pipeline
from flows.names import dataset_run_name
from flows.publish import artifact_key, flow_tags, publish
from flows.trial import EXPERIMENT, read_trial, trial, trial_config
from flows.tune_inputs import from_the_form, no_dev_split, unused_seeds
from flows.tune_report import report
from tasks.common import run_task
from tasks.data import prepare_data
from tasks.execution import run_mapped
from tracking.client import Tracker, flatten

TUNE_JSON, TUNE_MD, RECIPE_YAML = "tune.json", "tune.md", "recipe.yaml"
KINDS = ("warm-up", "whole", "new seed")  # trials timed apart: a warm-up (rung 0), a whole recipe under the first
# seed (its warm-up reused from rung 0), a whole recipe under a later seed (its warm-up trained too)
FEW_DEV = 13  # dev queries below which the search says its comparisons are noise (RESULTS.md: leads of ~0.01 on
# 5-13 dev queries that the test split did not hold)


class Search:
    """The trials of one search: what ran, their scores and seconds, the budget left."""

    def __init__(self, base: PipelineConfig, cfg: TuneConfig, data_digest: str, tracker: Tracker,
                 parent: str | None):
        self.base, self.cfg, self.data_digest, self.tracker, self.parent = base, cfg, data_digest, tracker, parent
        self.baseline: str | None = None  # the baseline candidate's name (set by `search`)
        self.started = time.time()
        self.trials: list[dict] = []
        self.parts: dict[str, list[list]] = {kind: [] for kind in KINDS}  # per batch run: [its wall seconds,
        # {candidate: its trial's cost}] (a reused trial's: the time it took when it ran; less the work others shared,
        # `_share`)
        self.failed: list[str] = []
        self.reused = 0.0  # seconds that trials reused from an earlier search (or stages from a run outside it) took
        # when they ran: budgeted too
        self.seen: set[str] = set()  # the stage folders of the trials run so far (`trial_cost`)
        self.stopped: str | None = None  # the budget ended the search
        self.cut: str | None = None  # the warm-up rung stopped early, leaving the budget to whole recipes
        self.few: str | None = None  # the dev split is too small to tell candidates apart
        self.owners: dict[str, tuple] = {}  # stage folder -> where its seconds are counted: the batch (kind, index),
        # its trial's candidate, those seconds, built in that batch (`_share`)
        self.shared: dict[str, float] = {}  # candidate -> seconds of its trial's work others reused (`_share`)
        self.positives_run: set = set()  # the positives rules trials have trained on (`_positives`)

    def seconds_left(self) -> float:
        """The budget less this search's wall time and the time its reused trials took when they ran: a search
        resumed after an interruption (or extended with a larger budget) decides as an uninterrupted one would."""
        return self.cfg.budget_minutes * 60 - (time.time() - self.started) - self.reused

    @property
    def batches(self) -> dict[str, list[float]]:
        """Each kind's batches' seconds: a batch's wall time, or its longest trial's cost where that is longer."""
        return {kind: [max(wall, *costs.values()) for wall, costs in parts] for kind, parts in self.parts.items()}

    def estimate(self, kind: str) -> float:
        """A batch of trials' expected wall seconds: the mean of the batches of its kind (`KINDS`) run so far (a
        reused one at the time it took when it ran); before one ran, a whole recipe's is FULL_OVER_WARM warm-ups', and
        a new seed's adds its warm-up."""
        walls = self.batches[kind]
        if walls:
            return sum(walls) / len(walls)
        if kind == "whole":
            return FULL_OVER_WARM * self.estimate("warm-up")
        return self.estimate("whole") + self.estimate("warm-up") if kind == "new seed" else 0.0

    def run(self, scores: Scores, chosen: list[Candidate], rung: Rung) -> None:
        """The rung's trials of `chosen` not run yet, while the budget lasts, in `chosen`'s order (the baseline, then
        the warm-up rung's candidates simplest first, a later rung's best first): one at a time in this process, or
        `execution.workers` at once as Ray tasks (each trial's own stages then run in its task). A challenger's trial
        that fails (after its retries, none for a user error) is recorded and its candidate leaves the search. The
        budget: a warm-up trial starts while its time is left (and the time of two whole recipes, once two warm-ups
        ran); a whole rung's trials, seed by seed, only when all of that seed's fit (`estimate`), and once started
        they all run; rung 1's, timed on a guess, as many as fit, and after its first pair only while they fit."""
        calls = [(c, seed) for seed in rung.seeds for c in chosen
                 if (seed, rung.full) not in scores.values.get(c.name, {}) and c.name not in self.failed]
        execution = self.base.execution
        on_ray = execution.task_runner != "local"
        batch = execution.workers if on_ray else 1
        parts = []  # batches of one seed each (a batch never straddles two seeds' groups)
        for seed in dict.fromkeys(s for _, s in calls):
            group = [call for call in calls if call[1] == seed]
            parts += [group[k:k + batch] for k in range(0, len(group), batch)]
        for n, part in enumerate(parts):
            left = sum(map(len, parts[n:]))  # trials not run yet
            seed = part[0][1]
            # a whole recipe under the first seed reuses its warm-up rung's warm-up; under a new seed it trains one
            kind = "whole" if seed == self.cfg.seeds[0] else "new seed"
            if rung.full and (n == 0 or parts[n - 1][0][1] != seed):  # a seed's whole recipes: all or none, so
                batches = [p for p in parts[n:] if p[0][1] == seed]  # every comparison the decision makes is paired
                fit = int(max(self.seconds_left(), 0) // max(self.estimate(kind), 1e-9))
                if fit < len(batches) and rung.number == 1 and self._pair([c.name for b in batches[:fit] for c, _ in
                                                                           b]):
                    # the first whole rung: the baseline and its best challengers that fit (what the warm-up rung's
                    # reserve kept time for), rather than no whole recipe at all
                    dropped = sum(map(len, batches[fit:]))
                    parts[n:] = batches[:fit] + [p for p in parts[n:] if p[0][1] != seed]  # (the loop reads on)
                    self.cut = ((f"{self.cut}; " if self.cut else "") + f"rung 1 ran {sum(map(len, batches[:fit]))} "
                                f"of its {sum(map(len, batches))} whole recipes (the baseline and the best "
                                f"challengers first), to fit the budget")
                    left -= dropped
                elif fit < len(batches):
                    self.stopped = (f"the budget of {self.cfg.budget_minutes:g} minutes stopped the search at rung "
                                    f"{rung.number} (seed {seed}'s {sum(map(len, batches))} trials would not fit; "
                                    f"{left} of its trials not run)")
                    return
            ran = [name for name, values in scores.values.items() if (seed, True) in values]
            if rung.full and rung.number == 1 and n and parts[n - 1][0][1] == seed and self._pair(ran) \
                    and self.seconds_left() < self.estimate(kind):
                # its group was let in on a guess (no whole recipe had been timed): once the baseline and a challenger
                # ran, the rest of it only while it fits what they took
                self.cut = ((f"{self.cut}; " if self.cut else "") + f"rung 1 ran {len(ran)} of its {len(ran) + left} "
                            "whole recipes (the baseline and the best challengers first): the next did not fit")
                return
            warmups = sum(not t["full"] for t in self.trials)
            # a warm-up of positives no trial trained on yet builds its own data, BM25 and zero-shot stages: the
            # shared work `_share` took out of the estimate, paid again
            fresh = any(self._positives(c) not in self.positives_run for c, _ in part)
            warm = self.estimate("warm-up") + max(self.shared.values(), default=0.0) * fresh
            if not rung.full and warmups >= 2 and self.seconds_left() < warm + whole_reserve(
                    self.estimate("warm-up"), self.estimate("whole")):
                self.cut = (f"the warm-up rung stopped after {warmups} of its {warmups + left} trials, to leave the "
                            "budget to whole recipes")
                return
            if not rung.full and self.seconds_left() < warm:
                self.stopped = (f"the budget of {self.cfg.budget_minutes:g} minutes stopped the search at rung "
                                f"{rung.number} ({left} of its trials not run)")
                return
            kwargs = [{"config": trial_config(self.base, c, seed, rung.full, local=on_ray),
                       "data_digest": self.data_digest, "parent_run": self.parent,
                       "name": f"{c.name} · seed {seed}" + ("" if rung.full else " · warm-up only")}
                      for c, seed in part]
            began = time.time()
            refs = self._mapped(kwargs, part)
            records = [read_trial(ref) if ref is not None else None for ref in refs]
            wall = time.time() - began
            # what the batch's trials cost (`trial_cost`: a reused trial's seconds when it ran, and the stages reused
            # from outside the search; side by side on Ray: the longest), beyond what the batch took now
            done = [(c.name, r) for (c, _), r in zip(part, records, strict=True) if r is not None]
            costs = batch_costs(done, self.seen)
            took = max(costs.values(), default=0.0)
            self.reused += max(took - wall, 0.0)
            self.positives_run |= {self._positives(c) for (c, _), r in zip(part, records, strict=True) if r}
            if done:
                self.parts[kind if rung.full else "warm-up"].append([wall, costs])
                self._share(done, kind if rung.full else "warm-up")
            for (c, seed), ref, record, call in zip(part, refs, records, kwargs, strict=True):
                if ref is None:
                    continue
                if ref.cached:
                    self._cached_run(call["name"], record)
                scores.add(c.name, seed, rung.full, record["score"])
                self.trials.append({"candidate": c.name, "seed": seed, "full": rung.full, "rung": rung.number,
                                    "score": record["score"], "model": record["model"], "cached": ref.cached,
                                    "seconds": record["seconds"] if not ref.cached else 0.0,
                                    "path": ref.path, "mlflow_run_id": record.get("mlflow_run_id")})
                print(f"trial {c.name} · seed {seed}{'' if rung.full else ' · warm-up only'}: dev nDCG@10"
                      f"{' pooled over the dev folds' if self.base.selection == 'cv' else ''} "
                      f"{record['score']:.4f} ({record['model']}){' (cached)' if ref.cached else ''}")

    def _share(self, done: list[tuple[str, dict]], kind: str) -> None:
        """A stage that another candidate's trial reuses is work the trials share (BM25's and the zero-shot model's
        rankings of one data stage): its seconds leave the cost of the trial that paid them (`owners`; and its batch's
        wall when it was built there), so that the trials after it are not estimated as if each paid them again (the
        budget still counts them; a warm-up of new positives adds them back, `shared`). A search after `ance run` had
        its first warm-up's estimate hold the zero-shot encoding, reserved two whole recipes at twice that, and
        compared none."""
        index = len(self.parts[kind]) - 1
        for name, record in done:
            for stage in record.get("stages", ()):
                if stage.get("for") == "data":  # (built before any trial: in no batch's seconds)
                    continue
                owner = self.owners.setdefault(stage["path"], (kind, index, name, stage["seconds"],
                                                               not stage["cached"]))
                if owner[2] == name or owner[3] <= 0:
                    continue
                batch = self.parts[owner[0]][owner[1]]
                batch[1][owner[2]] = max(batch[1][owner[2]] - owner[3], 0.0)
                if owner[4]:  # (built in that batch: in its wall too)
                    batch[0] = max(batch[0] - owner[3], 0.0)
                self.shared[owner[2]] = self.shared.get(owner[2], 0.0) + owner[3]
                self.owners[stage["path"]] = (*owner[:3], 0.0, owner[4])  # (taken out once)

    def _positives(self, candidate: Candidate):
        """The training positives a candidate's trials read (its data stage): the base's, or its own rule's."""
        return candidate.overrides.get("data.train_min_relevance", "base")

    def _pair(self, names: list[str]) -> bool:
        """Whether these trials' candidates are the baseline and at least one challenger beside it."""
        return self.baseline in names and len(names) >= 2

    def _cached_run(self, name: str, record: dict) -> None:
        """A trial reused from an earlier search (cached) still gets a run nested under this search's, pointing at
        the run that trained it, so that every search's run lists all of its trials."""
        if self.tracker is None or self.parent is None:
            return
        run = self.tracker.start_run(f"{name} (cached)", parent_id=self.parent, tags={
            "trial": "true", "cached": "true", "trial_run_id": record.get("mlflow_run_id") or "",
            "trial_model": record["model"], "selection": self.base.selection})  # (cv: the score is pooled)
        self.tracker.log_metrics(run, {"trial_dev_ndcg_at_10": record["score"]})
        self.tracker.end_run(run)

    def _mapped(self, kwargs: list[dict], part: list[tuple[Candidate, int]]) -> list[ArtifactRef | None]:
        """The trials' references; None for a challenger's trial that failed (the candidate leaves the search, with
        a warning: a learning rate that diverges is one of the things searched). The baseline's failure stops the
        search: every other candidate is paired with it, and a bad dataset fails it first (it runs first). Configs
        were validated before any trial (`check_candidates`)."""
        refs = []  # (each trial of a Ray batch runs to its end: a failed one is not run again for the others)
        for (c, seed), ref in zip(part, run_mapped(trial, kwargs, self.base.execution, errors=True), strict=True):
            if isinstance(ref, BaseException):
                if c.name == self.baseline:  # every other candidate is paired with it: the search cannot go on
                    raise ref
                warn(f"recipe search: the trial of {c.name} under seed {seed} failed; {c.name} "
                     f"leaves the search ({type(ref).__name__}: {ref})")
                self.failed.append(c.name)
                ref = None
            refs.append(ref)
        return refs


def check_candidates(base: PipelineConfig, pool: list[Candidate], seeds: list[int]) -> None:
    """Every trial's config validated, and checked as a run checks it, before any trial: a candidate the config
    refuses is one clear error now, not a failed trial later (a trial that fails then is that candidate's own)."""
    for c in pool:
        try:
            for seed in seeds:
                for full in (False, True):
                    check_pipeline(trial_config(base, c, seed, full), devices=not base.execution.on_gpu_workers)
        except (AnceError, ValueError) as e:
            raise AnceError(f"recipe search: the candidate {c.name} ({', '.join(c.sets()) or 'the base config'}) "
                            f"is refused: {e}") from None


def search(base: PipelineConfig, cfg: TuneConfig, data: ArtifactRef, tracker: Tracker, parent: str | None
           ) -> tuple[Candidate, dict, list[Candidate], Search]:
    tables = read_tables(data.path, corpus_columns=[])
    train = tables.split_qrels(base.data.train_split)
    grades = sorted(int(g) for g in set(train.loc[train["relevance"] > 0, "relevance"]))
    rate = base.warmup.learning_rate if base.ance.learning_rate == base.warmup.learning_rate else None
    varied = cfg
    if base.warmup.max_steps is not None and set(cfg.warmup_epochs) - {base.warmup.epochs}:
        warn(f"recipe search: warmup.max_steps {base.warmup.max_steps} is set, and it overrides the warm-up's epochs: "
             f"the candidates of warmup_epochs {cfg.warmup_epochs} would train the baseline's warm-up again, so they "
             "are left out (unset warmup.max_steps to search the epochs)")
        varied = cfg.model_copy(update={"warmup_epochs": [base.warmup.epochs]})
    pool = candidates(varied, rate, base.data.train_min_relevance, base.warmup.epochs, grades,
                      pairs=lambda rule: training_pairs(tables, base.data.train_split, rule))
    check_candidates(base, pool, cfg.seeds)
    baseline = pool[0]
    scores, state = Scores([c.name for c in pool]), Search(base, cfg, data.digest, tracker, parent)
    state.baseline = baseline.name
    qrels = tables.qrels  # (the dev queries a trial is scored on: those with a relevant document)
    dev = qrels.loc[(qrels["split"] == base.data.dev_split) & (qrels["relevance"] > 0), "query_id"].nunique()
    if base.selection != "cv" and dev < FEW_DEV and len(pool) > 1:
        folds = fold_count(base.data.dev_fraction)
        state.few = (f"the dev split holds {dev} queries, on which differences between candidates under ~0.01 "
                     "nDCG@10 are noise" + (f"; --set selection=cv scores each trial on every fold's dev queries "
                                            f"({folds} folds, as many times the cost)" if folds >= 2 else ""))
        warn(f"recipe search: {state.few}")
    print(f"recipe search: {len(pool)} candidates, rungs over seeds {cfg.seeds}, eta {cfg.eta}, margin "
          f"{cfg.margin}, budget {cfg.budget_minutes:g} minutes")
    alive = pool[1:]  # the challengers; the baseline runs every rung beside them
    for rung in rungs(cfg):
        state.run(scores, [baseline, *alive], rung)
        if state.stopped:
            break
        ranked = survivors(scores, [c.name for c in alive if c.name not in state.failed], rung, cfg.eta)
        alive = [next(c for c in pool if c.name == name) for name in ranked]  # best first: a budget cut keeps them
        if not alive:  # every challenger failed: the baseline's further seeds would compare with nothing
            break
    winner, evidence = decide(scores, baseline.name, cfg.margin, state.failed)
    if not evidence["compared"] and len(pool) > 1:
        warn(f"recipe search: no whole recipe was compared ({evidence['reason']}), so {baseline.name} is kept "
             f"untried against the others; a larger budget (--budget-minutes, {cfg.budget_minutes:g} now) compares "
             "them")
    return next(c for c in pool if c.name == winner), evidence, pool, state


@flow(name="ance-tune", flow_run_name=dataset_run_name, log_prints=True)
def tune_recipe(config: PipelineConfig = recipe_config(TuneConfig().recipe), tune: TuneConfig = TuneConfig()) -> dict:
    """Choose the recipe on the dev split of `config`'s dataset (module docstring). Returns the winner's name,
    overrides and whole config, and where the search's report is.

    Args:
        config: The base the candidates vary: the search's base recipe (tune.recipe, `demo`) with the user's changes.
        tune: What the search varies (learning rates, graded positives, warm-up epochs), its seeds and its budget.
    """
    if config.data.dev_split is None:
        raise AnceError(no_dev_split(config))
    config = from_the_form(config, tune)
    if drift := recipe_drift(config, tune.recipe):
        warn(f"tune.recipe '{tune.recipe}': the search's base config does not hold its {', '.join(drift)}; the "
             f"baseline candidate is the config as given, named '{tune.recipe} (baseline)'")
    with live_run(config.work_dir, "ance-tune"):
        data = run_task(prepare_data, config.data, config.work_dir)
        if config.selection == "cv":  # every fold's split, before any trial (each trial runs them all)
            check_dev_folds(config)
        if config.data.dev_split not in read_manifest(data.path)["summary"].get("splits", []):
            raise AnceError(no_dev_split(config))
        if ignored := unused_seeds(config, tune.seeds):
            warn(f"ance tune runs every trial under its own seeds {tune.seeds} (tune.seeds), so the config's "
                 f"{', '.join(f'{k} {v}' for k, v in ignored.items())} {'is' if len(ignored) == 1 else 'are'} not used "
                 f"(to search under other seeds: --seed, or --tune-set seeds=[...])")
        tracker = Tracker(config.work_dir, EXPERIMENT)
        tags = {k: v for k, v in flow_tags().items() if v} | {"dataset": config.data.dataset}
        parent = tracker.start_run(f"{EXPERIMENT} {tags.get('prefect.flow_run_name', '')}".strip(), tags=tags)
        with tracker.ended_on_failure(lambda: [parent]):
            tracker.log_params(parent, flatten(tune) | {f"base.{k}": v for k, v in flatten(config).items()})
            winner, evidence, pool, state = search(config, tune, data, tracker, parent)
            chosen = trial_config(config, winner, tune.seeds[0], True)
            markdown = report(pool, state, winner, evidence)

            def build(out):
                write_report(out)
                (out / RECIPE_YAML).write_text(yaml.safe_dump(chosen.model_dump(mode="json"), sort_keys=False))

            def write_report(out: Path) -> None:
                write_json(out / TUNE_JSON, {"winner": winner.name, "overrides": winner.overrides,
                                             "candidates": [{"name": c.name, "overrides": c.overrides} for c in pool],
                                             "trials": state.trials, "evidence": evidence, "stopped": state.stopped,
                                             "cut": state.cut})
                (out / TUNE_MD).write_text(markdown)

            trials = sorted(t["path"] for t in state.trials)
            notes = {"stopped": state.stopped, "cut": state.cut, "failed": state.failed}  # (a search of the same
            # trials that the budget stopped elsewhere, or in which a candidate failed, writes its own report)
            folder = run_stage(config.work_dir, "tune", {"tune": tune, "base": config, "trials": trials,
                                                         "notes": notes}, {"data": data.digest}, build)
            if folder.cached:  # the newest search of these settings is this one (earlier_budget reads the time)
                os.utime(Path(folder.path, MANIFEST))
            print(markdown)
            tracker.log_metrics(parent, candidate_metrics(evidence["table"]))
            tracker.set_tags(parent, {"winner": winner.name, "reason": evidence["reason"][:5000]})
            with tempfile.TemporaryDirectory() as this:  # this search's report (a reused folder's is the first's:
                write_report(Path(this))  # its trials then ran, now they are cached)
                for name in (TUNE_MD, TUNE_JSON):
                    tracker.log_artifact(parent, Path(this, name), "tune")
            tracker.log_artifact(parent, Path(folder.path, RECIPE_YAML), "tune")
            tracker.end_run(parent)
        publish(create_markdown_artifact, markdown, key=artifact_key("ance-tune", config.data.collection),
                description="the recipe search and its choice")
    return {"winner": winner.name, "overrides": winner.overrides, "config": chosen.model_dump(mode="json"),
            "report_dir": folder.path, "markdown": markdown, "reason": evidence["reason"], "stopped": state.stopped,
            "trials": state.trials, "mlflow_run_id": parent, "summary": read_manifest(folder.path).get("summary")}
