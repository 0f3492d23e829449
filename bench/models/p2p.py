"""Model of suite ``p2p`` (`bench.cases.p2p`): ping-pong latency and a window of messages."""
from bench.models import terms
from bench.models.base import Model

#: Messages in flight per bandwidth run (OSU's default window).
WINDOW = 64


class PointToPointModel(Model):
    name = "p2p"
    variants = ("latency", "bandwidth")
    size_unit = "bytes"

    def problem_size(self, size, ranks, scaling):
        return size

    def predict(self, variant, size, ranks, calib):
        """latency: a round trip, two one-way messages of the calibrated ping-pong table; bandwidth:
        `WINDOW` messages at the calibrated gap of a window of the same pattern (``stream``, its
        acknowledgement included)."""
        if variant == "latency":
            return 2 * terms.pingpong(calib, size)
        return WINDOW * terms.stream(calib, size)

    def measured_by_calibration(self, variant, size, ranks, calib):
        """Either variant on two ranks (one pair: osu_latency, osu_bw) at a size of its table (``pingpong``,
        ``stream``)."""
        return ranks == 2 and terms.holds(calib["pingpong" if variant == "latency" else "stream"], size)

    def memory_bytes(self, problem, ranks, variant, dtype, check=True):
        """Send and receive buffers of ``problem`` bytes; the byte pattern is computed from two
        int64 temporaries (16 bytes per byte), in setup and in the check."""
        return 2 * problem + 16 * problem
