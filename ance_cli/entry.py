"""The `ance` console script (and `python -m ance_cli`): the malloc first (ance_core/allocator.py: the command starts
itself again under mimalloc), before the command's modules (typer, Prefect's, torch's) are imported: the first start
imports nothing it would import again."""


def main() -> None:  # pragma: no cover
    from ance_core.allocator import preload_and_reexec

    preload_and_reexec()
    from ance_cli.main import main as run_command

    run_command()
