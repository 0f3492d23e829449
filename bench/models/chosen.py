"""The cost of a training strategy's collective run by a hand-written algorithm (the strategies' settings
``TP_COLLECTIVES``, ``MOE_ALLTOALL``): priced from the algorithm's own
`parallel.collectives.schedule.Schedule` by `bench.models.collective_terms.schedule` on the busiest of a few
sampled ranks (rank 0, 1, the middle and the last), plus the Python path of one call (``call_s``),
as `bench.models.collective` prices the collective suites' hand-written variants."""
from bench.models import collective_terms


def hand_written(calib, build, ranks, items, itemsize, counts=None):
    """Modelled seconds of one call of the schedule builder ``build`` (``(rank, p, n, itemsize, in_place[,
    counts]) -> Schedule``) out of place on ``ranks`` ranks, for ``items`` items (blocks ``counts``)."""
    given = () if counts is None else (counts,)
    sampled = sorted({0, 1, ranks // 2, ranks - 1} & set(range(ranks)))
    return calib["call_s"] + max(collective_terms.schedule(calib, build(rank, ranks, items, itemsize, False, *given), itemsize)
                                 for rank in sampled)
