"""The ANCE pipeline (paper Fig. 2, run synchronously): BM25 warm-up, then K rounds of
encode -> index -> mine -> train, with every checkpoint evaluated from the same corpus encoding it mines from."""

from prefect import flow

from ance_core.config import PipelineConfig
from ance_core.report import StageTiming
from tasks.bm25 import bm25_run
from tasks.data import prepare_data
from tasks.encode import encode_corpus
from tasks.evaluate import evaluate
from tasks.index import build_index
from tasks.mine import mine_negatives
from tasks.model import init_checkpoint
from tasks.report import report
from tasks.retrieve import dense_run
from tasks.train import train_round


@flow(name="ance-train", log_prints=True)
def ance_pipeline(config: PipelineConfig = PipelineConfig()) -> dict:
    c, wd = config, config.work_dir
    train_split, eval_split = c.data.train_split, c.data.eval_split
    timings: list[StageTiming] = []
    evaluations = []

    def stage(label: str, name: str, ref):
        timings.append(StageTiming(label, name, ref))
        return ref

    def encode_and_evaluate(label: str, checkpoint):
        """Encode the corpus once per checkpoint: the index serves its evaluation and the next round's mining."""
        emb = stage(label, "encode", encode_corpus(checkpoint, data, c.encode, wd))
        index = stage(label, "index", build_index(emb, wd))
        run = stage(label, "retrieve", dense_run(checkpoint, index, data, eval_split, c.eval.top_k, c.encode,
                                                 c.index, wd))
        evaluations.append((label, stage(label, "evaluate", evaluate(run, data, eval_split, wd))))
        return index

    data = stage("data", "prepare", prepare_data(c.data, wd))
    bm25_eval = stage("BM25", "bm25", bm25_run(data, c.bm25, eval_split, c.bm25.top_k, wd))
    evaluations.append(("BM25", stage("BM25", "evaluate", evaluate(bm25_eval, data, eval_split, wd))))

    checkpoint = stage("zero-shot", "init", init_checkpoint(c.model, wd))
    encode_and_evaluate("zero-shot", checkpoint)

    bm25_train = stage("warmup", "bm25", bm25_run(data, c.bm25, train_split, c.bm25_negatives.top_k, wd))
    negatives = stage("warmup", "mine", mine_negatives(bm25_train, data, train_split, c.bm25_negatives, 0, wd))
    checkpoint = stage("warmup", "train", train_round(checkpoint, negatives, data, train_split, c.warmup, wd))
    label = "warmup"

    for k in range(1, c.rounds + 1):
        index = encode_and_evaluate(label, checkpoint)
        label = f"ANCE round {k}"
        run = stage(label, "retrieve", dense_run(checkpoint, index, data, train_split, c.mining.top_k, c.encode,
                                                 c.index, wd))
        negatives = stage(label, "mine", mine_negatives(run, data, train_split, c.mining, k, wd))
        checkpoint = stage(label, "train", train_round(checkpoint, negatives, data, train_split, c.ance, wd))
    encode_and_evaluate(label, checkpoint)

    result = report(evaluations, timings, eval_split, c.data.dataset, wd)
    print(result["markdown"])
    return result | {"final_checkpoint": checkpoint.path}
