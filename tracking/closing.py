"""The closing lines of a run (printed by the flow and the `ance` command, and put in the flow's Prefect artifact):
its warnings, its result, where its MLflow run is, the registry's decision, and anything tracking did not deliver.
"""

from collections.abc import Iterable


def closing_lines(summary: dict, selected: str | None = None, warnings: Iterable[str] = (),
                  on_dev: bool = True, best: str | None = None, selection: str | None = None) -> list[str]:
    """What the flow prints (and puts in its Prefect artifact) when it ends: its warnings, its result (`best`: the
    best on the run's dev split, when the selection rule chose another model; `selection`: the rule), and
    tracking."""
    lines = [f"WARNING: {w}" for w in warnings]
    if selected is not None and not on_dev:
        lines.append(f"Result: {selected} (the last model: there is no dev split to choose on)")
    elif selected is not None and selection == "cv":
        alone = f"; on this run's dev split alone, {best}" if best not in (None, selected) else ""
        lines.append(f"Result: {selected} (the best dev nDCG@10 of the run's models pooled over its dev folds: "
                     f"selection cv{alone})")
    elif selected is not None and best not in (None, selected):
        lines.append(f"Result: {selected} (simpler than {best}, the best dev nDCG@10 of the run's models, and within "
                     "one standard error of it: selection one-se)")
    elif selected is not None:
        lines.append(f"Result: {selected} (the best dev nDCG@10 of the run's models, the starting one included)")
    where = summary["run_url"] or f"{summary['tracking_uri']} " + (
        f"(run {summary['run_id']})" if summary["run_id"] else "(none: the server could not be reached to create it)")
    lines += [f"MLflow: parent run {where}" + (f" (final logging took {summary['final_logging_s']} s)"
                                               if "final_logging_s" in summary else "")]
    for c in (summary.get("champion"), summary.get("compression", summary).get("registered")):
        if c and c.get("shared_with"):
            lines.append(f"WARNING: MLflow's registered model {c['name']} also holds the models of "
                         f"{c['shared_with']}, another collection in a folder of the same name: their versions and "
                         "champion are mixed; give this collection a name of its own (--set data.name=...)")
    if (c := summary.get("champion")) and "promoted" in c:
        lines.append(f"MLflow: no champion ({c['reason']})" if c["champion_version"] is None else
                     f"MLflow: champion is version {c['champion_version']} "
                     f"({'promoted now' if c['promoted'] else 'kept'}: {c['reason']})")
    elif c and c.get("versions"):
        lines.append(f"MLflow: registered versions {', '.join(map(str, c['versions']))}; the champion alias did not "
                     "move (only a pipeline run's result, chosen on its dev split, can take it)")
    if versions := summary.get("compression", summary).get("registered", {}).get("versions"):
        lines.append(f"MLflow: ConAE compressed models registered as versions {', '.join(map(str, versions))}")
    if summary["delivered_late"]:
        lines.append(f"MLflow: {summary['delivered_late']} metric points were delivered late, after the tracking "
                     f"server came back")
    if summary["undelivered_calls"]:
        what = ", ".join(f"{n} {call}" for call, n in summary["undelivered"].items())
        lines.append(f"MLflow: NOT delivered: {what} calls; kept in {summary['kept_in']} (one JSON line per call; "
                     f"the metrics are also in each training stage's train_log.jsonl)")
        lines.append("MLflow: to deliver everything once the tracking server is back, run the same pipeline again: "
                     "its stages are cached, and the new run logs all of them")
    return lines
