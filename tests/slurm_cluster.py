"""A throw-away Slurm cluster on this machine, for tests of the Slurm path (needs root and slurm-wlm).

It starts its own ``munged`` (own socket and key copy), one ``slurmctld`` and one
``slurmd -N NAME`` per node, every daemon in the foreground as a child of this
process, so each is stopped by the PID recorded at start, never by name.

Each ``slurmd`` runs in its own UTS namespace with the node's name as hostname,
so the processes of a job on two nodes see two hostnames as on a real cluster
(mlscale counts nodes by hostname), and in its own mount namespace where a copy
of /etc/hosts, bind-mounted, resolves the node names (Hydra's mpiexec needs it).
Nothing outside the cluster's folder is written; every Slurm command finds the
configuration through ``SLURM_CONF``.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager

DAEMON_STOP_S = 10


def slurm_installed():
    """True when the Slurm and munge daemons are on PATH."""
    return all(shutil.which(name) for name in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo"))


def namespaces_allowed():
    """True when this process may make UTS and mount namespaces (root with CAP_SYS_ADMIN)."""
    try:
        return subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def free_ports(count):
    """``count`` distinct TCP ports that are free now on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


SLURM_CONF = """\
ClusterName=mlscaletest
SlurmctldHost={controller}(127.0.0.1)
SlurmctldPort={controller_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool-%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmi2
MailProg=/bin/true
SlurmdParameters=config_overrides
ReturnToService=2
"""


class SlurmCluster:
    """munged + slurmctld + one slurmd per node name, all under ``workdir``.

    Parameters
    ----------
    workdir : str
        An empty folder, made world-readable so that the ``munge`` user can reach its socket;
        every parent folder must be searchable by ``munge`` too.
    nodes : sequence of str
        Node names; each gets ``cpus`` CPUs (more than the machine has is allowed).
    """

    def __init__(self, workdir, nodes=("n1", "n2"), cpus=2):
        self.base = os.path.abspath(workdir)
        self.nodes = tuple(nodes)
        self.cpus = cpus
        self.conf = os.path.join(self.base, "slurm.conf")
        self.munge_dir = os.path.join(self.base, "munge")
        self.processes = []
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def _spawn(self, name, command, **options):
        log = open(os.path.join(self.base, f"{name}.out"), "w")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                   start_new_session=True, **options)
        log.close()
        self.processes.append((name, process))

    def _start_munge(self):
        munge = pwd.getpwnam("munge")
        os.makedirs(self.munge_dir)
        key = os.path.join(self.munge_dir, "munge.key")
        shutil.copyfile("/etc/munge/munge.key", key)
        for path in (self.munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.chmod(self.munge_dir, 0o755)
        os.chmod(key, 0o600)
        self._spawn("munged", [
            "munged", "--foreground", f"--socket={self.munge_dir}/munge.socket", f"--key-file={key}",
            f"--pid-file={self.munge_dir}/munged.pid", f"--log-file={self.munge_dir}/munged.log",
            f"--seed-file={self.munge_dir}/munged.seed",
        ], user=munge.pw_uid, group=munge.pw_gid, extra_groups=[])
        self._wait_for(lambda: os.path.exists(f"{self.munge_dir}/munge.socket"), 10, "munged did not start")

    def _write_conf(self):
        ports = free_ports(1 + len(self.nodes))
        lines = [SLURM_CONF.format(controller=socket.gethostname(), controller_port=ports[0], base=self.base,
                                   munge_socket=f"{self.munge_dir}/munge.socket")]
        for name, port in zip(self.nodes, ports[1:]):
            lines.append(f"NodeName={name} NodeHostname={name} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN\n")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP\n")
        with open(self.conf, "w") as handle:
            handle.write("".join(lines))
        os.makedirs(os.path.join(self.base, "state"))

    def _write_hosts(self):
        """A copy of /etc/hosts that also resolves every node name to 127.0.0.1 (seen by the slurmds only)."""
        path = os.path.join(self.base, "hosts")
        with open("/etc/hosts") as original, open(path, "w") as hosts:
            hosts.write(original.read().rstrip("\n") + f"\n127.0.0.1 {' '.join(self.nodes)}\n")
        return path

    def start(self, timeout=60):
        """Start every daemon and wait (at most ``timeout`` s) until all nodes are idle."""
        os.chmod(self.base, 0o755)
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        hosts = self._write_hosts()
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", ["unshare", "--uts", "--mount", "sh", "-c",
                                           'mount --bind "$1" /etc/hosts && hostname "$0" && exec slurmd -D -N "$0"',
                                           name, hosts])
        self._wait_for(self._all_idle, timeout, "the Slurm nodes did not reach idle")

    def _all_idle(self):
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
        states = done.stdout.split()
        return done.returncode == 0 and len(states) == len(self.nodes) and set(states) == {"idle"}

    def _wait_for(self, condition, timeout, message):
        deadline = time.monotonic() + timeout
        while not condition():
            dead = [name for name, process in self.processes if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{message} within {timeout} s (daemons exited: {dead or 'none'}); "
                                   f"their logs end: {self.logs_tail()}")
            time.sleep(0.2)

    def logs_tail(self, lines=5):
        """The last lines of every daemon's log, as one string (for failure messages)."""
        parts = []
        for name in sorted(os.listdir(self.base)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.base, name), errors="replace") as handle:
                    parts.append(f"[{name}] " + " | ".join(handle.read().splitlines()[-lines:]))
        return " ".join(parts)

    def stop(self, quiet_timeout=15):
        """Stop every daemon this object started, by PID, newest first; then any leftover job step.

        Cancels the jobs still queued (a failed test leaves some) and waits, bounded,
        until the nodes are idle, so that the step daemons can report to the
        controller and exit; each daemon gets SIGTERM, then SIGKILL after
        `DAEMON_STOP_S`. A step daemon left behind (``slurmstepd`` double-forks
        away from ``slurmd``) is found by this cluster's own ``SLURM_CONF`` in its
        environment and killed by PID.
        """
        if self.processes and all(process.poll() is None for _, process in self.processes):
            queued = self.run("squeue", "-h", "-o", "%i").stdout.split()
            if queued:
                self.run("scancel", *queued)
            deadline = time.monotonic() + quiet_timeout
            while time.monotonic() < deadline and not (self._all_idle() and not self.run("squeue", "-h").stdout):
                time.sleep(0.2)
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(DAEMON_STOP_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes = []
        for pid in self._leftover_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue

    def _leftover_pids(self):
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as handle:
                        if marker in handle.read().split(b"\0"):
                            found.append(int(entry))
                except OSError:
                    continue
        return found

    def run(self, *command, **options):
        """Run a Slurm client command against this cluster; return the CompletedProcess (text)."""
        return subprocess.run(list(command), capture_output=True, text=True, env=self.env, **options)

    def wait_for_job(self, job_id, timeout):
        """Poll ``squeue -h -j JOB`` until the job has left the queue; raise with its state after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.run("squeue", "-h", "-j", job_id, "-o", "%T %r")
            if done.returncode != 0 and "Invalid job id" not in done.stderr:
                raise RuntimeError(f"squeue -j {job_id} failed: {done.stderr.strip()}")
            state = done.stdout.strip()
            if not state:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still in the queue after {timeout} s (state, reason: {state})")
            time.sleep(0.5)


@contextmanager
def running_cluster(**options):
    """A started `SlurmCluster` in a fresh folder under the system temp dir; stopped and removed on exit.

    The folder is not pytest's ``tmp_path``: the ``munge`` user must reach its socket,
    and pytest's folders are private to root.
    """
    cluster = SlurmCluster(tempfile.mkdtemp(prefix="mlscale-slurm-"), **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base, ignore_errors=True)
