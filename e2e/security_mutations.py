"""Opt-in pytest plugin: remove each protection right before the test that attacks it.

    pytest --all-tiers -p security_mutations e2e/test_e2e_security.py

(with e2e/ on sys.path, as pytest puts it for the e2e tests). Every test of test_e2e_security.py
but the one that attacks from another namespace (whose control with the cluster's own key already
shows the same) must then FAIL: that is the proof that each test can fail. The session's cluster is
deployed from nothing, so the next ordinary run starts clean again; the removals stay in place for
the rest of this session only.
"""

from __future__ import annotations

import pytest

from helpers import NAMESPACE, kjson, kubectl

SSHD = "/etc/ssh/sshd_config"


def _login_pod() -> str:
    pods = [p for p in kjson("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=login")["items"]
            if not p["metadata"].get("deletionTimestamp")]
    return pods[0]["metadata"]["name"]


def _in_login(script: str) -> None:
    kubectl("exec", "-n", NAMESPACE, _login_pod(), "-c", "login", "--", "bash", "-c", script)


def _sshd_set(option: str, value: str) -> None:
    # sshd re-executes itself with the new configuration on SIGHUP
    _in_login(f"sed -i 's/^{option} .*/{option} {value}/' {SSHD} && kill -HUP $(pgrep -o -x sshd) && sleep 1")


def _token_on_login() -> None:
    kubectl("patch", "deployment", "-n", NAMESPACE, "login", "--type", "merge",
            "-p", '{"spec": {"template": {"spec": {"automountServiceAccountToken": true}}}}')
    kubectl("rollout", "status", "-n", NAMESPACE, "deployment/login", "--timeout=180s", timeout=200)


def _audit_only() -> None:
    kubectl("patch", "validatingadmissionpolicybinding", f"slurmk8s-{NAMESPACE}-worker-pods",
            "--type", "merge", "-p", '{"spec": {"validationActions": ["Audit"]}}')


MUTATIONS = {
    "test_pod_security_admission_refuses_host_and_privileged_pods":
        lambda: kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce-"),
    "test_sshd_offers_public_keys_only":
        lambda: (_sshd_set("PasswordAuthentication", "yes"), _sshd_set("KbdInteractiveAuthentication", "yes")),
    "test_password_login_refused_even_with_a_real_password": lambda: None,  # the one above stays
    "test_root_login_refused_even_with_an_authorized_key": lambda: _sshd_set("PermitRootLogin", "prohibit-password"),
    "test_user_cannot_read_another_home_or_any_secret_on_the_login_pod":
        lambda: _in_login("chmod 0644 /etc/ssh/ssh_host_ed25519_key"),  # (/etc/munge is 0700: a key mode alone is not enough)
    "test_no_api_token_in_login_or_worker_containers": _token_on_login,
    "test_rbac_controller_manages_pods_in_its_own_namespace_only":
        lambda: kubectl("create", "rolebinding", "-n", NAMESPACE, "mutation-edit", "--clusterrole=edit",
                        f"--serviceaccount={NAMESPACE}:slurmctld"),
    # the worker pods' admission policy only audits: the control's check of Deny fails, and the two
    # attacks after it are admitted
    "test_the_controller_account_creates_a_worker_pod_of_the_templates": _audit_only,
    "test_the_controller_account_cannot_create_a_privileged_pod": lambda: None,  # the one above stays
    "test_the_controller_account_cannot_create_a_pod_of_a_foreign_image": lambda: None,
    "test_rbac_other_service_accounts_of_the_namespace_get_nothing_dangerous":
        lambda: kubectl("create", "rolebinding", "-n", NAMESPACE, "mutation-default", "--clusterrole=edit",
                        f"--serviceaccount={NAMESPACE}:default"),
    "test_no_secret_in_any_log_state_output_or_config_map":
        lambda: _in_login("cat /etc/slurmk8s/ssh-host-keys/ssh_host_ed25519_key >/proc/1/fd/2"),
}

# the whole-pod comparison: with the binding auditing only, each pod off its template is admitted
# (patched again for each, so that -k may pick any of them alone)
MUTATIONS.update({f"test_the_controller_account_cannot_create_a_pod_off_its_template[{field}]": _audit_only
                  for field in ("env-secretKeyRef", "envFrom-secretRef", "hostname", "nodeName", "priorityClassName",
                                "runtimeClassName", "tolerations")})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    mutate = MUTATIONS.get(item.name)
    if mutate is not None:
        mutate()
    yield
