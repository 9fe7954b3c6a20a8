"""The installed wheel under load: descriptors that do not run out."""

from __future__ import annotations

import subprocess

LOADS_AND_CLOSES = """
import gc, os, model_tiny as m

def open_fds():
    return len(os.listdir("/proc/self/fd"))

first, numpy_first = m.load(), m.load_numpy()  # one library held for the process, whatever the count
x, t = m.example_inputs()
expected = first(x, t)
before = open_fds()
for _ in range(150):
    model = m.load()
    del model
    model = m.load_numpy()
    del model
gc.collect()
after = open_fds()
again = m.load()(x, t)  # a library loaded after 300 others is still this model's
print(before, after, all(bool((a == b).all()) for a, b in zip(again, expected)))
"""


def test_loads_and_closes_keep_the_descriptor_count_flat(installed):
    """Every load() and load_numpy() kept a descriptor open for the life of the process: 5,000
    loads left 5,006 open, and with `ulimit -n 1024` load number 1,018 failed."""
    ran = subprocess.run([str(installed), "-c", LOADS_AND_CLOSES], capture_output=True, text=True, cwd="/", timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    before, after, same = ran.stdout.split()[-3:]
    assert int(after) - int(before) <= 2, (before, after)
    assert same == "True"
