"""Model of suite ``moe`` (`bench.cases.moe`): an expert-parallel mixture-of-experts layer."""
import math

import numpy as np

from bench.models import collective_terms, terms
from bench.models.base import Model
from bench.settings import Setting, choice, integer, number
from kernels.errors import InputError
from parallel.collectives.alltoall import ALLTOALL_SCHEDULES
from parallel.expert.moe import MOE_ALLTOALLS

AUX_LOSS_WEIGHT = 0.01
TOP_K = {"top1": 1, "top2": 2}

SETTINGS = (
    Setting("MOE_EXPERTS_PER_RANK", integer, 2, 1, "experts per rank"),
    Setting("MOE_HIDDEN", integer, 256, 1, "token width"),
    Setting("MOE_FFN", integer, None, 1, "expert inner width (default 4 x hidden)"),
    Setting("MOE_CAPACITY", number, 1.25, 0.0, "capacity factor"),
    Setting("MOE_ALLTOALL", choice, "mpi", MOE_ALLTOALLS,
            "algorithm of the all-to-alls: MPI's, or hand-written (auto: scattered for the routed rows, as "
            "MPICH's alltoallv; Bruck cannot take the routing's counts)"),
)


def read_settings(settings):
    """Layer settings from the suite's ``settings``."""
    hidden = settings["MOE_HIDDEN"]
    return dict(experts_per_rank=settings["MOE_EXPERTS_PER_RANK"], hidden=hidden,
                ffn=settings["MOE_FFN"] or 4 * hidden, capacity_factor=settings["MOE_CAPACITY"],
                aux_loss_weight=AUX_LOSS_WEIGHT, alltoall=settings["MOE_ALLTOALL"])


class MixtureOfExpertsModel(Model):
    name = "moe"
    variants = tuple(TOP_K)
    size_unit = "tokens"
    declared_settings = SETTINGS
    settings_reader = staticmethod(read_settings)

    def check_ranks(self, ranks, variant):
        if TOP_K[variant] > self.config["experts_per_rank"] * ranks:
            raise InputError(f"moe {variant} needs at least {TOP_K[variant]} experts; "
                             f"{self.config['experts_per_rank']} per rank on {ranks} ranks")

    def predict(self, variant, size, ranks, calib):
        """Balanced routing: the gate GEMMs of a rank's ceil(T / p) tokens over the E experts, k rows per token
        through its experts (six GEMMs each, `terms.dense_layers` of hidden -> ffn -> hidden), a handful
        of routing passes, and per pass an ``Alltoall`` of counts and two ``Alltoallv`` of the routed
        rows (dispatch, combine; MPI's or the ``MOE_ALLTOALL`` algorithm's, `_alltoall`), then the allreduce of the gate gradient and the statistics. The compute on the
        line through the two calibrated one-rank ``top1`` steps around this rank's tokens (`terms.fitted_step`: a
        fixed cost of the step's Python calls and a scale; a calibration without them: the terms alone). An uneven
        routing (``load_imbalance`` in params) makes the busiest rank slower than this."""
        try:
            self.check_ranks(ranks, variant)
        except InputError:
            return None
        cfg, k = self.config, TOP_K[variant]
        tokens = math.ceil(size / ranks)
        if "moe_step" in calib:
            def calibrated_step(count):  # top1 on one rank
                return self._local(calib, 1, count, 1, ranks) + self._messages(calib, 1, count, 1)
            fixed, scale = terms.fitted_step(calib, "moe_step", calibrated_step, ranks, tokens)
        else:
            fixed, scale = 0.0, 1.0
        return fixed + scale * self._local(calib, k, tokens, ranks, ranks) + self._messages(calib, k, tokens, ranks)

    def _local(self, calib, k, tokens, experts_ranks, ranks):
        """Seconds of one rank's compute for ``tokens`` tokens, top-``k``, on ``experts_ranks`` ranks of experts
        (the gate's width), at the threads and sharing of one of ``ranks`` ranks: its experts' layers and the
        gate's GEMMs and calls."""
        cfg = self.config
        rows = math.ceil(k * tokens / cfg["experts_per_rank"])
        forward, backward = terms.dense_layers(calib, (cfg["hidden"], cfg["ffn"], cfg["hidden"]), rows, ranks)
        gate = 3 * terms.gemm(calib, tokens, cfg["experts_per_rank"] * experts_ranks, cfg["hidden"], ranks)
        return cfg["experts_per_rank"] * (forward + backward) + gate + terms.calls(calib, 40)

    def _messages(self, calib, k, tokens, ranks):
        """Seconds of one rank's all-to-alls (counts, dispatch and combine, forward and backward, with the copies
        of the routed rows) and allreduces (the gate's gradient, the statistics) on ``ranks`` ranks."""
        cfg, item = self.config, terms.itemsize(calib)
        routed = k * tokens * cfg["hidden"] * item
        exchange = 2 * (self._alltoall(calib, 8 * cfg["experts_per_rank"] * ranks, 8, ranks, "auto")
                        + 2 * self._alltoall(calib, routed, item, ranks, "scattered") + 2 * terms.copy(calib, routed))
        gate = cfg["hidden"] * cfg["experts_per_rank"] * ranks * item
        return exchange + collective_terms.allreduce(calib, gate, ranks) + collective_terms.allreduce(calib, 64, ranks)

    def _alltoall(self, calib, nbytes, itemsize, ranks, auto):
        """One all-to-all of ``nbytes`` per rank: MPI's library term, or the ``MOE_ALLTOALL`` algorithm's
        schedule on even blocks (balanced routing); ``auto`` names what ``auto`` runs (its own choice
        for the counts, scattered for the rows)."""
        name = self.config["alltoall"]
        if name == "mpi":
            return collective_terms.alltoall(calib, nbytes, ranks)
        return collective_terms.hand_written(calib, ALLTOALL_SCHEDULES[auto if name == "auto" else name], ranks,
                            nbytes // itemsize, itemsize)

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """x and dy (T x hidden, drawn in float64) and outputs; this rank's experts with gradients;
        dispatch and combine buffers and expert activations of its ``k ceil(T / p)`` assignments
        (times the capacity factor); the check runs `SerialMoE` with all ``E`` experts on all T tokens."""
        settings, tokens = self.config, problem
        hidden, ffn, top_k = settings["hidden"], settings["ffn"], TOP_K[variant]
        rows = top_k * -(-tokens // ranks) * max(1.0, settings["capacity_factor"])
        run = 5 * tokens * hidden + 4 * settings["experts_per_rank"] * hidden * ffn + rows * (6 * hidden + 3 * ffn)
        experts = settings["experts_per_rank"] * ranks
        reference = 4 * experts * hidden * ffn + 3 * top_k * tokens * ffn + 4 * tokens * hidden
        return int(np.dtype(dtype).itemsize * (run + (reference if check else 0))) + 8 * tokens * hidden
