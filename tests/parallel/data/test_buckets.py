"""The bucket managers hand each bucket to the exchange when backward completes it: blocking or overlapped."""
import numpy as np
import pytest

from kernels.errors import InputError
from parallel.data.buckets import BucketManager, OverlappedBuckets

SIZES = [6, 2, 15, 3]  # parameters in flat order; 40 bytes of float32: buckets (23, 26), (8, 23), (0, 8)


class RecordingExchange:
    """An exchange that records its calls (bucket starts) instead of communicating."""

    def __init__(self, nonblocking=True):
        self.nonblocking, self.allreduce, self.calls = nonblocking, "mpi" if nonblocking else "ring", []

    def wire(self, grads):
        return grads

    def encode(self, grads, wire):
        self.calls.append(("encode", self.start_of[id(grads)]))

    def decode(self, wire, grads):
        self.calls.append(("decode", self.start_of[id(grads)]))

    def reduce(self, wire):
        self.calls.append(("reduce", self.start_of[id(wire)]))

    def start(self, wire):
        self.calls.append(("start", self.start_of[id(wire)]))
        return "request"

    def progress(self, requests):
        self.calls.append(("progress", len(requests)))

    def wait(self, requests):
        self.calls.append(("wait", len(requests)))


def manager(kind, exchange):
    grads = np.zeros(sum(SIZES), np.float32)
    buckets = kind(grads, SIZES, 40, exchange, lambda start, stop: exchange.calls.append(("complete", start)))
    exchange.start_of = {id(bucket): start for bucket, (start, _) in zip(buckets._grads, buckets.bounds)}
    return buckets


def backward(buckets, exchange):
    """One step: the layers' parameter counts reported last layer first (3 | 15 | 2 + 6), then `finish`."""
    buckets.begin()
    for count in (3, 15, 8):
        buckets.after_layer(count)
        exchange.calls.append(("layer", count))
    buckets.finish()


def test_blocking_buckets_are_completed_during_backward_and_reduced_after_it():
    exchange = RecordingExchange(nonblocking=False)
    buckets = manager(BucketManager, exchange)
    assert buckets.bounds == [(23, 26), (8, 23), (0, 8)]
    backward(buckets, exchange)
    assert exchange.calls == [("complete", 23), ("encode", 23), ("layer", 3), ("complete", 8), ("encode", 8),
                              ("layer", 15), ("complete", 0), ("encode", 0), ("layer", 8),
                              ("reduce", 23), ("reduce", 8), ("reduce", 0),
                              ("decode", 23), ("decode", 8), ("decode", 0)]


def test_overlapped_buckets_start_when_complete_progress_after_later_layers_and_wait_once():
    exchange = RecordingExchange()
    buckets = manager(OverlappedBuckets, exchange)
    for _ in range(2):  # a second step starts afresh
        exchange.calls.clear()
        backward(buckets, exchange)
        assert exchange.calls == [("complete", 23), ("encode", 23), ("start", 23), ("progress", 1), ("layer", 3),
                                  ("complete", 8), ("encode", 8), ("start", 8), ("progress", 2), ("layer", 15),
                                  ("complete", 0), ("encode", 0), ("start", 0), ("progress", 3), ("layer", 8),
                                  ("wait", 3), ("decode", 23), ("decode", 8), ("decode", 0)]


def test_overlap_needs_a_nonblocking_exchange_and_bucket_bytes_an_integer():
    with pytest.raises(InputError, match="overlap needs a non-blocking allreduce: use allreduce 'mpi', not 'ring'"):
        manager(OverlappedBuckets, RecordingExchange(nonblocking=False))
    for bad in (-1, 2.5):
        with pytest.raises(InputError, match="bucket_bytes >= 0"):
            BucketManager(np.zeros(3), [3], bad, RecordingExchange(), None)
