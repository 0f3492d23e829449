"""Model of suite ``attention`` (`bench.cases.attention`): full, ring and Ulysses attention over a sequence."""
import math

import numpy as np

from bench.models import collective_terms, terms
from bench.models.base import Model
from bench.settings import Setting, flag, integer
from kernels.errors import InputError
from parallel.nn.attention import TILES

SETTINGS = (
    Setting("ATTN_HEADS", integer, 4, 1, "attention heads"),
    Setting("ATTN_DIM", integer, 64, 1, "head dimension"),
    Setting("ATTN_CAUSAL", flag, False, None, "1: causal mask"),
    Setting("ATTN_BACKWARD", flag, False, None, "1: forward and backward pass (0: forward only)"),
    Setting("ATTN_TILE", integer, TILES[0], 1, "query rows per score tile"),
    Setting("ATTN_KEY_TILE", integer, TILES[1], 1, "keys per score tile (and per piece of the ring's last block)"),
)


def read_settings(settings):
    """The suite's settings as the state keeps them (heads, dim, causal, backward, tiles)."""
    return dict(heads=settings["ATTN_HEADS"], dim=settings["ATTN_DIM"], causal=settings["ATTN_CAUSAL"],
                backward=settings["ATTN_BACKWARD"], tiles=(settings["ATTN_TILE"], settings["ATTN_KEY_TILE"]))


class AttentionModel(Model):
    name = "attention"
    variants = ("full", "ring", "ring_zigzag", "ulysses")
    size_unit = "tokens"
    declared_settings = SETTINGS
    settings_reader = staticmethod(read_settings)

    def check_ranks(self, ranks, variant):
        if variant == "ulysses" and self.config["heads"] % ranks:
            raise InputError(f"ulysses needs the heads ({self.config['heads']}) divisible by the ranks ({ranks})")

    def predict(self, variant, size, ranks, calib):
        """The score flops at the calibrated rate of the serial kernel (`terms.suite_rate`); ``full`` on one
        rank; ``ring`` / ``ring_zigzag``: p steps of the busiest rank's block (contiguous causal: p - 1/2
        blocks), each of the first p - 1 overlapped with the K / V transfer (K, V, dK, dV backward):
        the slower of the two; ``ulysses``: the heads split, four all-to-alls of a rank's tokens (eight
        with backward)."""
        cfg = self.config
        item, backward = terms.itemsize(calib), cfg["backward"]
        flops = (4 + (10 if backward else 0)) * size**2 * cfg["heads"] * cfg["dim"] * (0.5 if cfg["causal"] else 1)
        rate = terms.suite_rate(calib, "attention", "full", ranks)
        if variant == "full" or ranks == 1:
            return flops / rate
        shard = math.ceil(size / ranks) * cfg["heads"] * cfg["dim"] * item
        if variant == "ulysses":
            return flops / ranks / rate + (8 if backward else 4) * collective_terms.alltoall(calib, shard, ranks)
        blocks = ranks - 0.5 if cfg["causal"] and variant == "ring" else (ranks / 2 if cfg["causal"] else ranks)
        step = flops / (0.5 if cfg["causal"] else 1) / ranks**2 / rate
        transfer = terms.message(calib, (4 if backward else 2) * shard)
        return blocks * step + (ranks - 1) * max(transfer - step, 0.0) * (2 if backward else 1)

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """This rank's tokens (all for ``full``, else ``ceil(n / p)``) as Q, K, V, dO and as many
        outputs and travelling blocks, a few float64 score tiles; the check draws all n
        tokens in float64 (and gathers O and lse with the backward pass)."""
        settings = self.config
        width = settings["heads"] * settings["dim"]
        local = problem if variant == "full" else -(-problem // ranks)
        run = (12 if settings["backward"] else 8) * local * width * np.dtype(dtype).itemsize
        tiles = 3 * 8 * settings["heads"] * settings["tiles"][0] * settings["tiles"][1]
        reference = 8 * problem * width * (8 if settings["backward"] else 5)
        return run + tiles + (reference if check else 0)
