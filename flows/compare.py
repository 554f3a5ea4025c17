"""Side-by-side comparison of negative samplers (ANCE Table 1, SimANS Tables 2 and 5) behind the deployment
`compare-negatives`: the same model, data, seed and training budget for each sampler, all starting from one BM25
warm-up checkpoint ("BM25 -> *"). Every stage is a cached task (the warm-up, the warm-up model's corpus encoding and
ranking of the training queries are computed once for all samplers). The data, BM25 and zero-shot stages are shared
with the pipeline; the warm-up is not: it trains on its own learning-rate schedule, where the pipeline's
`schedule: continuous` spans the warm-up and the rounds."""

from pathlib import Path

import numpy as np
import pandas as pd
from prefect import flow

from ance_core.artifacts import NEGATIVES, PROFILE, RUN, ArtifactRef, atomic_folder
from ance_core.errors import collect_warnings
from ance_core.negatives.analysis import ranks_relative_to_positive, read_stats
from ance_core.negatives.samplers import get_sampler, train_config_for
from ance_core.pipeline.config import CompareConfig
from ance_core.pipeline.report import COLUMNS, StageTiming, markdown_table
from ance_core.run_records import live_run
from flows.book import RunBook
from flows.names import dataset_run_name
from tasks.analysis import score_profile_task
from tasks.common import run_task
from tasks.model import init_checkpoint
from tracking.run import train_log

COMPARISON_MD = "comparison.md"

WARMUP = "BM25 warm-up"


@flow(name="compare-negatives", flow_run_name=dataset_run_name, log_prints=True)
def compare_negatives(config: CompareConfig = CompareConfig()) -> dict:
    """The same model trained with each negative sampler from one BM25 warm-up checkpoint, in a table.

    Args:
        config: The samplers compared, their shared options and training budget, the dataset and model.
    """
    with live_run(config.work_dir, "compare-negatives"):  # the stages it uses, which garbage collection leaves
        return compare(config)


def compare(c: CompareConfig) -> dict:
    run = RunBook(c, "compare-negatives", dev=False)
    with run.ended_on_failure(), collect_warnings() as run.loose:  # (what is warned outside the stages' builds)
        return compare_stages(c, run)


def compare_stages(c: CompareConfig, run: RunBook) -> dict:
    wd, eval_split = c.work_dir, c.data.eval_split
    data = run.prepare_data()
    start = run_task(init_checkpoint, c.model, wd)
    warm_cfg = train_config_for(c.bm25_negatives, c.warmup)
    negatives = run.mine(WARMUP, None, None, c.bm25_negatives, 0, train=warm_cfg)["mine"]
    warm = run.train(WARMUP, "pretrained", start, negatives, warm_cfg, c.bm25_negatives.sampler)
    run.evaluate(WARMUP, warm)
    profiles = {WARMUP: run_task(score_profile_task, warm, run.models[WARMUP]["index"], data, eval_split, wd)}
    rankings: dict[str, tuple[ArtifactRef, ArtifactRef]] = {}  # dense sampler -> (its ranking, its negatives)
    for sampler in c.samplers:  # each from the warm-up checkpoint, with the same budget
        spec = get_sampler(sampler)
        mining = c.sampler_mining(sampler)
        round_cfg = train_config_for(mining, c.ance)
        # the warm-up scores BM25 candidates for mining.margin, as the starting model does in the pipeline's warm-up
        mined = run.mine(sampler, WARMUP, warm, mining, 1, scorer=WARMUP, train=round_cfg)
        trained = run.train(sampler, WARMUP, warm, mined["mine"], round_cfg, sampler, round_=1)
        run.evaluate(sampler, trained)
        profiles[sampler] = run_task(score_profile_task, trained, run.models[sampler]["index"], data, eval_split, wd)
        if spec.needs_model:
            rankings[sampler] = (mined["retrieve"], mined["mine"])

    summary, result = run.report()
    table = comparison_table(result["results"], run.log.timings, run.stats)
    result["markdown"] = f"## Negative samplers, {c.data.dataset} {eval_split}\n\n{table}\n\n" + result["markdown"]
    print(result["markdown"])
    out = Path(wd) / "compare" / summary.digest  # the table and the plots as files, beside MLflow's copies
    with atomic_folder(out) as folder:
        (folder / COMPARISON_MD).write_text(result["markdown"])
        tracked = run.track(result, folder, extra_plots=plot_analyses(profiles, rankings, folder))
    print(f"table and plots: {out}")
    run.conclude(tracked, result)
    return {"table": table, "results": result["results"], "report_dir": summary.path, "files": str(out),
            "tracking": tracked,
            "train_seconds": {t.label: t.ref.seconds for t in run.log.timings if t.stage == "train"}}


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
        profile = np.load(Path(ref.path, PROFILE))
        ax.plot(np.arange(1, profile.shape[1] + 1), profile.mean(axis=0), lw=1, label=label)
    ax.set(xlabel="rank", ylabel="score minus corpus mean", xscale="log",
           title="top-100 scores of 10 evaluation queries (mean)")
    ax.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(out / "score_profiles.png", dpi=110), plt.close(fig)
    paths = [out / "score_profiles.png"]
    if rankings:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for sampler, (run, negatives) in rankings.items():
            offsets = ranks_relative_to_positive(pd.read_parquet(Path(negatives.path, NEGATIVES)),
                                                 pd.read_parquet(Path(run.path, RUN)))
            if len(offsets):
                ax.hist(offsets, bins=np.arange(offsets.min(), offsets.max() + 2) - 0.5, histtype="step",
                        label=f"{sampler} ({len(offsets)} negatives)")
        ax.set(xlabel="rank of the sampled negative minus rank of the positive", ylabel="negatives",
               title="where the sampled negatives sit relative to the positive")
        ax.legend(fontsize=7)
        fig.tight_layout(), fig.savefig(out / "sampled_ranks.png", dpi=110), plt.close(fig)
        paths.append(out / "sampled_ranks.png")
    return paths
