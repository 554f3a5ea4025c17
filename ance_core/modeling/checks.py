"""What a model asks of this machine and of the config, checked before any work: its token positions, whether the
Hugging Face hub can be reached to fetch it, and whether a local model folder or checkpoint loads at all."""

import functools
from pathlib import Path

from transformers import AutoConfig

from ance_core.errors import AnceError
from ance_core.modeling.model import META_FILE, load_checkpoint, load_pretrained, read_meta, resolve_model_name


def max_positions(source: str | Path) -> int | None:
    """The most tokens a model (a name, a Hugging Face id or a folder, a checkpoint included) takes: its position
    embeddings (RoBERTa's count 2 it does not use); None when its config does not say. A model whose config cannot be
    read (an id not downloaded, offline; a folder that is not a model) is an AnceError: before any work."""
    name = resolve_model_name(str(source))
    try:
        config = AutoConfig.from_pretrained(str(Path(name).expanduser()) if name.startswith("~") else name,
                                            local_files_only=True)  # a folder, or the Hugging Face cache
    except (OSError, ValueError) as e:
        if Path(name).expanduser().is_file():
            raise AnceError(f"cannot load model '{source}': a file, not a model folder (give the folder that holds its "
                            "config.json, or a Hugging Face id)") from None
        if Path(name).expanduser().exists():
            raise AnceError(f"cannot load model '{source}': {' '.join(str(e).split())}") from None
        if name.startswith(("/", "./", "../", "~")):
            raise AnceError(f"cannot load model '{source}': no such folder") from None
        if not hub_reachable():
            raise AnceError(f"cannot load model '{source}': not a local folder nor in the Hugging Face cache, and "
                            f"{hub_endpoint()} cannot be reached from here (offline?); download it where there is a "
                            "network and give its folder as model.name") from None
        try:
            config = AutoConfig.from_pretrained(name)
        except (OSError, ValueError) as e:
            raise AnceError(f"cannot load model '{source}': {' '.join(str(e).split())}") from None
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    return positions - 2 if config.model_type in ("roberta", "xlm-roberta", "camembert") else positions


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within `timeout` seconds (False with HF_HUB_OFFLINE set).
    Asked before a model is fetched from it: offline, huggingface_hub retries each request for ~25 s with a warning
    per try before it fails."""
    import socket
    import urllib.request
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(hub_endpoint())
    if url.hostname is None or (urllib.request.getproxies() and not urllib.request.proxy_bypass(url.hostname)):
        return True  # through a proxy (which the hub's client uses, this probe would not): let the hub's client try
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def check_lengths(source: str | Path, lengths: dict[str, int | None]) -> None:
    """Refuse token lengths (`field name -> value`) above what the model takes, naming the field and the maximum: a
    longer input would fail at the first long document, deep in a stage (a tensor-size error, retried)."""
    most = max_positions(source)
    over = {name: n for name, n in lengths.items() if n is not None and most is not None and n > most}
    if over:
        fields = ", ".join(f"{name} {n}" for name, n in over.items())
        raise AnceError(f"{fields}: above the {most} positions of model '{source}'; set at most {most}")


def check_loadable(source: str | Path) -> None:
    """Load a local model folder (or a checkpoint) once, before any work: weights that do not fit its config.json,
    weights or tokenizer files missing are one line here, not a failure after the data and BM25 stages (or a starting
    checkpoint cached with a tokenizer of a few special tokens). A Hugging Face id is left to the model stage, which
    fetches it. Once per folder content in a process (a search's trials and folds check the same model)."""
    folder = Path(source)
    if not (folder / META_FILE).is_file():  # (a model: 'minilm' is the packaged one's folder)
        folder = Path(resolve_model_name(str(source))).expanduser()
    if folder.is_dir():
        files = sorted(p for p in folder.iterdir() if p.is_file())
        _loadable(str(folder.resolve()), tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files),
                  str(source))


@functools.lru_cache(maxsize=16)
def _loadable(folder: str, files: tuple[tuple[str, int, int], ...], source: str) -> None:
    if (Path(folder) / META_FILE).is_file():
        load_checkpoint(folder)
        return
    try:
        load_pretrained(folder, source)  # (as the model stage loads it)
    except ValueError as e:
        raise AnceError(f"cannot load model '{source}': {' '.join(str(e).split())[:300]}") from None


def longer_than_passages(checkpoint: str | Path, texts: list[str]) -> int:
    """How many of `texts` (documents' passage texts) are longer than the checkpoint's passage tokens
    (`passage_max_length`, special tokens and its passage prefix included): FirstP encodes only their start."""
    from transformers import AutoTokenizer

    meta = read_meta(checkpoint)
    if not texts or meta.passage_max_length is None:
        return 0
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prefixed = [meta.passage_prefix + text for text in texts]
    lengths = tokenizer(prefixed, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    return sum(len(ids) > meta.passage_max_length for ids in lengths)
