"""Host memory high-water mark of a point's steps (the process's peak resident set size).

Linux keeps the peak RSS of a process (``VmHWM`` in ``/proc/self/status``) and
resets it to the current RSS when ``5`` is written to ``/proc/self/clear_refs``
(Linux 4.0 and later): reset after a point's set-up, read after its timed runs,
it is the peak of those runs alone (data, model and interpreter included, since
they are resident). Where the reset is refused, the figure is the process's peak
so far (``ru_maxrss``), earlier points included.
"""
import re
import resource

_STATUS, _CLEAR_REFS = "/proc/self/status", "/proc/self/clear_refs"


def reset_peak_rss():
    """Reset the peak RSS of this process to its current RSS; return False where that is not possible."""
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def peak_rss_mib():
    """The peak RSS of this process (since the last `reset_peak_rss`) in MiB."""
    try:
        with open(_STATUS) as handle:
            match = re.search(r"^VmHWM:\s+(\d+) kB", handle.read(), re.MULTILINE)
    except OSError:
        match = None
    kib = int(match.group(1)) if match else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024
