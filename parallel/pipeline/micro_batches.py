"""What a pipeline stage keeps per micro-batch: the layers' saved state and the received messages.

Per-micro-batch state (`save_caches`, `restore_caches`)
    Layers keep what backward needs in attributes whose names start with ``_``
    (``Linear._x``, ``ReLU._mask``...). After each forward a stage saves those
    attributes (references, no copies) of its layers and of layers nested in them,
    and restores them before that micro-batch's backward.
Received messages (`Inbox`)
    The messages of one direction from one neighbour arrive in order. One receive is
    always posted ahead (``Irecv``), into a buffer from a pool that the stage refills
    once a micro-batch is done with its buffer, so that a message lands in place, in
    memory that is already paged in. Buffers are allocated with the stage's array
    module (``xp``: device buffers on a GPU, received through a staging
    `kernels.comm.device.DeviceComm`).
"""
import numpy as np

from kernels.backend import array_module
from parallel.nn.layers import Layer


def _nested_layers(value):
    if isinstance(value, Layer):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, Layer)]
    return []


def save_caches(layers):
    """Return ``(layer, name, value)`` for every ``_``-named attribute of ``layers`` and their nested layers.

    The values are references (no copies); `restore_caches` puts them back.
    """
    saved, todo = [], list(layers)
    while todo:
        layer = todo.pop()
        for name, value in vars(layer).items():
            nested = _nested_layers(value)
            if nested:
                todo += nested
            elif name.startswith("_"):
                saved.append((layer, name, value))
    return saved


def restore_caches(saved):
    """Set back the attributes recorded by `save_caches`."""
    for layer, name, value in saved:
        setattr(layer, name, value)


def saved_bytes(saved):
    """Bytes of the arrays among the values recorded by `save_caches`."""
    return sum(value.nbytes for _, _, value in saved
               if isinstance(value, np.ndarray) or array_module(value) is not np)


class Inbox:
    """The messages of one direction (activations or gradients) from one neighbour, in order.

    One receive is always posted ahead, into a buffer of ``(rows,) + shape`` from a
    pool that the owner refills with `give_back` once done with a buffer.

    Parameters
    ----------
    comm : MPI.Comm
    source, tag : int
        The neighbour's rank and the messages' tag.
    shape : tuple of int
        Per-sample shape of a message.
    dtype : numpy dtype
    xp : module
        Array module of the buffers (``numpy`` or ``cupy``).
    """

    def __init__(self, comm, source, tag, shape, dtype, xp=np):
        self.comm, self.source, self.tag, self.shape, self.dtype, self.xp = comm, source, tag, shape, dtype, xp
        self.rows, self.pool, self.posted, self.remaining = None, [], None, 0

    def open(self, rows, count):
        """Expect ``count`` messages of ``rows`` samples (none may be pending); post the first receive."""
        if rows != self.rows:
            self.rows, self.pool = rows, []
        self.remaining = 0
        self.expect(count)

    def expect(self, count):
        """Expect ``count`` more messages after those expected so far; post a receive if none is posted.

        A stream that never flushes (PipeDream) keeps one receive posted from step to
        step, so that the neighbour's send of the next step's first message completes.
        """
        self.remaining += count
        if self.posted is None:
            self._post()

    def _post(self):
        if self.remaining:
            buffer = self.pool.pop() if self.pool else self.xp.empty((self.rows,) + self.shape, self.dtype)
            self.posted = (buffer, self.comm.Irecv(buffer, self.source, self.tag))
            self.remaining -= 1

    def take(self):
        """Wait for the next message, post the receive of the one after, and return the message."""
        buffer, request = self.posted
        request.Wait()
        self.posted = None
        self._post()
        return buffer

    def give_back(self, buffer):
        """Return a buffer that `take` gave (None: nothing to return) to the pool."""
        if buffer is not None:
            self.pool.append(buffer)


def reusable(received, sent):
    """``received``, or None if ``sent`` (a message whose send may be pending) may view its memory."""
    return None if array_module(received).may_share_memory(received, sent) else received
