"""The cluster's generated secrets: the Slurm (munge) auth key, the login pod's SSH host keys, the
internal accounting database's password and the JWT key (used with ``rest.enabled``).

Generated once per stack and kept in the stack's configuration as Pulumi secrets (encrypted with the
stack's passphrase), so every ``up`` applies the same keys: the login pod's host key fingerprints
and the auth key stay stable across restarts and updates. The program only reads them
(:func:`secrets_from_config`); :func:`generate` runs in ``slurmk8s up`` (Automation API) or in
``slurmk8s stack-secrets`` for stacks driven by the Pulumi CLI.
"""

from __future__ import annotations

import base64
import os
import secrets as pysecrets
import string
from typing import Any, Mapping

from ..manifests import ClusterSecrets

CONFIG_NAMESPACE = "slurmk8s"
MUNGE_KEY = "mungeKey"
HOST_KEYS = {"ed25519": "sshHostKeyEd25519", "ecdsa": "sshHostKeyEcdsa", "rsa": "sshHostKeyRsa"}
DB_PASSWORD = "accountingDbPassword"  # the internal accounting database's password
JWT_KEY = "jwtKey"  # base64 of the JWT (HS256) key slurmctld and slurmdbd sign and check users' tokens with
SECRET_KEYS = (MUNGE_KEY, *HOST_KEYS.values(), DB_PASSWORD, JWT_KEY)
MUNGE_KEY_BYTES = 1024  # what create-munge-key makes by default
JWT_KEY_BYTES = 64


def _openssh_private(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()


def generate_host_key(kind: str) -> str:
    """A new SSH host private key in OpenSSH format (what sshd -h and ssh-keygen -y read)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if kind == "ed25519":
        return _openssh_private(ed25519.Ed25519PrivateKey.generate())
    if kind == "ecdsa":
        return _openssh_private(ec.generate_private_key(ec.SECP256R1()))
    if kind == "rsa":
        return _openssh_private(rsa.generate_private_key(public_exponent=65537, key_size=3072))
    raise ValueError(f"unknown host key type {kind!r}")


def generate(missing_only: Mapping[str, Any] | None = None) -> dict[str, str]:
    """New values for the secret config keys; with `missing_only`, only for keys not in it."""
    have = missing_only or {}
    out: dict[str, str] = {}
    if MUNGE_KEY not in have:
        out[MUNGE_KEY] = base64.b64encode(os.urandom(MUNGE_KEY_BYTES)).decode()
    for kind, key in HOST_KEYS.items():
        if key not in have:
            out[key] = generate_host_key(kind)
    if DB_PASSWORD not in have:
        # letters and digits only: it goes into SQL and slurmdbd.conf, neither of which may need quoting
        alphabet = string.ascii_letters + string.digits
        out[DB_PASSWORD] = "".join(pysecrets.choice(alphabet) for _ in range(32))
    if JWT_KEY not in have:  # generated for every stack, used once rest.enabled is set
        out[JWT_KEY] = base64.b64encode(os.urandom(JWT_KEY_BYTES)).decode()
    return out


def public_key(private_openssh: str) -> str:
    """'ssh-ed25519 AAAA...' of a private host key (public: fine to show and to export)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private_openssh.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def secrets_from_config(config: Any) -> ClusterSecrets:
    """Read the secrets from a ``pulumi.Config('slurmk8s')`` (as secret outputs)."""
    import pulumi

    try:
        munge = config.require_secret(MUNGE_KEY).apply(lambda v: v.strip())
        host = {kind: config.require_secret(key).apply(pem_text) for kind, key in HOST_KEYS.items()}
        db_password = config.require_secret(DB_PASSWORD).apply(lambda v: v.strip())
        jwt = config.get_secret(JWT_KEY)  # stacks from before the REST API lack it: needed with rest only
    except pulumi.ConfigMissingError as err:
        raise pulumi.RunError(
            f"{err}\nThe cluster's generated keys are missing from this stack's configuration. "
            "`slurmk8s up` creates them; for a stack run by the Pulumi CLI run "
            "`slurmk8s stack-secrets --stack-dir stacks --stack <name>` once."
        ) from None
    return ClusterSecrets(munge_key_b64=munge, ssh_host_keys=host, db_password=db_password,
                          jwt_key_b64=None if jwt is None else jwt.apply(lambda v: v.strip()))


def missing_jwt_key_error() -> str:
    return ("rest.enabled needs the cluster's JWT key, which this stack's configuration lacks (a stack made "
            "before the REST API). `slurmk8s up` creates it; for a stack run by the Pulumi CLI run "
            "`slurmk8s stack-secrets --stack-dir stacks --stack <name>` once.")


def pem_text(value: str) -> str:
    """A key file's text ending in exactly one newline. `pulumi config set` drops the final newline
    of a value, and OpenSSH refuses a private key without it ("error in libcrypto")."""
    return value.strip("\n") + "\n"


def secrets_from_values(values: Mapping[str, str]) -> ClusterSecrets:
    """Plain values (tests, or the Automation API before they reach the config)."""
    return ClusterSecrets(munge_key_b64=values[MUNGE_KEY].strip(),
                          ssh_host_keys={kind: pem_text(values[key]) for kind, key in HOST_KEYS.items()},
                          db_password=values[DB_PASSWORD].strip() if DB_PASSWORD in values else None,
                          jwt_key_b64=values[JWT_KEY].strip() if JWT_KEY in values else None)

