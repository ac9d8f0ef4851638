"""The command line, ``python -m adsim``: argument parsing here, heavy libraries only inside a command."""

__all__ = ["main"]

from adsim.cli.main import main as main
