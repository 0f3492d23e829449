"""Model of suite ``conv`` (`bench.cases.conv`): a domain-parallel convolution with halo exchange."""
import math

import numpy as np

from bench.models import terms
from bench.models.base import Model, balanced_dims
from bench.settings import Setting, choice, integer
from kernels.errors import InputError
from parallel.spatial.halo_conv import CHUNK_ELEMENTS
from parallel.spatial.halo_exchange import DEFAULT_PACKING, PACKING_METHODS

#: Largest image (elements) whose check runs the serial convolution on all of it; above, small windows.
FULL_CHECK_ELEMENTS = 1 << 18

SETTINGS = (
    Setting("CONV_CHANNELS", integer, 16, 1, "input and output channels C"),
    Setting("CONV_KERNEL", integer, 3, 1, "kernel side k, odd ('same' padding)"),
    Setting("CONV_BATCH", integer, 1, 1, "images per batch N"),
    Setting("CONV_PACKING", choice, DEFAULT_PACKING, PACKING_METHODS,
            "how halos travel: packed buffers or MPI subarray datatypes"),
)


def read_settings(settings):
    """The suite's settings as the state keeps them; `InputError` for an even kernel."""
    settings = dict(channels=settings["CONV_CHANNELS"], kernel=settings["CONV_KERNEL"], batch=settings["CONV_BATCH"],
                    packing=settings["CONV_PACKING"])
    if settings["kernel"] % 2 == 0:
        raise InputError(f"MLSCALE_CONV_KERNEL={settings['kernel']}: 'same' padding needs an odd kernel")
    return settings


class HaloConvModel(Model):
    name = "conv"
    variants = ("forward", "forward_overlap", "forward_backward", "forward_backward_overlap")
    size_unit = "pixels"
    declared_settings = SETTINGS

    def problem_size(self, size, ranks, scaling):
        return size if scaling == "strong" else round(size * math.sqrt(ranks))

    def predict(self, variant, size, ranks, calib):
        """The convolution flops of a tile at the calibrated rate of this suite's kernel (`terms.suite_rate`)
        and, on a grid, the halo exchange: per split axis two messages of ``N C k//2`` rows of the tile's
        side, packed and unpacked (forward; the reverse exchange again with backward); the ``_overlap``
        variants hide the exchange behind the interior."""
        settings = read_settings(self.settings)
        channels, kernel, batch = settings["channels"], settings["kernel"], settings["batch"]
        backward = variant.startswith("forward_backward")
        flops = 2 * batch * channels**2 * kernel**2 * size**2 * (3 if backward else 1) / ranks
        compute = flops / terms.suite_rate(calib, "conv", "forward_backward" if backward else "forward", ranks)
        dims = balanced_dims(ranks, 2)
        halo = 0.0
        for axis, parts in enumerate(dims):
            if parts > 1:
                edge = batch * channels * (kernel // 2) * (size / dims[1 - axis] + kernel - 1) * terms.itemsize(calib)
                halo += 2 * terms.message(calib, edge) + 4 * terms.copy(calib, edge)
        halo *= 2 if backward else 1
        return max(compute, halo) if variant.endswith("_overlap") else compute + halo

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Tiles of ``N C ceil(H / pr) ceil(W / pc)`` elements: x, its padded copy and y, with
        backward also dy, its padded copy, dx and the gradient halos; the hashed inputs' uint64
        planes and the chunked patch matrices. The check's serial convolution (patch matrices of
        the whole image) when the image has at most `FULL_CHECK_ELEMENTS` elements, else small windows."""
        settings = read_settings(self.settings)
        rows, cols = (-(-problem // dim) for dim in balanced_dims(ranks, 2))
        pad = settings["kernel"] // 2
        tile = settings["batch"] * settings["channels"] * (rows + 2 * pad) * (cols + 2 * pad)
        backward = variant.startswith("forward_backward")
        arrays = (9 if backward else 4) * tile * np.dtype(dtype).itemsize
        image = settings["batch"] * settings["channels"] * problem * problem
        reference = 8 * image * (settings["kernel"] ** 2 + 4) * (2 if backward else 1)
        return (arrays + 4 * 8 * (rows + 2 * pad) * (cols + 2 * pad) + 2 * 8 * CHUNK_ELEMENTS
                + (reference if check and image <= FULL_CHECK_ELEMENTS else 0))
