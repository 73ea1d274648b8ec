"""An in-memory accounting database that understands the sacctmgr commands provisioner.accounting
plans (the real one is exercised by tests/integration/test_accounting_daemons.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.accounting import Action, Association, Current, SacctmgrError


@dataclass
class FakeDatabase:
    """An in-memory accounting database that understands the commands :func:`plan` makes (tests)."""

    clusters: set[str] = field(default_factory=set)
    assocs: dict[tuple[str, str, str], Association] = field(default_factory=dict)  # (cluster, account, user)
    applied: list[tuple[str, ...]] = field(default_factory=list)
    running_jobs: set[str] = field(default_factory=set)  # users whose deletion Slurm refuses
    defaults: dict[str, str] = field(default_factory=dict)  # user -> default account

    def read(self, cluster: str) -> Current:
        if cluster not in self.clusters:
            return Current(False)
        return Current(True, tuple(sorted((a for (c, _, _), a in self.assocs.items() if c == cluster),
                                          key=lambda a: (a.account, a.user))))

    def apply(self, action: Action) -> str:
        argv = action.argv
        kv = dict(a.split("=", 1) for a in argv if "=" in a)
        self.applied.append(argv)
        if argv[:2] == ("add", "cluster"):
            self.clusters.add(argv[2])
            self.assocs[(argv[2], "root", "")] = Association("root", "", 1)
            self.assocs[(argv[2], "root", "root")] = Association("root", "root", 1)
        elif argv[:2] == ("add", "account"):
            self.assocs[(kv["cluster"], argv[2], "")] = Association(argv[2], "", int(kv["fairshare"]))
        elif argv[:2] == ("modify", "account"):
            key = (kv["cluster"], kv["name"], "")
            self.assocs[key] = Association(kv["name"], "", int(kv["fairshare"]))
        elif argv[:2] == ("add", "user"):
            self.assocs[(kv["cluster"], kv["account"], argv[2])] = Association(kv["account"], argv[2], 1)
            self.defaults.setdefault(argv[2], kv["defaultaccount"])
        elif argv[:2] == ("modify", "user"):
            self.defaults[kv["name"]] = kv["defaultaccount"]
        elif argv[:2] == ("delete", "user"):
            if kv["name"] in self.running_jobs:
                raise SacctmgrError(f"sacctmgr: Job(s) active, cancel job(s) before remove: {kv['name']}")
            if kv.get("account") and self.defaults.get(kv["name"]) == kv["account"]:
                raise SacctmgrError("sacctmgr: cannot remove the default account of a user")
            for key in [k for k in self.assocs if k[0] == kv["cluster"] and k[2] == kv["name"]
                        and ("account" not in kv or k[1] == kv["account"])]:
                del self.assocs[key]
        elif argv[:2] == ("delete", "account"):
            for key in [k for k in self.assocs if k[0] == kv["cluster"] and k[1] == kv["name"]]:
                del self.assocs[key]
        else:
            raise SacctmgrError(f"fake: unknown command {argv}")
        return ""
