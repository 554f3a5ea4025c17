"""Classic IR test collections (CISI, NPL, LISA, MED) as BEIR folders with a train/test split of their judged queries,
for the recipe search across collections (bench/recipes.py, RESULTS.md). The data itself is never part of the
project: give the folder that holds the collections' original files (public copies live in several GitHub
repositories, e.g. lorainemg/information-retrieval-system, resources/corpus/{cisi,npl,lisa}, and
lailaglez/belief-network-irs, med/ for MED's MED.ALL, MED.QRY, MED.REL) and an output folder.

    python bench/classic_collections.py --raw <folder with cisi/ npl/ lisa/ med/> --out ../collections [cisi ...]

Each judged query goes to test or train by a sha256 of (collection, query id): `--test-fraction` of them to test; the
pipeline carves its dev split from train (data.dev_fraction). Cranfield and NFCorpus are deliberately not converted:
they are kept aside to check the chosen defaults on collections nothing was chosen on.
"""

import argparse
import hashlib
import json
import re
from pathlib import Path


def tagged(path: Path) -> dict[str, dict[str, str]]:
    """SMART-style records: `.I id`, then fields `.T` (title), `.A`, `.W` (text), `.X`, `.B`, each on its own line."""
    records, current, field = {}, None, None
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.startswith(".I "):
            current = records.setdefault(line[3:].strip(), {})
            field = None
        elif re.match(r"^\.[A-Z]\s*$", line):
            field = line[1]
            current.setdefault(field, "")
        elif current is not None and field is not None:
            current[field] += " " + line.strip()
    return {k: {f: " ".join(v.split()) for f, v in r.items()} for k, r in records.items()}


def slash_blocks(path: Path) -> dict[str, str]:
    """NPL's files: an id on a line, text lines, then a line `/`."""
    out, lines = {}, []
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.strip() == "/":
            if lines:
                out[lines[0].strip()] = " ".join(" ".join(lines[1:]).split())
            lines = []
        elif line.strip():
            lines.append(line)
    return out


def cisi(raw: Path):
    docs = {k: {"title": r.get("T", ""), "text": r.get("W", "")} for k, r in tagged(raw / "CISI.ALL").items()}
    queries = {k: " ".join(filter(None, (r.get("T", ""), r.get("W", "")))) for k, r in tagged(raw / "CISI.QRY").items()}
    qrels: dict[str, dict[str, int]] = {}
    for line in (raw / "CISI.REL").read_text().splitlines():
        if line.strip():
            q, d = line.split()[:2]
            qrels.setdefault(q, {})[d] = 1
    return docs, queries, qrels


def npl(raw: Path):
    docs = {k: {"title": "", "text": v} for k, v in slash_blocks(raw / "doc-text").items()}
    qrels = {q: dict.fromkeys(v.split(), 1) for q, v in slash_blocks(raw / "rlv-ass").items()}
    return docs, slash_blocks(raw / "query-text"), qrels


def lisa(raw: Path):
    docs = {}
    for path in sorted(raw.glob("LISA[0-9]*")):
        for block in path.read_text(encoding="latin-1").split("*" * 44):
            lines = block.strip().splitlines()
            if lines and lines[0].startswith("Document"):
                title, _, text = "\n".join(lines[1:]).partition("\n\n")
                docs[lines[0].split()[1]] = {"title": " ".join(title.split()), "text": " ".join(text.split())}
    queries = {}
    for block in (raw / "LISA.QUE").read_text(encoding="latin-1").split("#"):
        if lines := block.strip().splitlines():
            queries[lines[0].strip()] = " ".join(" ".join(lines[1:]).split())
    qrels = {m.group(1): dict.fromkeys(m.group(2).split(), 1) for m in re.finditer(
        r"Query\s+(\d+)\s+\d+\s+Relevant Refs:\s+([\d\s-]+?)-1", (raw / "LISA.REL").read_text())}
    return docs, queries, qrels


def med(raw: Path):
    """Medline (Glasgow): MED.ALL and MED.QRY hold `.I`/`.W` records; MED.REL lines `query 0 document relevance`."""
    docs = {k: {"title": "", "text": r.get("W", "")} for k, r in tagged(raw / "MED.ALL").items()}
    queries = {k: r.get("W", "") for k, r in tagged(raw / "MED.QRY").items()}
    qrels: dict[str, dict[str, int]] = {}
    for line in (raw / "MED.REL").read_text().splitlines():
        if fields := line.split():
            q, d, rel = fields[0], fields[-2], int(fields[-1])
            if rel > 0:
                qrels.setdefault(q, {})[d] = rel
    return docs, queries, qrels


READERS = {"cisi": cisi, "npl": npl, "lisa": lisa, "med": med}


def write(folder: Path, name: str, docs: dict, queries: dict, qrels: dict, test_fraction: float) -> str:
    """The BEIR folder of one collection; a line saying what it holds."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": k, **d}) + "\n" for k, d in docs.items())
    judged = sorted((q for q in qrels if q in queries and qrels[q]),
                    key=lambda q: hashlib.sha256(f"{name}:{q}".encode()).hexdigest())
    n_test = round(len(judged) * test_fraction)
    splits = {"test": judged[:n_test], "train": judged[n_test:]}
    with open(folder / "queries.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in judged)
    pairs = {}
    for split, ids in splits.items():
        rows = [f"{q}\t{d}\t{s}\n" for q in ids for d, s in qrels[q].items() if d in docs]
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(rows))
        pairs[split] = len(rows)
    words = sum(len(f"{d['title']} {d['text']}".split()) for d in docs.values()) / max(1, len(docs))
    return (f"{name}: {len(docs)} documents ({words:.0f} words on average), {len(judged)} judged queries: train "
            f"{len(splits['train'])} ({pairs['train']} pairs), test {len(splits['test'])} ({pairs['test']} pairs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"of {', '.join(READERS)} (default: each --raw has a folder of)")
    parser.add_argument("--raw", type=Path, required=True, help="holds <name>/ with each collection's original files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--test-fraction", type=float, default=0.4)
    args = parser.parse_args()
    for name in args.names or [n for n in READERS if (args.raw / n).is_dir()] or list(READERS):
        if name not in READERS:
            parser.error(f"unknown collection '{name}': choose from {', '.join(READERS)}")
        print(write(args.out / name, name, *READERS[name](args.raw / name), args.test_fraction))


if __name__ == "__main__":
    main()
