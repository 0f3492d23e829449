"""Model of suite ``moe`` (`bench.cases.moe`): an expert-parallel mixture-of-experts layer."""
import math

import numpy as np

from bench.models import collective_terms, terms
from bench.models.base import Model
from bench.models.chosen import hand_written
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
        rows (dispatch, combine; MPI's or the ``MOE_ALLTOALL`` algorithm's, `_alltoall`), then the allreduce of the gate gradient and the statistics. An uneven
        routing (``load_imbalance`` in params) makes the busiest rank slower than this."""
        try:
            self.check_ranks(ranks, variant)
        except InputError:
            return None
        cfg, k, item = self.config, TOP_K[variant], terms.itemsize(calib)
        tokens, experts = math.ceil(size / ranks), cfg["experts_per_rank"] * ranks
        rows = math.ceil(k * tokens / cfg["experts_per_rank"])
        forward, backward = terms.dense_layers(calib, (cfg["hidden"], cfg["ffn"], cfg["hidden"]), rows, ranks)
        gate = 3 * terms.gemm(calib, tokens, experts, cfg["hidden"], ranks) + terms.calls(calib, 40)
        routed = k * tokens * cfg["hidden"] * item
        exchange = 2 * (self._alltoall(calib, 8 * cfg["experts_per_rank"] * ranks, 8, ranks, "auto")
                        + 2 * self._alltoall(calib, routed, item, ranks, "scattered") + 2 * terms.copy(calib, routed))
        reduce = collective_terms.allreduce(calib, cfg["hidden"] * experts * item, ranks) + collective_terms.allreduce(calib, 64, ranks)
        return cfg["experts_per_rank"] * (forward + backward) + gate + exchange + reduce

    def _alltoall(self, calib, nbytes, itemsize, ranks, auto):
        """One all-to-all of ``nbytes`` per rank: MPI's library term, or the ``MOE_ALLTOALL`` algorithm's
        schedule on even blocks (balanced routing); ``auto`` names what ``auto`` runs (its own choice
        for the counts, scattered for the rows)."""
        name = self.config["alltoall"]
        if name == "mpi":
            return collective_terms.alltoall(calib, nbytes, ranks)
        return hand_written(calib, ALLTOALL_SCHEDULES[auto if name == "auto" else name], ranks,
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
