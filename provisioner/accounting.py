"""Keep Slurm's accounting database in step with the spec: the cluster, its accounts (with fairshare)
and one association per user.

Runs in the slurmctld pod (container ``accounting``, as SlurmUser, who is a Slurm administrator)
as ``slurmk8s-accounting``: every period it reads the associations with ``sacctmgr show``, plans
the difference (:func:`plan`, pure) and applies it with ``sacctmgr -i``. Idempotent: a spec that
matches the database plans nothing, so re-running ``slurmk8s up`` changes nothing.

slurmctld's copy: slurmdbd passes each change on to slurmctld, whose association manager charges a
job to its user's account. After a pass that leaves the database in step, the loop asks slurmctld
(``scontrol show assoc_mgr``) whether it has every spec user's association, in the spec's account,
with the user's uid resolved. Once (at a fresh cluster's start, cause unknown) slurmctld still
lacked a user's association 30 s after the database had it, and that user's job was charged to no
account. A user missing for ``CONTROLLER_GRACE`` seconds gets slurmctld told ``scontrol
reconfigure`` (24.11 re-executes slurmctld, which keeps its jobs and loads the associations from
slurmdbd again), at most one attempt per ``RELOAD_COOLDOWN``.

What a removal means: a user dropped from the spec loses their association (``sacctmgr delete
user``); Slurm keeps the jobs they ran, so ``sacct`` still lists them. Accounts dropped from the
spec go the same way once no spec user is in them. The ``root`` account and ``root`` user that
Slurm makes with every cluster are never touched.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Protocol, Sequence

from .errors import SlurmK8sError
from .logs import Log

DEFAULT_PERIOD = 30.0
RETRY_PERIOD = 2.0
SACCTMGR = "sacctmgr"
SCONTROL = "scontrol"
NO_VAL_UID = "4294967294"  # how slurmctld shows a uid it could not resolve
CONTROLLER_GRACE = 10.0  # seconds slurmctld may lag behind the database before it is told to reload
RELOAD_COOLDOWN = 300.0  # seconds between two reloads of a slurmctld that stays behind
PROTECTED_ACCOUNTS = frozenset({"root"})
PROTECTED_USERS = frozenset({"root"})


class Cause(str, Enum):
    CLUSTER_MISSING = "cluster-missing"
    ACCOUNT_MISSING = "account-missing"
    FAIRSHARE_CHANGED = "fairshare-changed"
    USER_MISSING = "user-missing"
    USER_MOVED = "user-moved"
    USER_REMOVED_FROM_SPEC = "user-removed-from-spec"
    ACCOUNT_REMOVED_FROM_SPEC = "account-removed-from-spec"


@dataclass(frozen=True)
class Desired:
    """What the spec asks for: account -> (fairshare, description); user -> account."""

    cluster: str
    accounts: Mapping[str, tuple[int, str]]
    users: Mapping[str, str]

    @classmethod
    def from_spec(cls, spec: Any) -> "Desired":
        acc = spec.accounting
        return cls(
            cluster=spec.slurm_cluster_name,
            accounts={a.name: (a.fairshare, a.description or a.name) for a in acc.accounts},
            users={u.name: spec.user_account(u) for u in spec.users},
        )


@dataclass(frozen=True)
class Association:
    account: str
    user: str  # "" for the account's own association
    fairshare: int | None  # None: "parent" (or not a number)


@dataclass(frozen=True)
class Current:
    cluster_exists: bool
    associations: tuple[Association, ...] = ()

    def accounts(self) -> dict[str, Association]:
        return {a.account: a for a in self.associations if not a.user}

    def users(self) -> dict[str, list[Association]]:
        out: dict[str, list[Association]] = {}
        for a in self.associations:
            if a.user:
                out.setdefault(a.user, []).append(a)
        return out


@dataclass(frozen=True)
class Action:
    argv: tuple[str, ...]  # sacctmgr arguments after `sacctmgr -i`
    cause: Cause
    detail: str

    def describe(self) -> str:
        return f"{self.cause.value}: {self.detail}"


def plan(desired: Desired, current: Current) -> list[Action]:
    """The sacctmgr commands that make the database match the spec, in a safe order: cluster, accounts,
    users added or moved, then users and accounts removed."""
    c = desired.cluster
    actions: list[Action] = []
    if not current.cluster_exists:
        actions.append(Action(("add", "cluster", c), Cause.CLUSTER_MISSING, f"cluster {c}"))
    have_accounts = current.accounts() if current.cluster_exists else {}
    for name, (share, text) in sorted(desired.accounts.items()):
        have = have_accounts.get(name)
        if have is None:
            actions.append(Action(("add", "account", name, f"cluster={c}", "parent=root", f"fairshare={share}",
                                   f"description={text}", f"organization={name}"),
                                  Cause.ACCOUNT_MISSING, f"account {name} (fairshare {share})"))
        elif have.fairshare != share:
            actions.append(Action(("modify", "account", "where", f"name={name}", f"cluster={c}", "set",
                                   f"fairshare={share}"),
                                  Cause.FAIRSHARE_CHANGED, f"account {name}: fairshare {have.fairshare} -> {share}"))
    have_users = current.users() if current.cluster_exists else {}
    removals: list[Action] = []
    for user, account in sorted(desired.users.items()):
        accounts = {a.account for a in have_users.get(user, [])}
        if account not in accounts:
            cause = Cause.USER_MOVED if accounts else Cause.USER_MISSING
            actions.append(Action(("add", "user", user, f"account={account}", f"defaultaccount={account}",
                                   f"cluster={c}"), cause, f"user {user} in account {account}"))
            if accounts:  # a user's default association cannot be deleted: make the new one default first
                actions.append(Action(("modify", "user", "where", f"name={user}", f"cluster={c}", "set",
                                       f"defaultaccount={account}"), Cause.USER_MOVED,
                                      f"user {user}: default account {account}"))
        for old in sorted(accounts - {account}):
            removals.append(Action(("delete", "user", "where", f"name={user}", f"account={old}", f"cluster={c}"),
                                   Cause.USER_MOVED, f"user {user} leaves account {old}"))
    for user in sorted(set(have_users) - set(desired.users) - PROTECTED_USERS):
        removals.append(Action(("delete", "user", "where", f"name={user}", f"cluster={c}"),
                               Cause.USER_REMOVED_FROM_SPEC, f"user {user} (their jobs stay in the history)"))
    for name in sorted(set(have_accounts) - set(desired.accounts) - PROTECTED_ACCOUNTS):
        removals.append(Action(("delete", "account", "where", f"name={name}", f"cluster={c}"),
                               Cause.ACCOUNT_REMOVED_FROM_SPEC, f"account {name}"))
    return actions + removals


# ---------------------------------------------------------------- reading the database


ASSOC_FORMAT = "Account,User,Share"


def parse_associations(text: str) -> tuple[Association, ...]:
    """`sacctmgr -n -P show associations cluster=C format=Account,User,Share` -> associations."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 3:
            raise ValueError(f"unexpected sacctmgr line {line!r} (want Account|User|Share)")
        account, user, share = parts[0].strip(), parts[1].strip(), parts[2].strip()
        out.append(Association(account, user, int(share) if share.isdigit() else None))
    return tuple(sorted(out, key=lambda a: (a.account, a.user)))


def parse_clusters(text: str) -> set[str]:
    """`sacctmgr -n -P show clusters format=Cluster` -> cluster names."""
    return {line.strip() for line in text.splitlines() if line.strip()}


class SacctmgrError(SlurmK8sError):
    pass


class Database(Protocol):
    def read(self, cluster: str) -> Current: ...

    def apply(self, action: Action) -> str: ...


def _run_tool(name: str, exe: str, argv: Sequence[str], timeout: float) -> str:
    """Run a Slurm command (argv list, bounded by `timeout`): its stdout, or SacctmgrError saying
    what failed with the last lines it printed."""
    try:
        proc = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SacctmgrError(f"{name} {' '.join(argv)}: {err}") from None
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise SacctmgrError(f"{name} {' '.join(argv)}: exit {proc.returncode}: {' '.join(msg[-3:])}")
    return proc.stdout


@dataclass
class Sacctmgr:
    """The real database, through sacctmgr (argv lists, parsable output with named columns, bounded by a
    timeout)."""

    exe: str = SACCTMGR
    timeout: float = 30.0

    def _run(self, argv: Sequence[str]) -> str:
        return _run_tool("sacctmgr", self.exe, argv, self.timeout)

    def read(self, cluster: str) -> Current:
        if cluster not in parse_clusters(self._run(["-n", "-P", "show", "clusters", "format=Cluster"])):
            return Current(cluster_exists=False)
        text = self._run(["-n", "-P", "show", "associations", f"cluster={cluster}", f"format={ASSOC_FORMAT}"])
        return Current(cluster_exists=True, associations=parse_associations(text))

    def apply(self, action: Action) -> str:
        return self._run(["-i", *action.argv]).strip()


@dataclass(frozen=True)
class SyncResult:
    applied: tuple[Action, ...]
    failed: tuple[tuple[Action, str], ...]

    @property
    def ok(self) -> bool:
        return not self.failed


def sync(desired: Desired, db: Database) -> SyncResult:
    """One pass: read, plan, apply each action (a failed one is reported and retried next pass)."""
    applied: list[Action] = []
    failed: list[tuple[Action, str]] = []
    for action in plan(desired, db.read(desired.cluster)):
        if failed and action.argv[0] == "delete":
            break  # removals come last, users before their accounts: after a refused one, wait a pass
        try:
            db.apply(action)
            applied.append(action)
        except SacctmgrError as err:
            failed.append((action, str(err)))
    return SyncResult(tuple(applied), tuple(failed))


# ---------------------------------------------------------------- slurmctld's copy of the associations


def parse_known_associations(text: str) -> set[tuple[str, str]]:
    """`scontrol show assoc_mgr flags=assoc` -> (user, account) of each user association whose uid
    slurmctld resolved (an unresolved one matches no job)."""
    found = set()
    for line in text.splitlines():
        m = re.search(r"\bAccount=(\S*) UserName=([^\s(]+)\((\d+)\)", line)
        if m and m.group(3) != NO_VAL_UID:
            found.add((m.group(2), m.group(1)))
    return found


class Controller(Protocol):
    def known_associations(self) -> set[tuple[str, str]]: ...

    def reload(self) -> None: ...


@dataclass
class Scontrol:
    """slurmctld, through scontrol (as SlurmUser, an administrator)."""

    exe: str = SCONTROL
    timeout: float = 30.0

    def _run(self, argv: Sequence[str]) -> str:
        return _run_tool("scontrol", self.exe, argv, self.timeout)

    def known_associations(self) -> set[tuple[str, str]]:
        # every association, filtered here: a users= list could outgrow the argument limit
        return parse_known_associations(self._run(["show", "assoc_mgr", "flags=assoc"]))

    def reload(self) -> None:
        self._run(["reconfigure"])


@dataclass
class ControllerWatch:
    """Whether slurmctld has every spec user's association (in the spec's account), and when to
    tell it to reload them: a user missing for `grace` seconds (slurmdbd's push normally takes well
    under one), at most one reload attempt per `cooldown`."""

    grace: float = CONTROLLER_GRACE
    cooldown: float = RELOAD_COOLDOWN
    missing_since: dict[str, float] = field(default_factory=dict)  # user -> first seen missing
    reloaded_at: float | None = None  # the last attempt, failed or not
    last_error: str = ""  # logged once, not every pass

    def forget(self) -> None:
        """slurmctld did not answer (starting, reconfiguring): its lag is measured afresh."""
        self.missing_since.clear()

    def check(self, users: Mapping[str, str], ctl: Controller, now: float) -> tuple[list[str], str]:
        """One look after a pass that left the database in step (`users`: user -> account): (the
        users slurmctld lacks, what to log: '' when nothing is new). Raises SacctmgrError when
        slurmctld does not answer or refuses the reload."""
        known = ctl.known_associations() if users else set()
        missing = sorted(u for u, account in users.items() if (u, account) not in known)
        caught_up = bool(self.missing_since) and not missing
        self.missing_since = {u: self.missing_since.get(u, now) for u in missing}
        if caught_up:
            return [], "slurmctld has every user's association"
        late = [u for u in missing if now - self.missing_since[u] >= self.grace]
        if not late or (self.reloaded_at is not None and now - self.reloaded_at < self.cooldown):
            return missing, ""
        self.reloaded_at = now  # before the call: a reload that fails waits out the cooldown too
        behind = max(now - self.missing_since[u] for u in late)
        try:
            ctl.reload()
        except SacctmgrError as err:
            raise SacctmgrError(f"slurmctld lacks the association of {', '.join(late)}; its reload failed: {err}") \
                from None
        return missing, (f"slurmctld lacks the association of {', '.join(late)} {behind:.0f}s after the database "
                         "had it (their jobs would be charged to no account): scontrol reconfigure (slurmctld loads "
                         "the associations from slurmdbd again)")

    def hurry(self) -> bool:
        """Look again soon: a user is missing and no reload was tried for them yet."""
        return bool(self.missing_since) and (self.reloaded_at is None or
                                             self.reloaded_at < min(self.missing_since.values()))


# ---------------------------------------------------------------- entry point


@functools.cache
def _logger() -> Log:
    return Log("slurmk8s-accounting", stream=sys.stdout)


def _log(msg: str) -> None:
    _logger().write(msg)


def load_desired(spec_path: str) -> Desired:
    from .config import parse_spec

    with open(spec_path) as fh:
        return Desired.from_spec(parse_spec(json.load(fh), source=spec_path))


def _check_controller(watch: ControllerWatch, users: Mapping[str, str], ctl: Controller) -> None:
    try:
        _, note = watch.check(users, ctl, time.monotonic())
    except SacctmgrError as err:
        watch.forget()
        if str(err) != watch.last_error:
            _log(f"slurmctld's associations not checked (again next pass): {err}")
        watch.last_error = str(err)
        return
    watch.last_error = ""
    if note:
        _log(note)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slurmk8s-accounting", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="/etc/slurmk8s/spec/spec.json", help="the cluster spec (JSON)")
    parser.add_argument("--period", type=float, default=DEFAULT_PERIOD, help="seconds between passes")
    parser.add_argument("--once", action="store_true", help="one pass; exit 1 if slurmdbd is away or a change failed")
    parser.add_argument("--wait-config", metavar="DIR", default="",
                        help="wait until the slurmctld container has filled the configuration directory DIR "
                             "(DIR/.ready) first: sacctmgr and scontrol read it (the slurmctld pod's containers)")
    args = parser.parse_args(argv)
    if args.wait_config:
        from .livenodes.ready import wait_for_config

        wait_for_config(args.wait_config, _log)
    db, ctl, watch = Sacctmgr(), Scontrol(), ControllerWatch()
    waiting_since: float | None = None
    in_step = False
    synced_once = False
    while True:
        try:
            desired = load_desired(args.spec)
            result = sync(desired, db)
        except (OSError, ValueError) as err:
            _log(f"cannot read the spec {args.spec}: {err}")
            result = None
        except SacctmgrError as err:
            # slurmdbd is not answering (starting, or the control tier is waking): slurmctld queues
            # job records meanwhile; try again next period
            if waiting_since is None:
                waiting_since = time.monotonic()
                _log(f"waiting for slurmdbd: {err}")
            result = None
        if result is not None:
            if waiting_since is not None:
                _log(f"slurmdbd answers after {time.monotonic() - waiting_since:.0f}s")
                waiting_since = None
            for action in result.applied:
                _log(f"applied {action.describe()}: sacctmgr -i {' '.join(action.argv)}")
            for action, why in result.failed:
                _log(f"FAILED {action.describe()} (retried next pass): {why}")
            if result.ok and (result.applied or not in_step):
                _log(f"database matches the spec (cluster {desired.cluster}, {len(desired.accounts)} account(s), "
                     f"{len(desired.users)} user(s))")
            in_step = result.ok
            synced_once = synced_once or result.ok
            if result.ok and not args.once:  # --once: the database only (no slurmctld need answer)
                _check_controller(watch, desired.users, ctl)
        if args.once:
            return 0 if result is not None and result.ok else 1
        # until the database first matches the spec, and while slurmctld lags behind it, try again
        # soon: jobs submitted before slurmctld has a user's association are charged to no account
        time.sleep(args.period if synced_once and not watch.hurry() else min(args.period, RETRY_PERIOD))


if __name__ == "__main__":
    sys.exit(main())
