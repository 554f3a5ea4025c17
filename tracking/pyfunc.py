"""A checkpoint as an MLflow model: the `python_function` flavor, loaded by this module (`loader_module`, no pickle).

Every checkpoint the pipeline logs (`tracking.uploads.log_checkpoint`) carries these files beside its model files,
so each registered version of `ance-<dataset>` is an MLflow model that encodes text:

    model = mlflow.pyfunc.load_model("models:/ance-scifact@champion")
    model.predict(["what causes fever?"], params={"kind": "query"})     # (n, dim) float32; kind passage by default
    model.predict(["what causes fever?"], params={"kind": "search", "k": 10})  # hits, when the version can search

    mlflow models serve -m models:/ance-scifact@champion --env-manager local -h 127.0.0.1 -p 5001
    curl -d '{"inputs": ["what causes fever?"], "params": {"kind": "query"}}' \\
         -H 'Content-Type: application/json' 127.0.0.1:5001/invocations        # {"predictions": [[...]]}

The files (`mlflow_model_files`): MLmodel (flavor, signature: a float32 tensor (-1, dim) out, the parameters `kind`,
and `k` and `mode` of a search; no input schema: see `mlflow_model_files`), the input example, and the environment
(requirements.txt, python_env.yaml, conda.yaml: this project's runtime packages at the versions that logged the
model). The loader imports this project, so the serving environment is one where it is installed (`--env-manager
local` from its virtual environment).
"""

from pathlib import Path
from typing import Any

import numpy as np

from ance_core.artifacts import atomic_folder
from ance_core.errors import AnceError
from ance_core.export.encoder import KINDS, Encoder
from ance_core.export.onnx import served_file
from ance_core.modeling.model import SERVING_FILES, checkpoint_digest

EXAMPLE = ["what is a dense retriever?", "hard negatives are mined from the index"]
SIGNATURE = "s4"  # the files' version (s2: search parameters k and mode; s3: installable requirements; s4: no input
# schema)
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pandas", "pyarrow", "pydantic",
                "filelock", "tqdm", "mlflow", "bm25s", "PyStemmer", "faiss-cpu", "ir-measures")  # what loading,
# encoding and a search import (this project's own package comes on top; a retrieval package's BM25 index is in
# bm25s's format)
ONNX_REQUIREMENTS = ("onnx", "onnxruntime")  # an ONNX export folder's model on top


class EmbeddingModel:
    """What `_load_pyfunc` returns: pyfunc's predict for a checkpoint. `kind` query or passage: the embeddings;
    `kind` search, on a version that carries a retrieval package (the run's result was a hybrid row:
    ance_core/export/hybrid.py): the top `k` hits of each text by `mode` (hybrid: the run's fusion of its dense ranking
    with BM25's; dense; bm25), one row per hit (query: the text's position, rank, doc_id, score). (The signature
    declares the embeddings' tensor, which a search does not return: a signature has one output; MLflow checks inputs
    and parameters, not outputs. `k` is an integer.)"""

    def __init__(self, checkpoint: str | Path):
        from ance_core.export.hybrid import RETRIEVAL, HybridSearch, package_refusal

        self.checkpoint = Path(checkpoint)
        self.encoder = Encoder(checkpoint)
        refused = package_refusal(self.encoder)
        why = f"{refused} is served without one" if refused else \
            "only a version whose run's result was a hybrid row can search"
        self.searcher, self.cannot_search = None, (f"this version has no retrieval package ({RETRIEVAL}/): {why}; kind "
                                                   "query or passage encodes")
        if (self.checkpoint / RETRIEVAL).is_dir():  # loaded now, not at the first search: `mlflow models serve`
            # loads the model from a download folder in /tmp, which a cleaner may empty before a long-lived server's
            # first search (the embeddings and the BM25 index are memory-mapped: their files stay readable)
            try:
                self.searcher = HybridSearch(self.checkpoint, self.encoder)
            except Exception as e:  # (a damaged package: the model still encodes; a search says why it cannot)
                said = str(e) if isinstance(e, AnceError) else f"a damaged retrieval package ({type(e).__name__}: {e})"
                self.cannot_search = said.replace(str(self.checkpoint), "this version")

    def predict(self, model_input: Any, params: dict[str, Any] | None = None):
        from mlflow.exceptions import MlflowException

        params = params or {}
        kind = params.get("kind", "passage")
        try:
            if kind == "search":
                if self.searcher is None:
                    raise AnceError(self.cannot_search)
                return self.searcher.search(_texts(model_input), _hits(params.get("k")), params.get("mode", "hybrid"))
            if kind not in KINDS:
                raise AnceError(f"kind {kind!r}: use one of {', '.join(KINDS)}, or search")
            return self.encoder.encode(_texts(model_input), kind=kind)
        except AnceError as e:  # the scoring server answers an MlflowException with 400 and its message
            raise MlflowException.invalid_parameter_value(str(e)) from None


def _hits(k: Any) -> int:
    """The `k` of a search request: 10 when not given (MLflow passes a null through)."""
    if k is None:
        return 10
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        return int(k)
    raise AnceError(f"k {k!r}: give the number of hits as a whole number")


def _texts(model_input: Any) -> list[str]:
    """The texts of a request: a list of strings, a one-column DataFrame, a Series or array, or one string."""
    import pandas as pd

    if isinstance(model_input, pd.DataFrame):
        if model_input.shape[1] != 1:
            raise AnceError(f"the input has {model_input.shape[1]} columns ({', '.join(map(str, model_input))}); "
                            "send one column of texts")
        model_input = model_input.iloc[:, 0]
    if isinstance(model_input, (pd.Series, np.ndarray)):
        model_input = model_input.tolist()  # (a 0-d array, `"inputs": "one text"` served, gives its string)
    if isinstance(model_input, str):
        return [model_input]
    if not isinstance(model_input, list):
        raise AnceError(f"the input is a {type(model_input).__name__}; send a list of texts")
    return model_input


def _load_pyfunc(path: str) -> EmbeddingModel:
    """MLflow's entry point (the flavor's `loader_module`): `path` is the model folder, the checkpoint itself."""
    return EmbeddingModel(path)


def mlflow_model_files(checkpoint: str | Path, models_dir: str | Path) -> list[Path]:
    """Write the MLflow model description of `checkpoint` (once per checkpoint content, under
    <models_dir>/<checkpoint digest>-<signature version>/) and return its files, to be logged beside the checkpoint's
    model files."""
    from tracking.client import configure_mlflow

    configure_mlflow()
    import mlflow
    from mlflow.models import ModelSignature
    from mlflow.types import ParamSchema, ParamSpec, Schema, TensorSpec

    onnx = served_file(checkpoint) is not None  # an ONNX export folder: served by onnxruntime
    folder = Path(models_dir) / f"{checkpoint_digest(checkpoint)}-{SIGNATURE}{'-onnx' if onnx else ''}"
    if not (folder / "MLmodel").is_file():
        dim = Encoder(checkpoint).dim
        signature = ModelSignature(
            # no input schema: given a string column, MLflow's schema step turned what a REST request sent into
            # strings before the model saw it (`["a", null]` encoded as "a" and "None", `[["a", "b"]]` as "a", a
            # (query_id, text) frame as its ids: 200 and wrong embeddings); without one the model's own checks
            # (`_texts`, the Encoder's) see the request as sent and answer 400 naming the text
            inputs=None,
            outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, dim))]),
            params=ParamSchema([ParamSpec("kind", "string", "passage"), ParamSpec("k", "long", 10),
                                ParamSpec("mode", "string", "hybrid")]),
        )
        with atomic_folder(folder) as tmp:  # two runs logging the same checkpoint each write a whole folder
            mlflow.pyfunc.save_model(tmp, loader_module=__name__, signature=signature,
                                     input_example=(EXAMPLE, {"kind": "query"}),
                                     pip_requirements=_requirements(ONNX_REQUIREMENTS if onnx else ()))
            unexpected = sorted(p.name for p in tmp.iterdir() if p.name not in SERVING_FILES)
            if unexpected:  # a newer MLflow writing more files: they must not be taken for model files
                raise AnceError(f"MLflow {mlflow.__version__} wrote {', '.join(unexpected)} to a model folder; add "
                                "them to ance_core.modeling.model.SERVING_FILES")
    return sorted(folder.iterdir())


def _requirements(extra: tuple[str, ...] = ()) -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in REQUIREMENTS + extra:
        try:
            out.append(f"{name}=={version(name).split('+')[0]}")  # (torch's "+cpu" build label is on no index)
        except PackageNotFoundError:
            out.append(name)
    return out

