"""The accounts of the images, which the spec's users and groups may not reuse (standard library only).

The entrypoints merge the spec's users and groups into each image's ``/etc/passwd`` and
``/etc/group``: a spec group ``slurm`` would put its members into SlurmUser's group, a uid 64030
would own SlurmUser's files. ``tests/integration/test_image_accounts.py`` reads every image's files
against these tables.
"""

from __future__ import annotations

SLURM_UID = 64030  # SlurmUser in every image (images/Dockerfile)
REST_UID = 6820  # the slurmrestd user of its image: slurmrestd refuses root and SlurmUser
AGENT_UID = 65532  # the login agent runs as this unprivileged user (no user of the cluster has it)

# Debian trixie's base accounts, munge, sshd (login), slurm, slurmrestd (its image), mysql (mariadb)
IMAGE_USERS: dict[str, int] = {
    "root": 0, "daemon": 1, "bin": 2, "sys": 3, "sync": 4, "games": 5, "man": 6, "lp": 7, "mail": 8, "news": 9,
    "uucp": 10, "proxy": 13, "www-data": 33, "backup": 34, "list": 38, "irc": 39, "_apt": 42, "munge": 100,
    "sshd": 999, "slurmrestd": REST_UID, "slurm": SLURM_UID, "mysql": 64031, "nobody": 65534,
}
IMAGE_GROUPS: dict[str, int] = {
    "root": 0, "daemon": 1, "bin": 2, "sys": 3, "adm": 4, "tty": 5, "disk": 6, "lp": 7, "mail": 8, "news": 9,
    "uucp": 10, "man": 12, "proxy": 13, "kmem": 15, "dialout": 20, "fax": 21, "voice": 22, "cdrom": 24,
    "floppy": 25, "tape": 26, "sudo": 27, "audio": 29, "dip": 30, "www-data": 33, "backup": 34, "operator": 37,
    "list": 38, "irc": 39, "src": 40, "shadow": 42, "utmp": 43, "video": 44, "sasl": 45, "plugdev": 46,
    "staff": 50, "games": 60, "users": 100, "munge": 101, "rdma": 102, "_ssh": 103, "slurmrestd": REST_UID,
    "slurm": SLURM_UID, "mysql": 64031, "nogroup": 65534,
}
# ids no spec user or group may have: the images' and the login agent's
RESERVED_IDS: frozenset[int] = frozenset({*IMAGE_USERS.values(), *IMAGE_GROUPS.values(), AGENT_UID})


def reserved_ids_named(at_least: int = 1000) -> str:
    """The reserved ids from `at_least` up, each with its accounts' names ("slurm 64030, ...,
    nobody/nogroup 65534"), for an error that says which to avoid."""
    owners: dict[int, list[str]] = {AGENT_UID: ["the login agent"]}
    for table in (IMAGE_USERS, IMAGE_GROUPS):
        for name, xid in table.items():
            if name not in owners.setdefault(xid, []):
                owners[xid].append(name)
    return ", ".join(f"{'/'.join(owners[xid])} {xid}" for xid in sorted(RESERVED_IDS) if xid >= at_least)
