"""``python _killed_child.py ARGS``: ``python -m adsim ARGS`` in one torch thread, killed by SIGKILL at a
chosen moment when the environment asks for one.

``ADSIM_TEST_KILL_BEFORE_REPLACE=NAME:N``: the process kills itself inside the N-th atomic write of the
file NAME (e.g. ``checkpoint_last.pt``) of this run -- its temporary file complete and fsynced, not yet
moved over NAME: the moment a non-atomic writer would leave half a file. NAME may be a pattern
(``fnmatch``) of the file's name or of ``FOLDER/NAME`` (``cells/*.json``: the N-th cell file written). Timed kills at random moments
come from the parent (``os.kill`` after a delay)."""
import fnmatch
import os
import signal
import sys

import torch

torch.set_num_threads(1)  # the parent's reference run uses the same: bitwise comparable

spec = os.environ.get("ADSIM_TEST_KILL_BEFORE_REPLACE")
if spec:
    name, nth = spec.rsplit(":", 1)
    seen = [0]
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        folder, base = os.path.split(os.fspath(dst))
        if fnmatch.fnmatchcase(base, name) or fnmatch.fnmatchcase(f"{os.path.basename(folder)}/{base}", name):
            seen[0] += 1
            if seen[0] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst, *args, **kwargs)

    os.replace = replace

from adsim.cli.main import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
