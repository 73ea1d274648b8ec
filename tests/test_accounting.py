"""Accounting: the spec -> database plan (pure), its idempotence against an in-memory sacctmgr, the
objects that carry slurmdbd and its database, and the checks `up` runs before applying anything."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from factories import node
from fakes.accounting import FakeDatabase

from provisioner import manifests as m
from provisioner.accounting import (Action, Association, Cause, ControllerWatch, Current, Desired, Sacctmgr,
                                    SacctmgrError, Scontrol, parse_associations, parse_clusters, parse_known_associations,
                                    plan, sync)
from provisioner.config import parse_spec
from provisioner.deploy import preflight as pf
from provisioner.errors import SpecError
from provisioner.generate import generate
from provisioner.inventory import nodes_from_api
from provisioner.manifests import ClusterSecrets

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzd0lrWdoGzZqR7HcXXwVcEBjzC1D8dRp6oOC5eYIx0 a@b"
BASE: dict[str, Any] = {
    "name": "demo",
    "pools": [{"name": "cpu", "node_selector": {"pool": "cpu"}}],
    "users": [{"name": "alice", "uid": 2001, "ssh_keys": [KEY], "account": "research"},
              {"name": "bob", "uid": 2002, "account": "teaching"},
              {"name": "carol", "uid": 2003}],
    "accounting": {"accounts": [{"name": "research", "fairshare": 10}, {"name": "teaching", "fairshare": 2}]},
}


def spec_of(**changes: Any):
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        target = data
        *path, last = key.split("__")
        for p in path:
            target = target.setdefault(p, {})
        target[last] = value
    return parse_spec(data)


# ---------------------------------------------------------------- the plan


def test_desired_state_from_the_spec():
    d = Desired.from_spec(spec_of())
    assert d.cluster == "demo"
    assert d.accounts == {"research": (10, "research"), "teaching": (2, "teaching")}
    assert d.users == {"alice": "research", "bob": "teaching", "carol": "research"}  # carol: the first account


def test_empty_database_gets_cluster_accounts_and_users_in_order():
    actions = plan(Desired.from_spec(spec_of()), Current(cluster_exists=False))
    assert [a.cause for a in actions] == [Cause.CLUSTER_MISSING, Cause.ACCOUNT_MISSING, Cause.ACCOUNT_MISSING,
                                          Cause.USER_MISSING, Cause.USER_MISSING, Cause.USER_MISSING]
    assert actions[0].argv == ("add", "cluster", "demo")
    assert actions[1].argv == ("add", "account", "research", "cluster=demo", "parent=root", "fairshare=10",
                               "description=research", "organization=research")
    assert actions[3].argv == ("add", "user", "alice", "account=research", "defaultaccount=research", "cluster=demo")


def test_sync_is_idempotent_and_a_second_pass_changes_nothing():
    db = FakeDatabase()
    desired = Desired.from_spec(spec_of())
    first = sync(desired, db)
    assert first.ok and len(first.applied) == 6
    db.applied.clear()
    second = sync(desired, db)
    assert second.ok and second.applied == () and db.applied == []


def test_removed_user_loses_the_association_only_and_root_is_never_touched():
    db = FakeDatabase()
    sync(Desired.from_spec(spec_of()), db)
    db.applied.clear()
    without_bob = spec_of(users=[u for u in BASE["users"] if u["name"] != "bob"])
    result = sync(Desired.from_spec(without_bob), db)
    assert [a.cause for a in result.applied] == [Cause.USER_REMOVED_FROM_SPEC]
    assert db.applied == [("delete", "user", "where", "name=bob", "cluster=demo")]
    assert ("demo", "root", "root") in db.assocs and ("demo", "teaching", "") in db.assocs


def test_fairshare_change_modifies_the_account():
    db = FakeDatabase()
    sync(Desired.from_spec(spec_of()), db)
    db.applied.clear()
    accounts = [{"name": "research", "fairshare": 50}, {"name": "teaching", "fairshare": 2}]
    result = sync(Desired.from_spec(spec_of(accounting__accounts=accounts)), db)
    assert db.applied == [("modify", "account", "where", "name=research", "cluster=demo", "set", "fairshare=50")]
    assert result.applied[0].describe() == "fairshare-changed: account research: fairshare 10 -> 50"


def test_user_moved_to_another_account_gets_the_new_default_before_the_old_one_goes():
    db = FakeDatabase()
    sync(Desired.from_spec(spec_of()), db)
    db.applied.clear()
    users = copy.deepcopy(BASE["users"])
    users[1]["account"] = "research"
    result = sync(Desired.from_spec(spec_of(users=users)), db)
    assert result.ok, result.failed  # the fake refuses to delete a default association, like Slurm
    assert db.applied == [
        ("add", "user", "bob", "account=research", "defaultaccount=research", "cluster=demo"),
        ("modify", "user", "where", "name=bob", "cluster=demo", "set", "defaultaccount=research"),
        ("delete", "user", "where", "name=bob", "account=teaching", "cluster=demo"),
    ]


def test_dropped_account_goes_after_its_users_and_a_refused_removal_is_retried():
    db = FakeDatabase()
    sync(Desired.from_spec(spec_of()), db)
    db.running_jobs.add("bob")
    users = [u for u in BASE["users"] if u["name"] != "bob"]
    desired = Desired.from_spec(spec_of(users=users, accounting__accounts=[{"name": "research", "fairshare": 10}]))
    first = sync(desired, db)
    assert [a.describe() for a, _ in first.failed] == ["user-removed-from-spec: user bob (their jobs stay in the history)"]
    assert "active" in first.failed[0][1]
    assert ("demo", "teaching", "") in db.assocs, "the account must wait until its user is gone"
    db.running_jobs.clear()
    second = sync(desired, db)
    assert second.ok and [a.cause for a in second.applied] == [Cause.USER_REMOVED_FROM_SPEC,
                                                               Cause.ACCOUNT_REMOVED_FROM_SPEC]
    assert sync(desired, db).applied == ()
    assert {k[1] for k in db.assocs} == {"root", "research"}


def test_sacctmgr_parsable_output():
    text = "root||1\nroot|root|1\nresearch||10\nresearch|alice|1\nteaching||parent\n"
    assocs = parse_associations(text)
    assert Association("research", "", 10) in assocs and Association("research", "alice", 1) in assocs
    assert Association("teaching", "", None) in assocs
    assert parse_clusters("demo\nother\n\n") == {"demo", "other"}
    with pytest.raises(ValueError):
        parse_associations("garbage")


# ---------------------------------------------------------------- spec


@pytest.mark.parametrize("changes, field", [
    ({"users": [{"name": "alice", "uid": 2001, "account": "nope"}]}, "users[0].account"),
    ({"accounting": {"accounts": [{"name": "a"}, {"name": "a"}]}}, "accounting"),
    ({"accounting": {"accounts": [{"name": "Root"}]}}, "accounting.accounts[0].name"),
    ({"accounting": {"accounts": [{"name": "a", "fairshare": 0}]}}, "accounting.accounts[0].fairshare"),
    ({"accounting": {"default_account": "zz"}}, "accounting"),
    ({"accounting": {"enabled": False}, "users": [{"name": "alice", "uid": 2001, "account": "default"}]},
     "users[0].account"),
    ({"accounting": {"external_database": {"host": "db"}}}, "accounting.external_database.password_secret"),
    ({"accounting": {"external_database": {"host": "db", "port": 0, "password_secret": {"name": "s"}}}},
     "accounting.external_database.port"),
    ({"accounting": {"external_database": {"host": "db", "password_secret": {"name": "Bad_Name"}}}},
     "accounting.external_database.password_secret.name"),
    ({"storage": {"database": {"size": "100Mi"}}}, "storage.database.size"),
    ({"storage": {"home": {"size": "10Mi", "access_mode": "ReadWriteMany"}}}, "storage.home.size"),
    ({"storage": {"home": {"size": "1Gi", "access_mode": "ReadWriteOncePod"}}}, "storage.home.access_mode"),
])
def test_bad_accounting_and_storage_specs_name_the_field(changes, field):
    data = {"name": "demo", "pools": [{"name": "cpu"}], **changes}
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert field in err.value.fields, err.value.render()
    assert "Fix:" in err.value.render()


def test_too_small_database_volume_says_how_big():
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "demo", "pools": [{"name": "cpu"}], "storage": {"database": {"size": "100Mi"}}})
    assert str(err.value.issues[0]) == ("storage.database.size: 100Mi is too small for database (at least 512Mi). "
                                        "Fix: set storage.database.size to 512Mi or more")


# ---------------------------------------------------------------- objects


def _objects(spec):
    gen = generate(spec, nodes_from_api([node("n1", {"pool": "cpu"})]))
    secrets = ClusterSecrets("bXVuZ2U=", {t: "KEY" for t in m.SSH_HOST_KEY_TYPES}, db_password="s3cretPassw0rd")
    return {(o["kind"], o["metadata"]["name"]): o for o in m.all_objects(spec, gen.inventory, gen.files, secrets)}


def _mounted_secrets(pod_spec: dict) -> set[str]:
    return {v["secret"]["secretName"] for v in pod_spec["volumes"] if "secret" in v}


def test_internal_database_objects_labels_and_where_the_secrets_go():
    objs = _objects(spec_of())
    dbd = objs[("Deployment", "slurmdbd")]
    db = objs[("StatefulSet", "mariadb")]
    for workload in (dbd, db):
        assert workload["metadata"]["labels"][m.L_TIER] == "control"
        assert workload["spec"]["template"]["metadata"]["labels"][m.L_TIER] == "control"
        assert "replicas" not in workload["spec"]  # the idle teardown owns it
    assert _mounted_secrets(dbd["spec"]["template"]["spec"]) == {"slurm-auth", "slurmdbd-conf", "accounting-db"}
    assert _mounted_secrets(db["spec"]["template"]["spec"]) == {"accounting-db"}
    assert {v["persistentVolumeClaim"]["claimName"] for v in db["spec"]["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v} == {"accounting-db"}
    assert dbd["spec"]["template"]["spec"]["hostname"] == "slurmdbd"
    # slurmdbd.conf and the password reach no login or worker pod, and no ConfigMap holds them
    login = objs[("Deployment", "login")]["spec"]["template"]["spec"]
    worker = m.worker_pod_template(spec_of(), spec_of().pools[0])["spec"]
    for pod in (login, worker):
        assert not _mounted_secrets(pod) & {"slurmdbd-conf", "accounting-db"}
    for (kind, _), obj in objs.items():
        if kind == "ConfigMap":
            assert "s3cretPassw0rd" not in json.dumps(obj) and "StoragePass" not in json.dumps(obj)
    conf = objs[("Secret", "slurmdbd-conf")]["stringData"]["slurmdbd.conf"]
    assert "StorageHost=mariadb.slurm-demo.svc.cluster.local\n" in conf and "DbdHost=slurmdbd\n" in conf
    assert "StoragePass=" not in conf
    assert objs[("Secret", "accounting-db")]["stringData"] == {"password": "s3cretPassw0rd"}
    # the slurmctld pod keeps the database in step with the spec, as SlurmUser
    ctld = objs[("StatefulSet", "slurmctld")]["spec"]["template"]["spec"]["containers"]
    acct = next(c for c in ctld if c["name"] == "accounting")
    assert acct["securityContext"]["runAsUser"] == m.SLURM_UID
    assert acct["command"][:3] == ["/usr/bin/tini", "--", f"{m.BIN_DIR}/slurmk8s-accounting"]  # not PID 1
    slurm_conf = objs[("ConfigMap", "slurm-config")]["data"]["slurm.conf"]
    for line in ("AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=slurmdbd",
                 "JobAcctGatherType=jobacct_gather/linux", "PriorityType=priority/multifactor",
                 "PriorityWeightFairshare=10000"):
        assert line + "\n" in slurm_conf


def test_external_database_uses_the_operators_secret_and_no_mariadb():
    spec = spec_of(accounting__external_database={"host": "db.example.org", "port": 3307, "user": "acct",
                                                  "database": "slurm_db", "password_secret": {"name": "db-pw",
                                                                                              "key": "pw"}})
    objs = _objects(spec)
    assert not any(kind in ("StatefulSet",) and name == "mariadb" for kind, name in objs)
    assert ("Secret", "accounting-db") not in objs and ("PersistentVolumeClaim", "accounting-db") not in objs
    pod = objs[("Deployment", "slurmdbd")]["spec"]["template"]["spec"]
    pw = next(v for v in pod["volumes"] if v["name"] == "password")["secret"]
    assert pw["secretName"] == "db-pw" and pw["items"] == [{"key": "pw", "path": "password"}]
    conf = objs[("Secret", "slurmdbd-conf")]["stringData"]["slurmdbd.conf"]
    assert "StorageHost=db.example.org\nStoragePort=3307\nStorageUser=acct\nStorageLoc=slurm_db\n" in conf
    assert m.kept_claims(spec) == ["home", "slurmctld-state"]
    check = m.db_check_pod(spec, "chk")
    env = {e["name"]: e["value"] for e in check["spec"]["containers"][0]["env"]}
    assert env == {"SLURMK8S_DB_HOST": "db.example.org", "SLURMK8S_DB_PORT": "3307", "SLURMK8S_DB_USER": "acct",
                   "SLURMK8S_DB_NAME": "slurm_db"}
    assert check["spec"]["securityContext"]["runAsNonRoot"] and check["spec"]["restartPolicy"] == "Never"


def test_accounting_disabled_leaves_slurm_as_before():
    spec = parse_spec({"name": "demo", "pools": [{"name": "cpu"}], "accounting": {"enabled": False}})
    objs = _objects(spec)
    assert not [k for k in objs if k[1] in ("slurmdbd", "mariadb", "accounting-db", "slurmdbd-conf")]
    conf = objs[("ConfigMap", "slurm-config")]["data"]["slurm.conf"]
    assert "JobAcctGatherType=jobacct_gather/none\n" in conf and "AccountingStorage" not in conf
    assert all(c["name"] != "accounting" for c in
               objs[("StatefulSet", "slurmctld")]["spec"]["template"]["spec"]["containers"])


def test_priority_weights_can_be_overridden():
    spec = spec_of(slurm={"extra_conf": {"PriorityWeightFairshare": "500"}})
    conf = _objects(spec)[("ConfigMap", "slurm-config")]["data"]["slurm.conf"]
    assert "PriorityWeightFairshare=500\n" in conf and "PriorityWeightFairshare=10000" not in conf


def test_generated_database_password_is_letters_and_digits():
    from provisioner.deploy.keys import DB_PASSWORD
    from provisioner.deploy.keys import generate as gen_secrets

    pw = gen_secrets()[DB_PASSWORD]
    assert len(pw) == 32 and pw.isalnum()
    assert DB_PASSWORD not in gen_secrets(missing_only={DB_PASSWORD: "kept"})


# ---------------------------------------------------------------- preflight (bad input against the live cluster)

LOCAL = {"name": "local", "pools": [{"name": "cpu"}],
         "storage": {"home": {"size": "1Gi", "storage_class": "local", "access_mode": "ReadWriteMany"},
                     "controller_state": {"size": "1Gi", "storage_class": "local"},
                     "database": {"size": "1Gi", "storage_class": "local"}}}


def _sc(name: str, provisioner: str = "kubernetes.io/no-provisioner", default: bool = False,
        expand: bool = False) -> dict:
    ann = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"metadata": {"name": name, "annotations": ann}, "provisioner": provisioner,
            "allowVolumeExpansion": expand}


def _pv(name: str, claim: str, size: str = "1Gi", modes=("ReadWriteOnce",), cls: str = "local",
        phase: str = "Available") -> dict:
    return {"metadata": {"name": name}, "status": {"phase": phase},
            "spec": {"storageClassName": cls, "capacity": {"storage": size}, "accessModes": list(modes),
                     "claimRef": {"namespace": "slurm-local", "name": claim}}}


def _local_pvs(**sizes: str) -> list[dict]:
    return [_pv("pv-home", "home", sizes.get("home", "1Gi"), ("ReadWriteMany",)),
            _pv("pv-state", "slurmctld-state", sizes.get("state", "1Gi")),
            _pv("pv-db", "accounting-db", sizes.get("db", "1Gi"))]


def test_preflight_passes_for_the_local_static_volumes():
    facts = pf.ClusterFacts(storage_classes=[_sc("local")], volumes=_local_pvs())
    assert pf.storage_issues(parse_spec(LOCAL), facts) == []


def test_preflight_storage_class_that_does_not_exist():
    spec = parse_spec({**LOCAL, "storage": {**LOCAL["storage"], "database": {"size": "1Gi", "storage_class": "fast"}}})
    facts = pf.ClusterFacts(storage_classes=[_sc("local"), _sc("standard", "csi.example", default=True)],
                            volumes=_local_pvs())
    with pytest.raises(pf.PreflightError) as err:
        pf.check(spec, facts)
    (issue,) = err.value.issues
    assert issue.field == "storage.database.storage_class"
    assert issue.message == "StorageClass 'fast' does not exist in the cluster (it has: local, standard)"
    assert "nothing was applied" in str(err.value)


def test_preflight_no_default_class():
    spec = parse_spec({"name": "local", "pools": [{"name": "cpu"}]})
    issues = pf.storage_issues(spec, pf.ClusterFacts(storage_classes=[_sc("local")]))
    assert [i.field for i in issues] == ["storage.home.storage_class", "storage.controller_state.storage_class",
                                         "storage.database.storage_class"]
    assert "no default StorageClass" in issues[0].message
    ok = pf.ClusterFacts(storage_classes=[_sc("standard", "csi.example", default=True)])
    assert pf.storage_issues(spec, ok) == []  # dynamic provisioning: nothing to check beforehand


def test_preflight_volume_too_small_for_the_static_volume():
    spec = parse_spec({**LOCAL, "storage": {**LOCAL["storage"], "database": {"size": "5Gi", "storage_class": "local"}}})
    facts = pf.ClusterFacts(storage_classes=[_sc("local")], volumes=_local_pvs())
    (issue,) = pf.storage_issues(spec, facts)
    assert issue.field == "storage.database.size"
    assert issue.message == ("5Gi ReadWriteOnce does not fit any PersistentVolume of class 'local' for "
                             "slurm-local/accounting-db: pv-db (1Gi, ReadWriteOnce)")


def test_preflight_static_class_without_a_volume_and_rwx_home_on_rwo_volumes():
    facts = pf.ClusterFacts(storage_classes=[_sc("local")],
                            volumes=[_pv("pv-home", "home"), _pv("pv-state", "slurmctld-state")])
    issues = pf.storage_issues(parse_spec(LOCAL), facts)
    assert [i.field for i in issues] == ["storage.home.size", "storage.database.storage_class"]
    assert "pv-home (1Gi, ReadWriteOnce)" in issues[0].message  # /home wants ReadWriteMany
    assert "no free PersistentVolume for claim slurm-local/accounting-db" in issues[1].message


def test_preflight_kept_claim_cannot_shrink_move_or_grow_without_expansion():
    claim = {"metadata": {"name": "accounting-db"},
             "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "2Gi"}}}}
    facts = pf.ClusterFacts(storage_classes=[_sc("local"), _sc("other")], claims=[claim], volumes=_local_pvs())
    smaller = parse_spec(LOCAL)  # database 1Gi < kept 2Gi
    (issue,) = pf.storage_issues(smaller, facts)
    assert issue.field == "storage.database.size" and "cannot shrink it to 1Gi" in issue.message
    bigger = parse_spec({**LOCAL, "storage": {**LOCAL["storage"], "database": {"size": "3Gi", "storage_class": "local"}}})
    (issue,) = pf.storage_issues(bigger, facts)
    assert "does not allow expansion" in issue.message
    moved = parse_spec({**LOCAL, "storage": {**LOCAL["storage"], "database": {"size": "2Gi", "storage_class": "other"}}})
    (issue,) = pf.storage_issues(moved, facts)
    assert issue.field == "storage.database.storage_class" and "cannot change class" in issue.message
    missing = parse_spec({**LOCAL, "storage": {**LOCAL["storage"], "database": {"size": "2Gi", "storage_class": "nope"}}})
    (issue,) = pf.storage_issues(missing, facts)  # a class that does not exist is named as such, kept claim or not
    assert issue.message.startswith("StorageClass 'nope' does not exist in the cluster")
    same = parse_spec({**LOCAL, "storage": {**LOCAL["storage"], "database": {"size": "2Gi", "storage_class": "local"}}})
    assert pf.storage_issues(same, facts) == []


def _ext(**secret: Any):
    return parse_spec({**LOCAL, "accounting": {"external_database": {
        "host": "db.example.org", "password_secret": {"name": "db-pw", **secret}}}})


def test_preflight_external_database_secret():
    spec = _ext()
    assert pf.secret_issues(spec, pf.ClusterFacts(namespace_exists=False))[0].message == (
        "namespace slurm-local does not exist yet, so neither does Secret db-pw")
    (missing,) = pf.secret_issues(spec, pf.ClusterFacts())
    assert missing.field == "accounting.external_database.password_secret.name"
    assert "kubectl -n slurm-local create secret generic db-pw --from-literal=password=<password>" in missing.fix
    wrong_key = {"db-pw": {"data": {"pw": base64.b64encode(b"x").decode()}}}
    (issue,) = pf.secret_issues(spec, pf.ClusterFacts(secrets=wrong_key))
    assert issue.field == "accounting.external_database.password_secret.key" and "(it has: pw)" in issue.message
    bad = {"db-pw": {"data": {"password": base64.b64encode(b"a b#c").decode()}}}
    assert "whitespace" in pf.secret_issues(spec, pf.ClusterFacts(secrets=bad))[0].message
    good = {"db-pw": {"data": {"password": base64.b64encode(b"Secret123").decode()}}}
    assert pf.secret_issues(spec, pf.ClusterFacts(secrets=good)) == []
    # no database volume is needed for an external database
    facts = pf.ClusterFacts(storage_classes=[_sc("local")], volumes=_local_pvs()[:2], secrets=good)
    assert pf.storage_issues(spec, facts) == []


# ---------------------------------------------------------------- /home without ReadWriteMany


def test_readwriteonce_home_is_the_single_node_fallback():
    from provisioner.errors import Problem

    rwo = {"storage": {"home": {"size": "1Gi", "access_mode": "ReadWriteOnce"}}}
    spec = parse_spec({"name": "demo", "pools": [{"name": "cpu", "node_selector": {"pool": "cpu"}}], **rwo})
    one = generate(spec, nodes_from_api([node("n1", {"pool": "cpu"})]))
    m.check_home_access(spec, one.inventory)
    pod = m.worker_pod(spec, one.inventory.nodes[0])
    aff = pod["spec"]["affinity"]
    assert aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [{
        "labelSelector": {"matchLabels": {m.L_CLUSTER: "demo", m.L_COMPONENT: "login"}},
        "topologyKey": "kubernetes.io/hostname"}]
    assert "nodeAffinity" in aff  # pinned placement kept
    two = generate(spec, nodes_from_api([node("n1", {"pool": "cpu"}), node("n2", {"pool": "cpu"})]))
    with pytest.raises(Problem) as err:
        m.check_home_access(spec, two.inventory)
    assert err.value.fields == ("storage.home.access_mode",) and "ReadWriteMany" in err.value.render()
    rwx = parse_spec({"name": "demo", "pools": [{"name": "cpu", "node_selector": {"pool": "cpu"}}]})
    assert "affinity" not in m.worker_pod_template(rwx, rwx.pools[0])["spec"]


def test_service_names_are_fully_qualified_in_the_program():
    """slurm.conf and slurmdbd.conf name slurmdbd and MariaDB by FQDN: a bare name that does not resolve
    yet falls through to the node's search domains (on the local cluster it reached an HTTP server)."""
    spec = spec_of()
    site = m.K8sSite(cluster_domain="corp.local")
    assert m.slurmdbd_host(spec, site) == "slurmdbd.slurm-demo.svc.corp.local"
    assert "StorageHost=mariadb.slurm-demo.svc.corp.local\n" in m.slurmdbd_conf(spec, site)


# ---------------------------------------------------------------- slurmctld's copy of the associations

ASSOC_MGR = """Current Association Manager state

Association Records

ClusterName=local Account=root UserName= Partition= Priority=0 ID=1
    SharesRaw/Norm/Level/Factor=1/0.00/1/0.00
ClusterName=local Account=research UserName=alice(2001) Partition= Priority=0 ID=6
    SharesRaw/Norm/Level/Factor=1/0.50/2/0.00
ClusterName=local Account=teaching UserName=bob(4294967294) Partition= Priority=0 ID=7
"""


def test_known_associations_are_those_with_a_resolved_uid():
    assert parse_known_associations(ASSOC_MGR) == {("alice", "research")}  # bob's uid unresolved: no job matches
    assert parse_known_associations(ASSOC_MGR.replace("bob(4294967294)", "bob(2002)")) == {
        ("alice", "research"), ("bob", "teaching")}
    assert parse_known_associations("Current Association Manager state\n") == set()


SPEC_USERS = {"alice": "research", "bob": "teaching"}


class FakeController:
    def __init__(self, known: set[tuple[str, str]], heals: bool = True, fails: bool = False) -> None:
        self.known, self.heals, self.fails, self.asked, self.reloads = set(known), heals, fails, 0, 0

    def known_associations(self):
        self.asked += 1
        return set(self.known)

    def reload(self):
        self.reloads += 1
        if self.fails:
            raise SacctmgrError("scontrol reconfigure: exit 1: slurm_reconfigure error: Unable to contact slurm controller")
        if self.heals:  # slurmctld loads the associations from slurmdbd again
            self.known |= set(SPEC_USERS.items())


def test_a_slurmctld_in_step_is_only_asked():
    ctl, watch = FakeController(set(SPEC_USERS.items())), ControllerWatch()
    assert watch.check(SPEC_USERS, ctl, 100.0) == ([], "")
    assert ctl.asked == 1 and ctl.reloads == 0 and not watch.hurry()
    assert watch.check({}, ctl, 101.0) == ([], "") and ctl.asked == 1  # no users: nothing to ask


def test_a_user_missing_past_the_grace_gets_slurmctld_reloaded_once():
    ctl, watch = FakeController({("alice", "research")}), ControllerWatch(grace=10, cooldown=300)
    assert watch.check(SPEC_USERS, ctl, 100.0) == (["bob"], "")  # first seen missing: a push may be on its way
    assert watch.hurry()  # look again soon
    assert watch.check(SPEC_USERS, ctl, 105.0) == (["bob"], "")  # within the grace
    assert ctl.reloads == 0
    missing, note = watch.check(SPEC_USERS, ctl, 112.0)
    assert missing == ["bob"] and ctl.reloads == 1
    assert note.startswith("slurmctld lacks the association of bob 12s after the database had it")
    assert "scontrol reconfigure" in note
    assert watch.check(SPEC_USERS, ctl, 114.0) == ([], "slurmctld has every user's association")
    assert watch.check(SPEC_USERS, ctl, 144.0) == ([], "") and not watch.hurry()  # said once


def test_the_grace_is_per_user_and_counts_the_account():
    ctl, watch = FakeController({("alice", "research"), ("bob", "research")}), ControllerWatch(grace=10)
    moved = {"alice": "research", "bob": "teaching"}  # bob moved: slurmctld has only his old association
    assert watch.check(moved, ctl, 0.0) == (["bob"], "")
    ctl.known.discard(("alice", "research"))  # alice goes missing later
    assert watch.check(moved, ctl, 8.0) == (["alice", "bob"], "")
    _, note = watch.check(moved, ctl, 11.0)  # bob is 11 s late, alice 3 s: the reload names bob
    assert ctl.reloads == 1 and note.startswith("slurmctld lacks the association of bob 11s")


def test_a_slurmctld_that_stays_behind_is_reloaded_once_per_cooldown_and_not_hurried():
    ctl, watch = FakeController({("alice", "research")}, heals=False), ControllerWatch(grace=10, cooldown=300)
    for now in (0.0, 11.0, 40.0, 200.0, 310.0):
        watch.check(SPEC_USERS, ctl, now)
    assert ctl.reloads == 1  # at 11 s; 310 s is within 300 s of it
    assert not watch.hurry()  # tried: back to the normal period, not every 2 s forever
    watch.check(SPEC_USERS, ctl, 312.0)
    assert ctl.reloads == 2


def test_a_failed_reload_waits_out_the_cooldown_and_an_outage_restarts_the_grace():
    ctl, watch = FakeController({("alice", "research")}, fails=True), ControllerWatch(grace=10, cooldown=300)
    watch.check(SPEC_USERS, ctl, 0.0)
    with pytest.raises(SacctmgrError, match="lacks the association of bob; its reload failed: .*Unable to contact"):
        watch.check(SPEC_USERS, ctl, 11.0)
    watch.forget()  # what the loop does on any error
    for now in (12.0, 30.0, 60.0):
        watch.check(SPEC_USERS, ctl, now)  # within the cooldown of the failed attempt
    assert ctl.reloads == 1
    ctl2, watch2 = FakeController({("alice", "research")}), ControllerWatch(grace=10)
    watch2.check(SPEC_USERS, ctl2, 0.0)
    watch2.forget()  # slurmctld did not answer at 5 s (restarting)
    assert watch2.check(SPEC_USERS, ctl2, 20.0) == (["bob"], "")  # measured afresh: not 20 s late
    assert ctl2.reloads == 0


def test_scontrol_reads_every_association_and_reconfigures(tmp_path):
    exe = tmp_path / "scontrol"
    calls = tmp_path / "calls"
    exe.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                   f"if [ \"$1\" = show ]; then cat <<'EOF'\n{ASSOC_MGR}EOF\nfi\n")
    exe.chmod(0o755)
    ctl = Scontrol(exe=str(exe))
    assert ctl.known_associations() == {("alice", "research")}
    ctl.reload()
    assert calls.read_text().splitlines() == ["show assoc_mgr flags=assoc", "reconfigure"]
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'slurm_load_ctl_conf error: Unable to contact slurm controller' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(SacctmgrError, match="exit 1: slurm_load_ctl_conf error: Unable to contact slurm controller"):
        Scontrol(exe=str(failing)).known_associations()


def test_sacctmgr_runs_its_argv_and_names_a_failure(tmp_path):
    exe = tmp_path / "sacctmgr"
    exe.write_text("#!/bin/sh\nif [ \"$1\" = -i ]; then echo \" Adding User(s)\"; exit 0; fi\n"
                   "echo 'sacctmgr: error: Problem talking to the database: Connection refused' >&2; exit 1\n")
    exe.chmod(0o755)
    db = Sacctmgr(exe=str(exe))
    assert db.apply(Action(("add", "user", "bob"), Cause.USER_MISSING, "user bob")) == "Adding User(s)"
    with pytest.raises(SacctmgrError, match=r"^sacctmgr -n -P show clusters format=Cluster: exit 1: .*Connection refused"):
        db.read("local")
