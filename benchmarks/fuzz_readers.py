"""A long, coverage-guided fuzzing campaign of adsim's image readers (atheris; docs/fuzzing.md).

    pip install -e '.[fuzz]'
    python benchmarks/fuzz_readers.py --minutes 30 --crashes fuzz-crashes --stats fuzz-stats.json

The readers (pydicom, nibabel, PIL and ``adsim.data.medical``) are imported under atheris'
instrumentation, so libFuzzer sees which branches each input reaches and keeps the inputs that reach
new ones; the seeds, the mutation-free oracle (``check``) and the campaign loop are the suite's
(``tests/adsim/_fuzz_readers.py``). An input that breaks the contract is saved in ``--crashes`` and
ends the run (libFuzzer's default); reduce it and add it to ``tests/adsim/data/fuzz_regressions``.
"""
import argparse
import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "adsim")]

with atheris.instrument_imports(include=["pydicom", "nibabel", "PIL", "adsim.data.medical"]):
    import nibabel  # noqa: F401
    import PIL.Image  # noqa: F401
    import pydicom  # noqa: F401
    import pydicom.pixels  # noqa: F401

    import adsim.data.medical  # noqa: F401

import _fuzz_readers  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--seconds", type=float, default=10.0,
                   help="time limit per input, a finding above it (instrumented code runs several times slower)")
    p.add_argument("--crashes", default="fuzz-crashes", help="folder for the inputs that broke the contract")
    p.add_argument("--stats", default="fuzz-stats.json", help="counts and timings, rewritten as it runs")
    args = p.parse_args()
    _fuzz_readers.campaign(args.minutes, args.seconds, Path(args.crashes), Path(args.stats), atheris)


if __name__ == "__main__":
    main()
