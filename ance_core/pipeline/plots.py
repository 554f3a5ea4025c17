"""The PNG plots of a pipeline run (matplotlib, Agg), written to a folder; tracking logs them to MLflow."""

from pathlib import Path


def quality_over_time(results: list[dict], timings: list) -> list[dict]:
    """Each model's evaluation and dev nDCG@10 against the run's wall time when it was evaluated: the stage seconds
    summed in run order up to its evaluation (reused stages count the time they took when built)."""
    elapsed, at = 0.0, {}
    for t in timings:
        elapsed += t.ref.seconds
        if t.stage == "evaluate":
            at[t.label] = elapsed
    return [{"model": r["model"], "seconds": at[r["model"]], "ndcg_at_10": r["ndcg_at_10"],
             "dev_ndcg_at_10": r.get("dev_ndcg_at_10")} for r in results if r["model"] in at]


def plot_quality_over_time(points: list[dict], split: str, dev_split: str | None, out: Path) -> Path:
    """quality_over_time.png: nDCG@10 on the evaluation and dev splits against wall time, one point per model (BM25
    as horizontal lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    models = [p for p in points if p["model"] != "BM25"]
    bm25 = next((p for p in points if p["model"] == "BM25"), None)
    for key, name, style in (("ndcg_at_10", split, "o-"), ("dev_ndcg_at_10", dev_split, "s--")):
        if name is None or not models or models[0][key] is None:
            continue
        line, = ax.plot([p["seconds"] / 60 for p in models], [p[key] for p in models], style, label=f"{name}")
        if bm25 is not None and bm25[key] is not None:
            ax.axhline(bm25[key], color=line.get_color(), lw=0.8, ls=":", label=f"BM25 ({name})")
    for p in models:
        ax.annotate(p["model"], (p["seconds"] / 60, p["ndcg_at_10"]), fontsize=7, xytext=(3, -10),
                    textcoords="offset points")
    ax.set(xlabel="wall time of the run (min)", ylabel="nDCG@10", title="quality against wall time, per model")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "quality_over_time.png", dpi=110)
    plt.close(fig)
    return out / "quality_over_time.png"


def plot_curves(curve: list[dict], results: list[dict], stats: dict[str, dict], async_refresh: dict | None,
                out: Path) -> list[Path]:
    """PNG plots (matplotlib, Agg): loss.png and grad_norms.png on the global step with the stages shaded,
    metrics.png per model, negatives_overlap.png per model trained on mined negatives, staleness.png (async)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, name: str) -> Path:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        return out / name

    def stage_bands(ax) -> None:
        starts = [(r["step"], r["stage"]) for i, r in enumerate(curve) if i == 0 or curve[i - 1]["stage"] != r["stage"]]
        for k, (step, stage) in enumerate(starts):
            end = starts[k + 1][0] if k + 1 < len(starts) else curve[-1]["step"]
            if k % 2:
                ax.axvspan(step, end, color="0.93", lw=0)
            ax.annotate(stage, (step, 1.0), xycoords=("data", "axes fraction"), va="top", fontsize=7)

    def stage_parts() -> list[list[dict]]:
        parts: list[list[dict]] = []
        for i, r in enumerate(curve):
            if i == 0 or curve[i - 1]["stage"] != r["stage"]:
                parts.append([])
            parts[-1].append(r)
        return parts

    paths = []
    if curve:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        stage_bands(ax)
        for part in stage_parts():  # (a line per stage: samplers compared from one warm-up are not one run)
            ax.plot([r["step"] for r in part], [r["loss"] for r in part], lw=0.8, color="C0")
        ax.set(xlabel="global step", ylabel="NLL loss", title="training loss")
        paths.append(save(fig, "loss.png"))
        fig, ax = plt.subplots(figsize=(8, 3.5))
        stage_bands(ax)
        for k, key in enumerate(("grad_norm", "grad_norm_bottom", "grad_norm_middle", "grad_norm_top")):
            for n, part in enumerate(stage_parts()) if key in curve[0] else ():
                ax.plot([r["step"] for r in part], [r.get(key, float("nan")) for r in part], lw=0.8, color=f"C{k}",
                        label=key if n == 0 else None)
        ax.set(xlabel="global step", yscale="log", title="pre-clip gradient norm (overall, per third of the layers)")
        ax.legend(fontsize=7)
        paths.append(save(fig, "grad_norms.png"))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100"):
        ax.plot([r["model"] for r in results], [r[key] for r in results], marker="o", label=key)
    ax.legend(fontsize=7), ax.set_title("metrics per model"), ax.tick_params(axis="x", rotation=20)
    paths.append(save(fig, "metrics.png"))
    if stats:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels = list(stats)
        ax.bar(labels, [100 * stats[k]["overlap"] for k in labels])
        ax.set(ylabel="% of training negatives", ylim=(0, 100),
               title="training negatives in the trained model's own top-100 negatives")
        ax.tick_params(axis="x", rotation=20)
        paths.append(save(fig, "negatives_overlap.png"))
    if async_refresh and async_refresh.get("rounds"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        rounds = [f"round {r['round']}" for r in async_refresh["rounds"]]
        ax.bar(rounds, [r["max_staleness"] for r in async_refresh["rounds"]], label="max", color="0.7")
        ax.bar(rounds, [r["mean_staleness"] for r in async_refresh["rounds"]], label="mean")
        ax.set(ylabel="trainer steps", title="staleness of the negatives in use"), ax.legend(fontsize=7)
        paths.append(save(fig, "staleness.png"))
    return paths
