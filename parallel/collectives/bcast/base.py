"""What the broadcasts share: the binomial tree on virtual ranks (the binomial reduce's too) and the root's
``sendbuf``.

Broadcasts are written for root 0 on virtual ranks ``(rank - root) % p`` and run for
any root by `parallel.collectives.rooted.RootedCollective`.
"""
from mpi4py import MPI


def subtree_span(virtual_rank, p):
    """``2**k`` such that the binomial subtree of ``virtual_rank`` spans ``virtual_rank .. + 2**k - 1``
    (cut at ``p``): its lowest set bit, or ``p`` rounded up to a power of two for the root."""
    return virtual_rank & -virtual_rank if virtual_rank else 1 << (p - 1).bit_length()


def children(virtual_rank, p):
    """The children of ``virtual_rank`` in the binomial tree, largest subtree first, as
    ``(child, span of the child's subtree)`` pairs."""
    distance = subtree_span(virtual_rank, p) >> 1
    pairs = []
    while distance:
        if virtual_rank + distance < p:
            pairs.append((virtual_rank + distance, distance))
        distance >>= 1
    return pairs


def input_buffer(virtual_rank, in_place):
    """The buffer a broadcast's steps send from on ``virtual_rank``: "in" on a root out of place, else
    "out" (off the root a broadcast receives into "out" and never reads its ignored sendbuf, whatever
    ``in_place`` says)."""
    return "in" if virtual_rank == 0 and not in_place else "out"


def root_or_in_place(comm, sendbuf, root):
    """``sendbuf`` on the root, ``MPI.IN_PLACE`` elsewhere: a broadcast ignores ``sendbuf`` off the root,
    so the collective checks and reads only ``recvbuf`` there."""
    return sendbuf if comm.rank == root else MPI.IN_PLACE
