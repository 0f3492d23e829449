"""The measured timeline of a pipeline's runs: seconds per kind and per action, and the bubble they give.

Each run of a pipeline stage (`parallel.pipeline.stage.Pipeline`) records seconds per kind
(`TIMELINE_KEYS`, plus ``tensor`` in hybrid runs) and per schedule action; a
`Timeline` keeps a point's runs and reduces them across the stages (collective).
"""
import math
from dataclasses import dataclass, field

import numpy as np

from parallel.pipeline.schedule import bubble_fraction, idle_fraction, replay

TIMELINE_KEYS = ("compute", "send", "wait", "allreduce", "step")


@dataclass
class Timeline:
    """Seconds per kind (`TIMELINE_KEYS`, plus ``tensor`` for hybrid runs) of each of a point's runs."""

    runs: list = field(default_factory=list)

    def add(self, timeline, **extra):
        self.runs.append(dict(timeline, **extra))

    @property
    def steps(self):
        return len(self.runs)

    def per_step(self, kind):
        return sum(run.get(kind, 0.0) for run in self.runs) / self.steps if self.steps else math.nan

    def largest(self, kind):
        return max(run[kind] for run in self.runs) if self.steps else math.nan

    def idle_share(self, comm, share=idle_fraction, busy=lambda run: run["compute"]):
        """Median over the runs of ``share`` (`idle_fraction` or `bubble_fraction`) across the ranks of
        ``comm``, with ``busy(run)`` seconds as compute (collective: one allgather)."""
        every = comm.allgather([(busy(run), run["step"]) for run in self.runs])
        shares = [share([ranks[i][0] for ranks in every], [ranks[i][1] for ranks in every])
                  for i in range(self.steps)]
        return float(np.median(shares)) if shares else math.nan

    def replayed_bubble(self, comm, schedule):
        """Median over the runs of the bubble of `replay`: every stage's measured action seconds
        (``actions`` of each run) and free messages; ``schedule`` is this rank's, or a run's own
        ``schedule`` where it has one (PipeDream's steps differ) (collective)."""
        every = comm.allgather([(run.get("schedule", schedule), run["actions"]) for run in self.runs])
        shares = []
        for index in range(self.steps):
            schedules = [runs[index][0] for runs in every]
            seconds = [runs[index][1] for runs in every]
            shares.append(bubble_fraction([sum(stage) for stage in seconds], replay(schedules, seconds)))
        return float(np.median(shares)) if shares else math.nan
