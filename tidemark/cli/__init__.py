"""The application on top of every layer: the `tidemark` command, the demo, the sample workload
and the Dagster UI launcher. Nothing below this package imports it."""

from tidemark.cli.commands import main

__all__ = ["main"]
