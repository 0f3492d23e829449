"""The shard layout of ZeRO: segments of the flat vectors, each split over the ranks by `block_range`.

The flat parameter and gradient vectors (`parallel.nn.models.flat_storage` order)
are cut into *segments*: gradient buckets (`parallel.data.gradient_wire.bucket_bounds`,
stages 1 and 2) or one segment per layer (stage 3). Every segment of ``m`` items is
split by ``block_range(m, p, r)``: rank ``r`` owns one *piece* of each, so a
segment's reduce-scatter and allgather are exactly the collectives'
(`parallel.collectives` and MPI's ``Reduce_scatter`` / ``Allgatherv`` with
`block_counts`) and any length, below ``p`` too, works (empty pieces). A rank's
shard is its pieces one after another; the optimiser updates it piece by piece
(one ``(param, grad)`` pair per segment), which is elementwise, so the order does
not matter.

`held_bytes` counts the memory of arrays (views counted once, by the array that
owns the memory) and `TransientBytes` the arrays a step allocates and frees:
the model-state figures of `bench.cases.dp`. No communication here.
"""
from kernels.distribution import block_counts, block_offsets, block_range


class ShardLayout:
    """Segments of a flat vector and this rank's piece of each.

    Parameters
    ----------
    segments : sequence of (int, int)
        ``(start, stop)`` ranges of the flat vector (disjoint, covering it), in
        the order their collectives run.
    ranks, rank : int
        The communicator's size and this rank.

    Attributes
    ----------
    segments : list of (int, int)
    counts, displacements : list of list of int
        Per segment, every rank's piece length and start inside the segment
        (the ``Reduce_scatter`` / ``Allgatherv`` counts and displacements).
    pieces : list of (int, int)
        This rank's piece of each segment, as a range of the flat vector.
    offsets : list of int
        Where each piece starts in the shard (its pieces one after another).
    size : int
        Items of this rank's shard (about ``n / p``).
    """

    def __init__(self, segments, ranks, rank):
        self.segments = [(int(start), int(stop)) for start, stop in segments]
        lengths = [stop - start for start, stop in self.segments]
        self.counts = [block_counts(length, ranks) for length in lengths]
        self.displacements = [block_offsets(length, ranks) for length in lengths]
        local = [block_range(length, ranks, rank) for length in lengths]
        self.pieces = [(start + low, start + high) for (start, _), (low, high) in zip(self.segments, local)]
        self.offsets, self.size = [], 0
        for low, high in local:
            self.offsets.append(self.size)
            self.size += high - low

    def own(self, index):
        """This rank's piece of segment ``index`` as a slice of the segment itself."""
        start = self.segments[index][0]
        low, high = self.pieces[index]
        return slice(low - start, high - start)

    def shard_views(self, shard):
        """Views of ``shard`` (a vector of `size` items), one per piece, in segment order."""
        return [shard[offset:offset + high - low] for offset, (low, high) in zip(self.offsets, self.pieces)]

    def flat_views(self, vector):
        """Views of the full flat ``vector`` at this rank's pieces, in segment order."""
        return [vector[low:high] for low, high in self.pieces]


def _owner(array):
    """The array that owns the memory ``array`` views (itself when it owns it)."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "nbytes"):
        array = array.base
    return array


def held_bytes(arrays):
    """Bytes of memory behind ``arrays`` (None entries skipped), each owning array counted once."""
    owners = {id(owner): owner for owner in map(_owner, filter(lambda array: array is not None, arrays))}
    return int(sum(owner.nbytes for owner in owners.values()))


class TransientBytes:
    """Bytes of the arrays a step allocates and frees (gathered layers, buckets, staging): now and at the peak.

    Attributes
    ----------
    current, peak : int
        Bytes allocated through `empty` and not yet `free`d; the most there were at once.
    """

    def __init__(self):
        self.current = self.peak = 0

    def empty(self, xp, size, dtype):
        """A new ``xp.empty(size, dtype)``, counted until `free`."""
        array = xp.empty(size, dtype)
        self.current += array.nbytes
        self.peak = max(self.peak, self.current)
        return array

    def free(self, array):
        """``array`` (from `empty`) is no longer held."""
        self.current -= array.nbytes
