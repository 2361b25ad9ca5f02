"""`rcgrpo ui`: the MLflow UI and the Prefect UI on 127.0.0.1, until Ctrl-C.

Everything it starts stops with it, on every signal (the guard of rcgrpo.procs covers a kill -9);
each server answers its user only (rcgrpo.mlflow_ui, rcgrpo.servers).

    rcgrpo ui                                    # MLflow UI :5000 + Prefect UI :4200
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time

import typer

from rcgrpo.cli.pipeline import _enter_project


class _Stop(Exception):
    """SIGTERM or SIGHUP reached `rcgrpo ui` (SIGINT arrives as KeyboardInterrupt)."""


def _raise_stop(signum, _frame):
    raise _Stop(signal.Signals(signum).name)


def ui(
    mlflow_port: int = typer.Option(5000, help="MLflow UI port on 127.0.0.1"),
    prefect_port: int = typer.Option(4200, help="Prefect server/UI port on 127.0.0.1"),
    timeout: float = typer.Option(180.0, help="seconds to wait for both to answer"),
) -> None:
    """Start the MLflow UI and the Prefect UI on 127.0.0.1 (2-core settings); Ctrl-C stops both.

    Everything it starts stops with it: on SIGINT, SIGTERM or SIGHUP, when either server dies,
    and (through the guard of rcgrpo.procs) when this process is killed outright; the ports are
    free again within ~6 s. A port already taken fails at once naming the process that holds it.
    """
    _enter_project()
    from rcgrpo import mlflow_ui, servers
    from rcgrpo.tracking import registry
    from rcgrpo.tracking import runs as tracking

    if mlflow_port == prefect_port:
        raise servers.ServerError(f"--mlflow-port and --prefect-port are both {mlflow_port}")
    # both ports bound here before either server starts, and held until both stopped: no one
    # else can take one in between (rcgrpo.servers.listen)
    socks = [servers.listen(mlflow_port, "--mlflow-port")]
    try:
        socks.append(servers.listen(prefect_port, "--prefect-port"))
    except servers.ServerError:
        socks[0].close()
        raise
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    typer.echo("starting the MLflow UI and the Prefect server (about 15-30 s on 2 cores) ...")
    started, code = [], 0
    try:
        started.append(mlflow_ui.start_mlflow(tracking.store_dir(), sock=socks[0]))
        started.append(servers.start_prefect(sock=socks[1]))
        servers.wait_ready(started, timeout)
        auth_file = servers.prefect_home() / servers.AUTH_FILE
        secret = tracking.store_dir() / mlflow_ui.PASSWORD_FILE
        login = f"its login: user {mlflow_ui.USER}, the password in {secret}"
        typer.echo(
            f"MLflow UI   {registry.experiment_link(started[0].url)}   (runs, traces; {login})"
        )
        typer.echo(
            f"Prefect UI  {started[1].url}   (flow runs, deployments, schedules; "
            f"its login asks for the password in {auth_file})"
        )
        typer.echo(
            "rcgrpo run, data build and schedule find this Prefect server by themselves (they "
            "send the auth string only to a server running as you)"
        )
        typer.echo(f"logs: {started[0].log.parent}   Ctrl-C stops both", err=False)
        sys.stdout.flush()
        while all(s.proc.poll() is None for s in started):
            time.sleep(0.5)
        dead = [s.name for s in started if s.proc.poll() is not None]
        typer.echo(f"{', '.join(dead)} exited; stopping the rest", err=True)
        code = 1
    except KeyboardInterrupt:
        _say("stopping (SIGINT) ...")
    except _Stop as e:
        _say(f"stopping ({e}) ...")
    except (RuntimeError, TimeoutError) as e:
        _say(str(e), err=True)
        code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the stop short
        for s in started:
            servers.stop(s)
        for sock in socks:  # those no server was started on (stop closed the others)
            sock.close()
    _say("stopped")
    if code:
        raise typer.Exit(code)


def _say(text: str, err: bool = False) -> None:
    """echo that survives a closed terminal (after SIGHUP stdout may be gone)."""
    with contextlib.suppress(OSError):
        typer.echo(text, err=err)
