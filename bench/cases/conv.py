"""Suite ``conv``: domain-parallel convolution with halo exchange (parallel.spatial.halo_conv).

One run is the forward pass (``forward``, ``forward_overlap``) or the forward and
backward passes (``forward_backward``, ``forward_backward_overlap``) of one
``C -> C`` convolution, ``k x k`` kernel, stride 1, 'same' padding, on a batch of
``N`` images of ``size x size`` pixels split in tiles over a 2D grid of the ranks
(``MPI.Compute_dims``: 2x1, 3x1, 2x2...). The ``_overlap`` variants compute the
tile interior while the halos are in flight, then the border.

Settings (`bench.models.conv.SETTINGS`): channels ``C``, odd kernel side ``k``, images per batch
``N``, and how halos travel: ``packed`` (default: copies into contiguous buffers,
measured faster here) or ``subarray`` (MPI subarray datatypes).

Scaling: strong keeps the image; weak keeps the pixels per rank: the image side
is ``round(size * sqrt(p))``, so ``H * W / p`` stays ``size**2`` within rounding
(the tiles are not square when the grid is not: 724 x 1448 on 2 ranks for 1024).

Metrics: ``gflops`` = convolution flops (``2 N C^2 k^2 H W`` forward, three times
that with backward: `bench.models.flops`) per second over every rank; ``metric`` ``halo_share`` = wall time inside the
halo exchanges (packing, posting, waiting, unpacking; forward and reverse) over
run time, measured on rank 0. ``params``: grid, rank 0's tile, the largest halo
bytes received by a rank in one forward exchange, overlap, packing, settings, ``gflops_per_rank``
(gflops / ranks).

Check: inputs and output gradients are a hash of the global element index, so any
window can be rebuilt without the rest of the image. Each rank compares its
output tile (and its input-gradient tile with backward) with the serial
`parallel.nn.conv.Conv2d` on the window around it: the whole tile for small
images, else the (up to) 16 x 16 blocks at its four corners, which read every
kind of halo. When the image has at most `FULL_CHECK_ELEMENTS` elements the serial
convolution runs on the whole image and the weight and bias gradients (summed
over the grid) are compared too.

Backends: on a device the tiles, parameters and buffers are device arrays (the
inputs hashed on the host, then moved once), the grid is built from
``backend.comm(comm)``; results come to the host only in the check. ``subarray``
packing there needs a CUDA-aware MPI (`InputError` otherwise).
"""
import itertools
import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from bench.case import Case, Metrics
from bench.models import flops
from bench.models.conv import FULL_CHECK_ELEMENTS, HaloConvModel, read_settings
from kernels.distribution import ProcessGrid
from kernels.errors import InputError
from parallel.spatial.halo_conv import HaloConv2d, conv_padding
from parallel.nn.conv import Conv2d
from parallel.spatial.tile_layout import TileLayout

SEED = 2024
INPUT_STREAM, GRADIENT_STREAM = 1, 2
CORNER = 16
TOLERANCES = {"float64": 1e-10, "float32": 1e-4}


def hashed_values(stream, shape, rows, cols, dtype):
    """Elements ``[:, :, rows, cols]`` of a pseudo-random ``shape`` tensor, zero outside it.

    Element ``(n, c, i, j)`` is the splitmix64 hash of its flat index and ``stream``,
    mapped to ``[-0.5, 0.5)``: any window is rebuilt exactly without the others.
    ``rows`` and ``cols`` are global ``(start, stop)`` ranges and may stick out.
    """
    batch, channels, height, width = shape
    out = np.zeros((batch, channels, rows[1] - rows[0], cols[1] - cols[0]), dtype)
    r0, r1, c0, c1 = max(rows[0], 0), min(rows[1], height), max(cols[0], 0), min(cols[1], width)
    if r0 >= r1 or c0 >= c1:
        return out
    pixels = (np.arange(r0, r1, dtype=np.uint64)[:, None] * np.uint64(width)
              + np.arange(c0, c1, dtype=np.uint64)[None, :])
    for n in range(batch):
        for c in range(channels):
            plane = np.uint64(((n * channels + c) * height * width) ^ (stream << 56))
            h = (pixels + plane) * np.uint64(0x9E3779B97F4A7C15)
            h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h ^= h >> np.uint64(31)
            out[n, c, r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]] = \
                (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 - 0.5
    return out


@dataclass
class _State:
    comm: object
    backend: object
    dtype: str
    size: int
    settings: dict
    backward: bool
    conv: HaloConv2d
    x: np.ndarray
    dy: np.ndarray
    halo_bytes: int
    y: np.ndarray = None
    dx: np.ndarray = None
    run_seconds: float = 0.0
    gflops_per_rank: float = math.nan


class HaloConv(Case):
    model_class = HaloConvModel
    benchmark = "halo_conv"
    size_help = "image side H = W (weak: the side is round(size * sqrt(p)))"
    default_sizes = "128:1024"
    metrics_help = ("gflops = convolution flops / time; metric halo_share = halo-exchange time / run time "
                    "(rank 0); params: grid, tile, halo_bytes_per_rank, overlap, packing")
    dtypes = ("float32", "float64")
    description = ("Domain-parallel 2D convolution: a batch of images split in tiles over a 2D grid of the ranks, "
                   "halos exchanged with the neighbours before each pass (packed buffers or MPI subarray types), "
                   "optionally overlapping the tile interior with the exchange. Forward, or forward and backward "
                   "with the halo gradients added back; each tile is checked against a serial convolution.")

    def iterations(self, size):
        return (10, 2) if size >= 1024 else (20, 3)

    def setup(self, comm, size, variant, backend, dtype):
        settings = read_settings(self.settings)
        channels, kernel, batch = settings["channels"], settings["kernel"], settings["batch"]
        grid = ProcessGrid(backend.comm(comm))
        layout = TileLayout.blocks(size, size, grid.dims)
        serial = Conv2d(channels, channels, kernel, 1, conv_padding("same", kernel), rng=SEED, dtype=dtype)
        try:
            conv = HaloConv2d(serial.to(backend), grid, layout, overlap=variant.endswith("_overlap"),
                              method=settings["packing"])
        except InputError:
            grid.free()
            raise
        shape = (batch, channels, size, size)
        (r0, r1), (c0, c1) = layout.ranges(grid.coords)
        x = backend.from_host(hashed_values(INPUT_STREAM, shape, (r0, r1), (c0, c1), dtype))
        backward = variant.startswith("forward_backward")
        dy = backend.from_host(hashed_values(GRADIENT_STREAM, shape, (r0, r1), (c0, c1), dtype)) if backward else None
        halo_bytes = comm.allreduce(conv.exchange.halo_bytes(batch, channels, np.dtype(dtype).itemsize), op=MPI.MAX)
        return _State(comm, backend, dtype, size, settings, backward, conv, x, dy, halo_bytes)

    def run(self, state):
        start = MPI.Wtime()
        state.y = state.conv.forward(state.x)
        if state.backward:
            state.dx = state.conv.backward(state.dy)
        state.backend.synchronize()
        state.run_seconds += MPI.Wtime() - start

    def check(self, state):
        shape = (state.settings["batch"], state.settings["channels"], state.size, state.size)
        tile = state.conv.in_layout.ranges(state.conv.grid.coords)
        to_host = state.backend.to_host
        results = [to_host(state.y), to_host(state.dx) if state.backward else None]
        if math.prod(shape) <= FULL_CHECK_ELEMENTS:
            return self._full_check(state, results, shape, tile)
        corners = itertools.product(*(_end_spans(lo, hi) for lo, hi in tile))
        return sum(self._window_check(state, results, shape, tile, region) for region in corners)

    def _serial(self, state):
        conv = state.conv.conv
        out_channels, in_channels, kernel = conv.params["weight"].shape[:3]
        serial = Conv2d(in_channels, out_channels, kernel, 1, 0, rng=SEED, dtype=state.dtype)
        serial.params["weight"][...] = state.backend.to_host(conv.params["weight"])
        serial.params["bias"][...] = state.backend.to_host(conv.params["bias"])
        return serial

    def _full_check(self, state, results, shape, tile):
        """Serial convolution of the whole image, padded here: compare tiles (``results``: y, dx on the
        host), dW and db."""
        pad = state.conv.conv.padding
        serial = self._serial(state)
        y = serial.forward(hashed_values(INPUT_STREAM, shape, (-pad, shape[2] + pad), (-pad, shape[3] + pad),
                                         state.dtype))
        (r0, r1), (c0, c1) = tile
        wrong = _wrong(results[0], y[:, :, r0:r1, c0:c1], state.dtype)
        if state.backward:
            dx = serial.backward(hashed_values(GRADIENT_STREAM, shape, (0, shape[2]), (0, shape[3]), state.dtype))
            wrong += _wrong(results[1], dx[:, :, pad + r0:pad + r1, pad + c0:pad + c1], state.dtype)
            wrong += sum(_wrong(state.backend.to_host(state.conv.grads[name]), serial.grads[name], state.dtype)
                         for name in serial.grads)
        return wrong

    def _window_check(self, state, results, shape, tile, region):
        """Serial convolution of the window around ``region`` (global rows, cols): compare y (and dx)."""
        pad = state.conv.conv.padding
        reach = 2 * pad if state.backward else pad
        serial = self._serial(state)
        (r0, r1), (c0, c1) = region
        y = serial.forward(hashed_values(INPUT_STREAM, shape, (r0 - reach, r1 + reach), (c0 - reach, c1 + reach),
                                         state.dtype))
        margin = reach - pad
        local = tuple(slice(lo - start, hi - start) for (lo, hi), (start, _) in zip(region, tile))
        wrong = _wrong(results[0][(Ellipsis,) + local], y[:, :, margin:margin + r1 - r0, margin:margin + c1 - c0],
                       state.dtype)
        if state.backward:
            dx = serial.backward(hashed_values(GRADIENT_STREAM, shape, (r0 - pad, r1 + pad), (c0 - pad, c1 + pad),
                                               state.dtype))
            wrong += _wrong(results[1][(Ellipsis,) + local], dx[:, :, reach:reach + r1 - r0, reach:reach + c1 - c0],
                            state.dtype)
        return wrong

    def teardown(self, state):
        state.conv.exchange.free()
        state.conv.grid.free()

    def metrics(self, state, seconds):
        batch, channels, kernel = (state.settings[key] for key in ("batch", "channels", "kernel"))
        forward, backward = flops.convolution(batch, state.size ** 2, channels, channels, kernel ** 2)
        gflops, state.gflops_per_rank = flops.per_rank(forward + (backward if state.backward else 0), seconds,
                                                       state.comm.size)
        return Metrics(gflops=gflops, metric="halo_share", metric_value=_halo_share(state))

    def params(self, state):
        grid = state.conv.grid
        return dict(state.settings, grid="x".join(map(str, grid.dims)),
                    tile="x".join(map(str, state.conv.in_shape)), halo_bytes_per_rank=state.halo_bytes,
                    overlap=state.conv.overlap, stride=1, padding="same", halo_share=_halo_share(state),
                    gflops_per_rank=state.gflops_per_rank)

def _end_spans(lo, hi):
    """The first and last `CORNER` indices of ``[lo, hi)``, without overlap (one span when short)."""
    low = (lo, min(lo + CORNER, hi))
    high = (max(hi - CORNER, low[1]), hi)
    return [low, high] if high[0] < high[1] else [low]


def _wrong(actual, expected, dtype):
    """Elements of ``actual`` outside the tolerance of ``expected`` (relative to its largest magnitude)."""
    tolerance = TOLERANCES[dtype]
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    return int(np.count_nonzero(~np.isclose(actual, expected, rtol=tolerance, atol=tolerance * scale)))


def _halo_share(state):
    seconds = state.conv.exchange.seconds
    return seconds / state.run_seconds if state.run_seconds > 0 else math.nan
