"""The programs' side of the warm socket (warm.py serves it in the reconcile loop): where it is, one
call with its reply, one call handed over without waiting. Standard library only (and the package's
settings), imported by every program Slurm starts (the prolog for every job) and by nothing of the loop's side.

Protocol: one JSON object per line each way, one call per connection.
  request  {"program": "resume"|"suspend"|"resume-fail", "args": [...], "pid": N, "resume_file": text|null}
  reply    {"code": N}
"""

from __future__ import annotations

import json
import os
import socket
from typing import Mapping, Sequence

from .. import settings
from ..settings import Programs

DEFAULT_SOCKET: str = settings.default(settings.PROGRAM_SOCKET)
CONNECT_TIMEOUT = 1.0  # seconds: a loop that does not accept within this is not serving
MAX_REQUEST = 4 << 20  # bytes: a resume file of a few thousand jobs and nodes is well under this


class NotServed(Exception):
    """The warm path did not run the call (or may not have finished it): run it in this process."""


def socket_path(env: Mapping[str, str]) -> str:
    """The socket's path; '' when the warm path is turned off (SLURMK8S_PROGRAM_SOCKET=)."""
    return Programs.from_env(env).program_socket


# ---------------------------------------------------------------- the program's side


def _request(program: str, args: Sequence[str], resume_file: str | None) -> bytes:
    """One call, as the protocol line the loop reads (module docstring)."""
    return json.dumps({"program": program, "args": list(args), "pid": os.getpid(),
                       "resume_file": resume_file}).encode() + b"\n"


def delegate(path: str, program: str, args: Sequence[str], resume_file: str | None) -> int:
    """Have the loop at `path` run `program args`; its exit code. Raises NotServed (with the
    reason, '' when no loop serves at all) when the caller must run it itself."""
    if not path:
        raise NotServed("")
    request = _request(program, args, resume_file)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT)
        try:
            conn.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NotServed("") from None  # nobody listens: the usual case without a loop
        except OSError as err:
            raise NotServed(f"cannot connect to {path}: {err}") from None
        try:
            conn.sendall(request)
            conn.settimeout(None)  # the run takes what it takes; Slurm bounds it (ResumeTimeout)
            reply = conn.makefile("rb").readline(MAX_REQUEST)
        except OSError as err:
            raise NotServed(f"the reconcile loop dropped the call ({err})") from None
    finally:
        conn.close()
    try:
        return int(json.loads(reply)["code"])
    except (ValueError, KeyError, TypeError):
        raise NotServed("the reconcile loop ended before it answered" if not reply
                        else f"the reconcile loop answered {reply[:200]!r}") from None


def notify(path: str, program: str, args: Sequence[str]) -> bool:
    """Hand the loop a call without waiting for it (PrologSlurmctld's early resume); False when no
    loop takes it."""
    if not path:
        return False
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT)
        conn.connect(path)
        conn.sendall(_request(program, args, None))
        return True
    except OSError:
        return False
    finally:
        conn.close()
