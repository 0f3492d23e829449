"""``mlscale slurm``: sbatch scripts for sweeps over node counts (being written)."""
from kernels.errors import InputError


def add_slurm_options(parser):
    """Add the Slurm-specific options to the ``slurm`` sub-command's parser."""
    parser.add_argument("--nodes", default="1", help="node counts, e.g. 1,2,4")


def command_slurm(args, argv, out):
    """Render one script per node count; return the exit status."""
    raise InputError("mlscale slurm is not implemented yet")
