"""The hand-written allreduce algorithms by variant name (`ALLREDUCE_ALGORITHMS`).

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf, op="sum") -> recvbuf``
and works on point-to-point messages for any rank count and length (conventions in
`parallel.collective_base`; each algorithm's cost next to its code):

- ``ring``: `parallel.ring_collectives` (bandwidth-optimal; also home of the ring
  reduce-scatter and allgather),
- ``recursive_doubling`` (latency-optimal) and ``rabenseifner`` (bandwidth-optimal
  in ``2 log2 p'`` messages): `parallel.power_of_two_allreduce` (both fold
  non-powers of two),
- ``tree``: `parallel.tree_allreduce` (binomial reduce and broadcast).
"""
from parallel.power_of_two_allreduce import allreduce_rabenseifner, allreduce_recursive_doubling
from parallel.ring_collectives import allreduce_ring
from parallel.tree_allreduce import allreduce_tree

ALLREDUCE_ALGORITHMS = {
    "ring": allreduce_ring,
    "recursive_doubling": allreduce_recursive_doubling,
    "rabenseifner": allreduce_rabenseifner,
    "tree": allreduce_tree,
}
