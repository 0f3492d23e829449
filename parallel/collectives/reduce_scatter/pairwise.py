"""Reduce-scatter by pairwise exchange (MPICH's ``reduce_scatter_intra_pairwise``), for any rank count.

At step ``s = 1, ..., p-1`` rank ``r`` sends its input's block ``(r+s) % p`` to rank
``(r+s) % p`` while receiving rank ``(r-s) % p``'s input block ``r``, and reduces it into
its result. Blocks follow `block_range`; conventions and cost notation as in
`parallel.collectives.base`.
"""


def pairwise_steps(schedule, rank, p, slices, out):
    """Append the ``p-1`` pairwise steps reducing block ``rank`` of "in" over all ranks into view ``out``.

    Parameters
    ----------
    schedule : parallel.collectives.schedule.Schedule
    rank, p : int
        This rank and the rank count (any ``p >= 2``).
    slices : list of slice
        The ``p`` blocks of the vector (`parallel.collectives.base.block_slices`).
    out : (buffer, slice)
        Where block ``rank`` of the result goes: "out" at ``slices[rank]`` in place (the input's
        own block, read by the first reduction only), its first items out of place.

    Notes
    -----
    Cost per rank: ``(p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma``; each incoming block lands in
    "tmp" (scratch: one block). The sends read "in" at other ranks' blocks only, so in place they
    never see the result being built.
    """
    mine = slices[rank]
    landing = ("tmp", slice(0, mine.stop - mine.start))
    partial = ("in", mine)
    for step in range(1, p):
        dest, source = (rank + step) % p, (rank - step) % p
        schedule.exchange(("in", slices[dest]), dest, landing, source, reduce=(partial, landing, out))
        partial = out
