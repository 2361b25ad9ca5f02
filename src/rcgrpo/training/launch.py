"""The torchrun agent of a multi-process stage, and what each of its ranks does first.

`python -m rcgrpo.training.launch <torchrun options> -m rcgrpo.cli stage STAGE ...` is torchrun
(torch.distributed.run) with one rendezvous of ours, `rcgrpo-static` (`torchrun_args` builds the
options from the run's plan):

  * torch's static rendezvous underneath: node K's ranks are K x procs + local rank, so global
    rank 0, which logs and saves, is on node 0; its store carries JSON only. The c10d one behind
    `torchrun --standalone` unpickles the rendezvous state it reads back from its store, so
    whoever reaches the store runs code in the agent;
  * the store listens on a socket bound here and handed to it (TCPStore `master_listen_fd`): on
    one node 127.0.0.1 on a port the kernel picks at once (torch's own binds every interface),
    on several the address of `--rdzv-endpoint`'s host only. Whoever reaches it still cannot
    train with us: every rank proves the run's secret first (rcgrpo.training.rendezvous).

Nothing outlives the command. rcgrpo.tracking.stage runs this agent under the guard of
rcgrpo.procs (SIGTERM to its group when the command dies or is stopped, SIGKILL after the
guard's grace); on a signal the agent stops its ranks, SIGKILL after SHUTDOWN_S (torch waits
30 s by default); and each rank asks the kernel for SIGKILL when the agent dies (`as_rank`,
PR_SET_PDEATHSIG), since torch starts ranks in sessions of their own that no group signal
reaches: a killed agent leaves no rank training behind it.

    python -m rcgrpo.training.launch --nnodes 1 --node-rank 0 ... -m rcgrpo.cli stage rl ...
    .venv/bin/pytest tests/test_rendezvous.py -q
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from rcgrpo.procs import port_owner, set_parent_death_signal

BACKEND = "rcgrpo-static"
AGENT_PID = "RCGRPO_AGENT_PID"  # set by the agent for its ranks (`as_rank`)
SHUTDOWN_S = 3  # a signalled agent: SIGTERM to its ranks, SIGKILL to those left after this


def torchrun_args(nodes: int, node_rank: int, endpoint: str, procs: int) -> list[str]:
    """The agent's torchrun options for node `node_rank` of `nodes` (endpoint HOST:PORT of node
    0 when nodes > 1; one node: 127.0.0.1 on a free port)."""
    where = "127.0.0.1:0" if nodes == 1 else endpoint
    return [
        *("--nnodes", str(nodes), "--nproc-per-node", str(procs)),
        *("--rdzv-backend", BACKEND, "--rdzv-endpoint", where, "--rdzv-conf", f"rank={node_rank}"),
        *("--max-restarts", "0", "--shutdown-timeout", str(SHUTDOWN_S)),
    ]


def listen(host: str, port: int) -> socket.socket:
    """The rendezvous store's socket, listening on host:port (port 0: one the kernel picks)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise RuntimeError(f"rendezvous host {host!r}: {e}") from None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
            sock.listen(2048)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise RuntimeError(
        f"node 0 cannot listen on {host}:{port} for the rendezvous ({error.strerror}"
        + (f"; held by {port_owner(port)})" if port else ")")
    )


def _handler(params):
    """torch's static rendezvous, its store on a socket `listen` bound (see the module)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import (
        StaticTCPRendezvous,
        create_rdzv_handler,
    )

    params.config["rank"] = int(params.config["rank"])
    static = create_rdzv_handler(params)

    class Ours(StaticTCPRendezvous):
        def get_backend(self) -> str:
            return BACKEND

        def next_rendezvous(self):
            if self._store is None:
                fd = None
                if self.rank == 0:  # node 0 hosts the store
                    sock = listen(self.master_addr, self.master_port)
                    self.master_port = sock.getsockname()[1]
                    fd = sock.detach()  # the store owns it from here
                self._store = TCPStore(
                    self.master_addr,
                    self.master_port,
                    self.world_size,
                    self.rank == 0,
                    self.timeout,
                    multi_tenant=True,
                    master_listen_fd=fd,
                )
            return super().next_rendezvous()

    return Ours(
        static.master_addr,
        static.master_port,
        static.rank,
        static.world_size,
        static.run_id,
        int(static.timeout.total_seconds()),
    )


def main(argv: list[str] | None = None) -> None:
    """torchrun with the `rcgrpo-static` rendezvous; ranks learn this agent's pid."""
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)  # the guard above never dies first, unless killed
    if os.getppid() != parent:
        sys.exit("rcgrpo launch: its parent died before it started")
    os.environ[AGENT_PID] = str(os.getpid())
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import main as torchrun

    rendezvous_handler_registry.register(BACKEND, _handler)
    torchrun(argv)


def as_rank() -> None:
    """First thing in a rank this agent started: SIGKILL from the kernel when the agent dies,
    and an exit at once if it is already gone (the rank then has nobody to report to)."""
    agent = os.environ.get(AGENT_PID)
    if not agent:
        return
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != int(agent):
        sys.exit(f"rcgrpo: rank {os.environ.get('RANK')}: its torchrun agent is gone")


if __name__ == "__main__":
    main()
