"""Every rank of a multi-process stage proves the run's secret before training starts.

torch.distributed authenticates nothing: any process that reaches the rendezvous can join as a
rank (a fake "node 1" did, and ran code in node 0's rank 0 through the pickles ranks used to
swap). So each launch gets a secret: node 0 writes 32 random bytes, mode 0600, into the stage's
out_dir (`write_secret`, before its torchrun agent starts; the out_dir is the folder every node
shares), every rank learns where from RCGRPO_RUN_SECRET, and right after the process group
forms, before any other exchange, the ranks run a challenge (`prove`):

  1. every rank draws 16 random bytes; all_gather: the challenge is all of them, in rank order;
  2. every rank sends HMAC-SHA256(secret, challenge || its rank) (or a flag saying it has no
     secret); all_gather;
  3. every rank checks every other rank's tag: one that lacks the secret or sends a wrong tag
     fails the stage on every rank in one line (`Refused`), naming it.

The secret itself never crosses the wire, and a tag is bound to this challenge and this rank:
a member cannot replay another's. What it does not give: the traffic between ranks (gradients,
rollouts) is not authenticated afterwards, so the network between nodes must be one you trust
for integrity; a member without the secret is kept out, a man in the middle is not.

    path = write_secret(out_dir)       # node 0, before its agent starts
    prove(accelerator.device)          # every rank, right after init_process_group
    .venv/bin/pytest tests/test_rendezvous.py -q
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

SECRET_ENV = "RCGRPO_RUN_SECRET"  # the secret file's path, set by the launch for its ranks
SECRET_FILE = ".rendezvous-secret"  # in the stage's out_dir
NONCE = 16  # bytes each rank adds to the challenge
TAG = 32  # HMAC-SHA256


class Refused(RuntimeError):
    """A rank without this run's secret: the stage stops on every rank, in one line."""


def write_secret(out_dir: str | Path) -> Path:
    """A fresh secret in <out_dir>/.rendezvous-secret (0600 from the first byte, swapped in
    whole: a node reading it never sees half of one); its path."""
    path = Path(out_dir) / SECRET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{SECRET_FILE}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.replace(tmp, path)
    return path


def read_secret(path: str | Path | None) -> bytes | None:
    """The secret in `path`, None if there is none this process may read."""
    if not path:
        return None
    try:
        return Path(path).read_bytes().strip() or None
    except OSError:
        return None


def tag(secret: bytes, challenge: bytes, rank: int) -> bytes:
    """HMAC-SHA256(secret, challenge || rank as 4 bytes): what rank `rank` sends."""
    return hmac.new(secret, challenge + rank.to_bytes(4, "big"), hashlib.sha256).digest()


def verdict(challenge: bytes, sent: list[bytes], secret: bytes, me: int, node_of) -> str | None:
    """None if every rank but `me` sent its valid tag (`sent[r]`: a flag byte, 1 = has a secret,
    then the tag), else the line naming the first that did not; `node_of(rank)` its node."""
    for rank, answer in enumerate(sent):
        if rank == me:
            continue
        where = f"rank {rank} of {len(sent)} (node {node_of(rank)})"
        if answer[:1] != b"\x01":
            return (
                f"{where} joined without this run's secret: refused (node 0 writes it into the "
                "stage's out_dir, which every node must share)"
            )
        if not hmac.compare_digest(answer[1:], tag(secret, challenge, rank)):
            return (
                f"{where} did not prove this run's secret: refused (a process that does not hold "
                f"the out_dir's {SECRET_FILE} joined the rendezvous)"
            )
    return None


def prove(device) -> None:
    """The challenge of the module doc on the default process group (tensors on `device`, the
    backend's); Refused on every rank if any rank fails it, or if this one has no secret."""
    import torch.distributed as dist

    from rcgrpo.training.rank_bytes import all_gather_bytes

    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.environ.get(SECRET_ENV)
    secret = read_secret(path)
    nonces = all_gather_bytes(os.urandom(NONCE), world, device, limit=NONCE)
    challenge = b"".join(nonces)
    mine = b"\x01" + tag(secret, challenge, rank) if secret else b"\x00" * (TAG + 1)
    sent = all_gather_bytes(mine, world, device, limit=TAG + 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) or 1
    if secret is None:
        raise Refused(
            f"rank {rank}: no secret of this run at {path or f'${SECRET_ENV} (unset)'}: refused "
            "(start ranks with `rcgrpo stage NAME --procs N` / `--nnodes N`, whose node 0 writes it "
            "into the stage's out_dir, a folder every node must share)"
        )
    if line := verdict(challenge, sent, secret, rank, lambda r: r // local):
        raise Refused(line)
