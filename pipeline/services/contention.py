"""How many of this process's cores other processes kept busy over a stretch of time: the cause a
timing's spread is said with. A newcomer read a ViT's timing rounds of 0.14 ms and 150 ms, taken
while a test suite ran beside the build, as a fault of ours; the rounds were right, the machine
was busy.

It reads the kernel's per-CPU counters (``/proc/stat``, the CPUs this process may run on) and
takes out this process's own CPU time: no library reads both for one set of CPUs with less.
Where they cannot be read (not Linux), it says nothing rather than guess."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
PER_CPU = re.compile(r"cpu(\d+)")  # one CPU's counters (the first line sums them all)
IDLE_FIELDS = (3, 4)  # idle, iowait: of "user nice system idle iowait irq softirq steal guest guest_nice"
BUSY_FIELDS = 8  # guest and guest_nice are counted in user and nice already
SAID_FROM_CORES = 0.5  # less than this, on average, is not worth a word


def _busy_s(cpus: frozenset[int]) -> float | None:
    """The seconds ``cpus`` spent busy since boot (steal included: a VM's host taking the core)."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if (one := PER_CPU.fullmatch(name)) and int(one[1]) in cpus:
            ticks += sum(int(value) for index, value in enumerate(fields[:BUSY_FIELDS]) if index not in IDLE_FIELDS)
    return ticks / os.sysconf("SC_CLK_TCK")


MEASURED_FROM_S = 0.5  # the counters tick 100 times a second: a shorter stretch says little


def _own_s() -> float:
    """This process's CPU seconds, with those of its children it has waited for (the search's
    compile workers, and their compilers): theirs is the build's own load, not another's."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


class OthersBusy:
    """Started when made; ``cores()``: the mean number of this process's cores that other processes
    kept busy since (None where it cannot tell)."""

    def __init__(self) -> None:
        self.cpus = frozenset(os.sched_getaffinity(0))
        self.started = (time.monotonic(), _busy_s(self.cpus), _own_s())

    def measurable_at(self) -> float:
        """The time.perf_counter() from which cores() can tell (MEASURED_FROM_S after the start)."""
        # a tick past it: the two clocks are read a moment apart
        return time.perf_counter() + MEASURED_FROM_S + 0.01 - (time.monotonic() - self.started[0])

    def cores(self) -> float | None:
        wall, busy, own = time.monotonic(), _busy_s(self.cpus), _own_s()
        wall_0, busy_0, own_0 = self.started
        if busy is None or busy_0 is None or wall - wall_0 < MEASURED_FROM_S:
            return None
        return max(0.0, (busy - busy_0) - (own - own_0)) / (wall - wall_0)


def said(others_cores: float | None, threads: int, spread: str) -> str:
    """``"; other processes kept 1.5 of the 2 cores busy meanwhile, …"``, and what that does to a
    model on ``threads`` threads; "" on a quiet machine (or where it could not tell). "Other
    processes" alone read as the cause of calls 2000x slower, which no 2 busy cores make: the
    model's own threads wait at each operator for the one whose core another process holds.
    ``spread``: the rounds' slowest over their fastest, as the line says it ("1.18x")."""
    if others_cores is None or others_cores < SAID_FROM_CORES:
        return ""
    busy = _kept(others_cores, "meanwhile")
    if threads < 2:
        return busy + ", so the rounds spread (a quieter machine times steadily)"
    return (
        f"{busy}, and the model's {threads} threads wait for each other at every operator while one is off its "
        f"core, so rounds took up to {spread} as long as the fastest (a quieter machine times steadily, or "
        "`OMP_NUM_THREADS=1` for the build, which times one thread)"
    )


def steady(others_cores: float | None, threads: int) -> str:
    """What a load that lasted through every round did: the rounds agree, so the candidates'
    comparison holds, but each figure is this busy machine's, not its quiet speed; "" on a quiet
    machine. Under two busy loops a newcomer's rounds were a steady 180 ms, 0.22 ms on the quiet
    machine, and nothing said why."""
    if others_cores is None or others_cores < SAID_FROM_CORES:
        return ""
    waits = (
        f", by far where the model's {threads} threads wait for each other at every operator while one is off its "
        "core (`OMP_NUM_THREADS=1` for the build times one thread)"
        if threads > 1
        else ""
    )
    return (
        f"{_kept(others_cores, 'throughout')}: the rounds agree, so the comparison holds, but each figure may be "
        f"slower than on a quiet machine{waits}"
    )


def lone(others_cores: float | None, threads: int) -> str:
    """What a load did to a lone candidate's one round (nothing to compare it with): its figure is this
    busy machine's; "" on a quiet machine. A newcomer's BERT read "168 ms a call" for a wheel that runs
    in 0.107 ms quiet, and its report kept that figure with no word of the load."""
    if others_cores is None or others_cores < SAID_FROM_CORES:
        return ""
    waits = (
        f" (the model's {threads} threads wait for each other at every operator while one is off its core)"
        if threads > 1
        else ""
    )
    return f"{_kept(others_cores, 'meanwhile')}, so it may be far slower than on a quiet machine{waits}"


def _kept(others_cores: float, when: str) -> str:
    return f"; other processes kept {others_cores:.1f} of the {len(os.sched_getaffinity(0))} cores busy {when}"
