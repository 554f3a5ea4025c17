"""Side-by-side comparison of negative samplers (ANCE Table 1, SimANS Tables 2 and 5) behind the deployment
`compare-negatives`: the same model, data, seed and training budget for each sampler, all starting from one BM25
warm-up checkpoint ("BM25 -> *"). Every stage is a cached task shared with the pipeline (the warm-up, the warm-up
model's corpus encoding and ranking of the training queries are computed once for all samplers)."""

from pathlib import Path

import numpy as np
import pandas as pd
from prefect import flow

from ance_core.analysis import ranks_relative_to_positive
from ance_core.artifacts import ArtifactRef
from ance_core.config import CompareConfig
from ance_core.report import COLUMNS, StageTiming, markdown_table, read_report
from ance_core.samplers import get_sampler, train_config_for
from flows.ance_pipeline import flow_tags, link_mlflow_run
from tasks.analysis import analyse_negatives, read_stats, score_profile_task
from tasks.common import StageLog, run_task
from tasks.data import prepare_data
from tasks.model import init_checkpoint
from tasks.refresh import evaluate_stages, refresh_negatives
from tasks.report import report
from tasks.train import train_round
from tracking.closing import closing_lines
from tracking.run import PipelineTracking, train_log

WARMUP = "BM25 warm-up"


@flow(name="compare-negatives", log_prints=True)
def compare_negatives(config: CompareConfig = CompareConfig()) -> dict:
    c, wd = config, config.work_dir
    split, eval_split = c.data.train_split, c.data.eval_split
    log = StageLog()
    timings, stage = log.timings, log.run
    evaluations: list[tuple[str, ArtifactRef]] = []
    stats: dict[str, ArtifactRef] = {}
    tracking = PipelineTracking(c, flow_tags(), experiment="compare-negatives")
    link_mlflow_run(tracking)

    data = stage("data", "prepare", prepare_data, c.data, wd)
    tracking.set_dataset(data.digest)
    start = run_task(init_checkpoint, c.model, wd)
    negatives = log.record(WARMUP, refresh_negatives(None, data, split, c.encode, c.index, c.bm25_negatives, 0, wd,
                                                     c.bm25))
    with tracking.live(WARMUP, timings):
        warm = stage(WARMUP, "train", train_round, start, negatives["mine"], data, split,
                     train_config_for(c.bm25_negatives, c.warmup), wd)
    refs = log.record(WARMUP, evaluate_stages(warm, data, eval_split, c.eval.top_k, c.encode, c.index, wd))
    evaluations.append((WARMUP, refs["evaluate"]))
    profiles = {WARMUP: run_task(score_profile_task, warm, refs["index"], data, eval_split, wd)}
    rankings: dict[str, tuple[ArtifactRef, ArtifactRef]] = {}  # dense sampler -> (its ranking, its negatives)
    for sampler in c.samplers:
        spec = get_sampler(sampler)
        mining = c.mining.model_copy(update={"sampler": sampler, "top_k": c.mining.top_k if spec.needs_model else None})
        mined = refresh_negatives(warm, data, split, c.encode, c.index, mining, 1, wd, c.bm25)
        # encode, index and retrieve belong to the warm-up model (recorded with its evaluation)
        log.record(sampler, {name: mined[name] for name in ("bm25", "mine") if name in mined})
        with tracking.live(sampler, timings):
            trained = stage(sampler, "train", train_round, warm, mined["mine"], data, split,
                            train_config_for(mining, c.ance), wd)
        refs = log.record(sampler, evaluate_stages(trained, data, eval_split, c.eval.top_k, c.encode, c.index, wd))
        evaluations.append((sampler, refs["evaluate"]))
        profiles[sampler] = run_task(score_profile_task, trained, refs["index"], data, eval_split, wd)
        if spec.mines:
            stats[sampler] = analyse_negatives(mined["mine"], trained, refs["index"], data, split, c.encode, c.index,
                                               wd)
        if spec.needs_model:
            rankings[sampler] = (mined["retrieve"], mined["mine"])

    summary = run_task(report, evaluations, timings, eval_split, c.data.dataset, wd)
    result = read_report(summary)
    table = comparison_table(result["results"], timings, stats)
    result["markdown"] = f"## Negative samplers, {c.data.dataset} {eval_split}\n\n{table}\n\n" + result["markdown"]
    print(result["markdown"])
    out = Path(wd) / "compare" / summary.digest  # the table and the plots as files, beside MLflow's copies
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(result["markdown"])
    plots = plot_analyses(profiles, rankings, out)
    tracked = tracking.finish_safely(result, timings, evaluations, data.path, stats, extra_plots=plots,
                                     plots_dir=out)
    print(f"table and plots: {out}")
    closing = closing_lines(tracked)
    print("\n".join(closing))
    link_mlflow_run(tracking, result["markdown"], closing)
    return {"table": table, "results": result["results"], "report_dir": summary.path, "files": str(out),
            "tracking": tracked,
            "train_seconds": {t.label: t.ref.seconds for t in timings if t.stage == "train"}}


def comparison_table(results: list[dict], timings: list[StageTiming], stats: dict[str, ArtifactRef]) -> str:
    """ANCE Table 1's layout: a row per sampler, the metrics, training wall time, and the training analyses."""
    train = {t.label: t for t in timings if t.stage == "train"}
    rows = []
    for r in results:
        log = train_log(train[r["model"]].ref.path) if r["model"] in train else []
        norms = [sum(x[k] for x in log) / len(log) if log and k in log[0] else None
                 for k in ("grad_norm_bottom", "grad_norm_top")]
        overlap = read_stats(stats[r["model"]])["overlap"] if r["model"] in stats else None
        rows.append([r["model"], *(f"{r[k]:.4f}" for k in COLUMNS),
                     f"{train[r['model']].ref.seconds:.0f}" if r["model"] in train else "—",
                     f"{log[-1]['loss'] if log else float('nan'):.4f}",
                     " / ".join(f"{n:.2f}" if n is not None else "—" for n in norms),
                     f"{100 * overlap:.1f}%" if overlap is not None else "—"])
    header = ["sampler", *COLUMNS.values(), "train wall time (s)", "last loss", "grad norm bottom / top (mean)",
              "negatives in own top-100"]
    return markdown_table(header, rows)


def plot_analyses(profiles: dict[str, ArtifactRef], rankings: dict[str, tuple[ArtifactRef, ArtifactRef]],
                  out: Path) -> list[Path]:
    """score_profiles.png: the mean top-100 score profile of each model (ANCE ICLR Fig. 3's long tail);
    sampled_ranks.png: where the dense samplers' negatives sit relative to the positive's rank (SimANS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for label, ref in profiles.items():
        profile = np.load(Path(ref.path, "profile.npy"))
        ax.plot(np.arange(1, profile.shape[1] + 1), profile.mean(axis=0), lw=1, label=label)
    ax.set(xlabel="rank", ylabel="score minus corpus mean", xscale="log",
           title="top-100 scores of 10 evaluation queries (mean)")
    ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(out / "score_profiles.png", dpi=110), plt.close(fig)
    paths = [out / "score_profiles.png"]
    if rankings:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for sampler, (run, negatives) in rankings.items():
            offsets = ranks_relative_to_positive(pd.read_parquet(Path(negatives.path, "negatives.parquet")),
                                                 pd.read_parquet(Path(run.path, "run.parquet")))
            if len(offsets):
                ax.hist(offsets, bins=np.arange(offsets.min(), offsets.max() + 2) - 0.5, histtype="step",
                        label=f"{sampler} ({len(offsets)} negatives)")
        ax.set(xlabel="rank of the sampled negative minus rank of the positive", ylabel="negatives",
               title="where the sampled negatives sit relative to the positive")
        ax.legend(fontsize=7)
        fig.tight_layout(), fig.savefig(out / "sampled_ranks.png", dpi=110), plt.close(fig)
        paths.append(out / "sampled_ranks.png")
    return paths
