"""`slurmk8s up` waits until every StatefulSet and Deployment of the cluster has really rolled out
(provisioner/deploy/live.py): Pulumi's StatefulSet await (provider 4.25) can read the old
revision's status, which looks rolled out, before the controller has seen the new spec."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fakes.clock import Clock

from provisioner.deploy.errors import DeployError
from provisioner.deploy.live import rollout_pending, wait_login_reaches_controller, wait_rollouts


def sts(generation=2, observed=2, replicas=1, ready=1, updated=1, current="r1", update="r1", strategy=None):
    obj = {"metadata": {"name": "slurmctld", "namespace": "slurm-x", "generation": generation},
           "spec": {"replicas": replicas},
           "status": {"observedGeneration": observed, "readyReplicas": ready, "updatedReplicas": updated,
                      "currentRevision": current, "updateRevision": update, "replicas": replicas}}
    if strategy:
        obj["spec"]["updateStrategy"] = strategy
    return obj


def deploy(generation=3, observed=3, replicas=1, updated=1, available=1, total=1, conditions=()):
    return {"metadata": {"name": "login", "namespace": "slurm-x", "generation": generation},
            "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "availableReplicas": available,
                       "replicas": total, "conditions": list(conditions)}}


@pytest.mark.parametrize("obj, why", [
    # the race: `up` patched the spec (generation 3), the controller still reports generation 2's pod
    (sts(generation=3, observed=2), "statefulset/slurmctld: its controller has not seen the new spec yet"),
    (sts(ready=0), "statefulset/slurmctld: 0 of 1 pod(s) ready"),
    (sts(updated=0), "statefulset/slurmctld: 0 of 1 pod(s) updated"),
    (sts(update="r2"), "statefulset/slurmctld: the new revision is not current yet"),
    (sts(), None),
    (sts(replicas=0, ready=0, updated=0), None),  # an asleep control tier
    (sts(update="r2", strategy={"type": "OnDelete"}), None),
])
def test_a_statefulset_is_rolled_out_only_when_its_controller_saw_the_spec_and_the_new_pods_are_ready(obj, why):
    assert rollout_pending("StatefulSet", obj) == why


@pytest.mark.parametrize("obj, why", [
    (deploy(generation=4), "deployment/login: its controller has not seen the new spec yet"),
    (deploy(updated=0), "deployment/login: 0 of 1 pod(s) updated"),
    (deploy(total=2), "deployment/login: 1 old pod(s) still terminating"),
    (deploy(available=0), "deployment/login: 0 of 1 updated pod(s) available"),
    (deploy(), None),
])
def test_a_deployment_is_rolled_out_by_kubectls_rules(obj, why):
    assert rollout_pending("Deployment", obj) == why


def test_a_deployment_past_its_progress_deadline_fails_naming_it():
    stuck = deploy(updated=0, conditions=[{"type": "Progressing", "reason": "ProgressDeadlineExceeded",
                                           "message": 'ReplicaSet "login-7f" has timed out progressing.'}])
    with pytest.raises(DeployError, match=r'deployment/login did not roll out: ReplicaSet "login-7f" has timed out'):
        rollout_pending("Deployment", stuck)


SESSION = SimpleNamespace(spec=SimpleNamespace(namespace_name="slurm-x"))


def test_up_waits_out_the_stale_status_then_says_how_long():
    clock = Clock()
    looks = iter([[("StatefulSet", sts(generation=3, observed=2)), ("Deployment", deploy())],
                  [("StatefulSet", sts(generation=3, observed=3, ready=0, update="r2")), ("Deployment", deploy())],
                  [("StatefulSet", sts(generation=3, observed=3, current="r2", update="r2")), ("Deployment", deploy())]])
    said: list[str] = []
    waited = wait_rollouts(SESSION, said.append, read=lambda: next(looks), clock=clock, sleep=clock.sleep)
    assert waited == 2.0
    assert said == ["waiting for the rollout: statefulset/slurmctld: its controller has not seen the new spec yet",
                    "waiting for the rollout: statefulset/slurmctld: 0 of 1 pod(s) ready",
                    "rolled out after 2.0s"]


def test_nothing_to_wait_for_says_nothing():
    said: list[str] = []
    assert wait_rollouts(SESSION, said.append, read=lambda: [("StatefulSet", sts())], clock=Clock()) == 0.0
    assert said == []


def test_a_rollout_that_never_ends_fails_after_the_timeout_with_what_it_waits_for():
    clock = Clock()
    with pytest.raises(DeployError, match=r"not rolled out after 5s: statefulset/slurmctld: 0 of 1 pod\(s\) ready.*"
                                          r"kubectl -n slurm-x get pods"):
        wait_rollouts(SESSION, lambda line: None, timeout=5, read=lambda: [("StatefulSet", sts(ready=0))],
                      clock=clock, sleep=clock.sleep)


def test_the_apis_passing_errors_are_waited_out_and_a_refusal_says_what_to_fix():
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import MaxRetryError

    clock = Clock()
    answers = iter([ApiException(status=503, reason="Service Unavailable"), MaxRetryError(None, "/apis", "refused"),
                    [("StatefulSet", sts())]])

    def read():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    said: list[str] = []
    assert wait_rollouts(SESSION, said.append, read=read, clock=clock, sleep=clock.sleep) == 2.0
    assert said == ["waiting for the rollout: the Kubernetes API answered 503 Service Unavailable",
                    "waiting for the rollout: the Kubernetes API did not answer (MaxRetryError)",
                    "rolled out after 2.0s"]

    def refused():
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(DeployError, match=r"refused \(403 Forbidden\).*rerun `slurmk8s up`"):
        wait_rollouts(SESSION, said.append, read=refused, clock=clock, sleep=clock.sleep)


# ---------------------------------------------------------------- then slurmctld answers from the login pod

STALE = (1, "", "Unable to contact slurm controller (connect failure)")
UP = (0, "Slurmctld(primary) at slurmctld-0 is UP\n", "")


def test_up_waits_until_slurmctld_answers_from_the_login_pod():
    """A new slurmctld pod is Ready before the login pod's DNS stops answering the old address
    (cache TTL): `sbatch` right after `up` failed with "Unable to contact slurm controller"."""
    clock = Clock()
    answers = iter([STALE] * 6 + [UP])
    said: list[str] = []
    waited = wait_login_reaches_controller(SESSION, said.append, ask=lambda: next(answers), clock=clock,
                                           sleep=clock.sleep)
    assert waited == 3.0  # six failed pings 0.5 s apart
    assert said == ["waiting for slurmctld to answer from the login pod: "
                    "Unable to contact slurm controller (connect failure)",
                    "slurmctld answers from the login pod after 3.0s"]


def test_an_answer_at_once_or_nothing_to_ask_says_nothing():
    said: list[str] = []
    assert wait_login_reaches_controller(SESSION, said.append, ask=lambda: UP, clock=Clock()) == 0.0
    assert wait_login_reaches_controller(SESSION, said.append, ask=lambda: None, clock=Clock()) == 0.0  # asleep
    assert said == []


def test_a_controller_that_never_answers_fails_with_what_the_ping_said():
    clock = Clock()
    with pytest.raises(DeployError, match=r"slurmctld does not answer from the login pod after 4s \(`scontrol ping`: "
                                          r"Unable to contact slurm controller \(connect failure\)\).*"
                                          r"kubectl -n slurm-x logs slurmctld-0"):
        wait_login_reaches_controller(SESSION, lambda _: None, timeout=4.0, ask=lambda: STALE, clock=clock,
                                      sleep=clock.sleep)
