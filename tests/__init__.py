"""The suite's process-wide settings, made before any test module (or conftest.py) imports torch."""

import os

# Idle OpenMP threads wait passively (sleep) instead of spinning. make test runs two test
# processes on two cores, and every build, eager run and verification they start uses torch's
# OpenMP threads: spinning ones took the core the other worker's work needed (`modelwheel doctor
# unet` beside another worker: 29.5 CPU-s spinning, 12.6 passive). Only how an idle thread waits
# changes, not what any thread computes; subprocesses inherit it. Set it in the environment to
# test another policy.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
