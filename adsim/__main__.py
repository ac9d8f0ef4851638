"""``python -m adsim``: see :mod:`adsim.cli`."""
import sys

from adsim.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
