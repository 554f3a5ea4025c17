"""tune.md: the recipe search's report (flows/tune.py)."""

from typing import TYPE_CHECKING

from ance_core.data.splits import fold_count
from ance_core.pipeline.report import markdown_table
from ance_core.pipeline.tune import Candidate

if TYPE_CHECKING:
    from flows.tune import Search


def report(pool: list[Candidate], state: "Search", winner: Candidate, evidence: dict) -> str:
    """tune.md: every candidate's scores by seed (warm-up rung, then the whole recipe), mean, paired difference."""
    table = evidence["table"]
    rows = []
    for c in pool:
        runs = {(t["seed"], t["full"]): t["score"] for t in state.trials if t["candidate"] == c.name}
        warm = runs.get((state.cfg.seeds[0], False))
        full = [f"{runs[(s, True)]:.4f}" if (s, True) in runs else "—" for s in state.cfg.seeds]
        row = table.get(c.name, {})
        diff = row.get("paired_diff")
        label = f"**{c.name}** (chosen)" if c == winner else c.name + " (failed)" * (c.name in state.failed)
        rows.append([label, ", ".join(c.sets()) or "—",
                     f"{warm:.4f}" if warm is not None else "—", *full,
                     f"{row['mean']:.4f}" if row else "—", f"{diff:+.4f}" if diff is not None else "—"])
    header = ["candidate", "overrides", f"warm-up only, seed {state.cfg.seeds[0]}",
              *(f"seed {s}" for s in state.cfg.seeds), "mean", "paired diff to baseline"]
    spent = sum(t["seconds"] for t in state.trials)
    pooled = (f", pooled over the {fold_count(state.base.data.dev_fraction)} dev folds: selection cv"
              if state.base.selection == "cv" else "")
    return (f"## Recipe search (dev nDCG@10 of the dense model each trial delivers{pooled})\n\n"
            f"{markdown_table(header, rows)}"
            f"\n\n**Chosen: {winner.name}** — {evidence['reason']}."
            + "".join(f" {note[0].upper()}{note[1:]}." for note in (state.cut, state.stopped, state.few) if note)
            + f"\n\n{len(state.trials)} trials ({sum(t['cached'] for t in state.trials)} cached), {spent:.0f} s"
            + (f"; the work they reused took {state.reused:.0f} s when it ran, counted in the budget"
               if state.reused >= 0.5 else "") + ".\n")
