"""Single-purpose flows behind the deployments `bm25-warmup` and `refresh-negatives` (the `evaluate` deployment's
flow is in flows/evaluate.py), and `encode` (a corpus encoded with a checkpoint; bench/scale.py,
tests/tasks/test_execution.py). Each reuses the stage tasks, so their outputs are shared with the full pipeline."""

from typing import Annotated

from prefect import flow
from pydantic import Field

from ance_core.artifacts import write_json
from ance_core.data.config import DataConfig
from ance_core.errors import AnceError
from ance_core.modeling.model import checkpoint_ref
from ance_core.negatives.config import MiningConfig
from ance_core.pipeline.config import PipelineConfig, WorkDir
from ance_core.retrieval.config import BM25Config, EncodeConfig, ExecutionConfig, IndexConfig
from ance_core.run_records import live_run
from ance_core.training.config import TrainConfig
from flows.names import dataset_run_name
from tasks.common import run_task
from tasks.data import prepare_data
from tasks.encode import encode_corpus
from tasks.refresh import refresh_negatives


@flow(name="bm25-warmup", flow_run_name=dataset_run_name, log_prints=True)
def bm25_warmup(config: PipelineConfig = PipelineConfig()) -> dict:
    """Train the starting model on BM25 negatives (the paper's warm-up; `bm25_negatives.sampler` picks others) and
    evaluate it: the pipeline with `warmup_only`, so the warm-up is planned (its learning-rate schedule, dev checks, a
    margin's scorer) and keyed as in the whole run of this config, which then reuses it. Returns the warm-up's
    checkpoint and the run's results (the zero-shot model and the warm-up, each with its hybrid row).

    Args:
        config: The pipeline config whose warm-up this is (the sections of `ance run --config`).
    """
    from flows.ance_pipeline import train_and_evaluate

    if config.start_checkpoint:  # (refused with warmup_only, which the user's form does not have: said here)
        raise AnceError(f"bm25-warmup trains the warm-up from config.model.name, and config.start_checkpoint is set "
                        f"({config.start_checkpoint}): a trained model has no warm-up to train; unset it")
    warmup = PipelineConfig.model_validate(config.model_dump(mode="json") | {"warmup_only": True})
    with live_run(config.work_dir, "bm25-warmup"):  # the stages it uses, which garbage collection leaves
        result = train_and_evaluate(warmup, experiment="bm25-warmup")  # (its MLflow runs and artifact keys)
    print(f"warm-up checkpoint {result['last_checkpoint']}")
    return {"checkpoint": result["last_checkpoint"], "selected": result["selected"], "results": result["results"],
            "mlflow_run_id": result["mlflow_run_id"]}


@flow(name="refresh-negatives", flow_run_name=dataset_run_name, log_prints=True)
def refresh_negatives_flow(checkpoint: str, data: DataConfig = DataConfig(), encode: EncodeConfig = EncodeConfig(),
                           index: IndexConfig = IndexConfig(), mining: MiningConfig = MiningConfig(),
                           round_number: Annotated[int, Field(ge=1)] = 1, work_dir: WorkDir = "work",
                           execution: ExecutionConfig = ExecutionConfig(),
                           result_file: str | None = None, train: TrainConfig | None = None,
                           bm25: BM25Config = BM25Config()) -> dict[str, str]:
    """The inferencer alone: encode the corpus with a checkpoint, build the index, mine the next round's negatives
    (with `mining.sampler`; BM25 samplers mine from a BM25 run of `bm25` instead). An asynchronous trainer starts it
    with `result_file`, where the folders it built are written (tasks/inferencer.py). `train`: the config of the stage
    that will train on them (a draw of negatives per epoch).

    Args:
        checkpoint: The trained checkpoint's folder (a path the worker can read).
        data: The dataset (a folder under the data home, or a path) and its splits.
        encode: Corpus encoding.
        index: The faiss index mined from.
        mining: The sampler of the negatives and its options.
        round_number: The ANCE round the negatives are for (seeds the sampler's draw).
        work_dir: Where stage outputs are kept (<work_dir>/<stage>/<digest>/).
        execution: Where mapped tasks (encoding shards) run.
        result_file: Set by an asynchronous trainer: where the folders built are written.
        train: The training stage that will use the negatives (a draw per epoch); unset: one draw.
        bm25: BM25's settings, for BM25 samplers.
    """
    model = checkpoint_ref(checkpoint)  # (a mistyped path: said before the data stage reads the corpus)
    with live_run(work_dir, "refresh-negatives", keep=result_file is None):  # a trainer's refresh: part of its run
        tables = run_task(prepare_data, data, work_dir)
        refs = refresh_negatives(model, tables, data.train_split, encode, index, mining,
                                 round_number, work_dir, bm25, execution=execution, train=train)
        folders = {name: r.path for name, r in refs.items()}
        if result_file:  # (while recorded: the trainer records them once it reads this)
            write_json(result_file, folders)
    print("negatives: " + refs["mine"].path)
    return folders


@flow(name="encode", flow_run_name=dataset_run_name, log_prints=True)
def encode_flow(checkpoint: str, data: DataConfig = DataConfig(), encode: EncodeConfig = EncodeConfig(),
                work_dir: WorkDir = "work", execution: ExecutionConfig = ExecutionConfig()) -> dict:
    """The corpus encoded with a checkpoint: a task per shard of `encode.shard_size` documents on the `execution`
    runner, assembled into one encode folder (the one the pipeline's stages use).

    Args:
        checkpoint: The checkpoint's folder (a path the worker can read).
        data: The dataset and its splits.
        encode: Corpus encoding (shard_size: documents per task).
        work_dir: Where stage outputs are kept.
        execution: Where the shards' tasks run (the flow's process, or Ray).
    """
    model = checkpoint_ref(checkpoint)  # (a mistyped path: said before the data stage reads the corpus)
    with live_run(work_dir, "encode"):  # the stages it uses, which garbage collection leaves
        tables = run_task(prepare_data, data, work_dir)
        ref = run_task(encode_corpus, model, tables, encode, work_dir, execution)
    print(f"corpus encoding: {ref.path}")
    return {"encode": ref.path, "seconds": ref.seconds, "cached": ref.cached}
