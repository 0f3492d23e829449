"""A value cached on a communicator as an MPI attribute, freed by a delete callback when the communicator is freed.

`CommAttribute` makes the value the first time a communicator asks for it, stores it
on the communicator (``Set_attr`` under a keyval of its own, made at first use:
importing must not need MPI running) and hands it to its ``free`` function when MPI
deletes the attribute: when the communicator is freed (once no request holds it) or
by `CommAttribute.delete_all`, which its owner calls at exit while Python and MPI
are both still up. Used for the plan cache's keys per communicator
(`parallel.collectives.plans`) and the node communicators of the two-level allreduce
(`parallel.collectives.hierarchical`).
"""
from mpi4py import MPI


class CommAttribute:
    """A value per communicator, made on demand and freed with the communicator.

    Parameters
    ----------
    make : callable
        ``make(comm) -> value``, called by `get` on a communicator that has no value yet
        (collective on ``comm`` where ``make`` is).
    free : callable
        ``free(value)``, called once when MPI deletes the attribute (the communicator is
        freed, or `delete_all`).
    """

    def __init__(self, make, free):
        self.make, self.free = make, free
        self._keyvals = []   # the attribute's keyval, made at first use
        self._carriers = {}  # id(value) -> the communicator carrying it

    def _keyval(self):
        if not self._keyvals:
            self._keyvals.append(MPI.Comm.Create_keyval(delete_fn=self._deleted))
        return self._keyvals[0]

    def _deleted(self, comm, keyval, value):
        self._carriers.pop(id(value), None)
        self.free(value)
        return MPI.SUCCESS

    def get(self, comm):
        """The value of ``comm``, made by ``make(comm)`` and stored on it at the first call."""
        value = comm.Get_attr(self._keyval())
        if value is None:
            value = self.make(comm)
            comm.Set_attr(self._keyval(), value)
            self._carriers[id(value)] = comm
        return value

    def delete_all(self):
        """Delete the attribute from every communicator still carrying it (each value freed), unless MPI is
        finalized; call it at exit (`atexit`), before MPI finalizes."""
        if not MPI.Is_finalized():
            for comm in list(self._carriers.values()):
                if comm != MPI.COMM_NULL:
                    comm.Delete_attr(self._keyval())
        self._carriers.clear()
