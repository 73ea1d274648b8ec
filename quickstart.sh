#!/usr/bin/env bash
# slurmk8s quickstart on one machine with only package mirrors (Debian, PyPI, Go module proxy):
# builds what is missing (Python env, Docker engine, images, the Kubernetes/Pulumi toolchain),
# starts a local single-node Kubernetes, deploys examples/local.yaml with `slurmk8s up`, then
# logs in as the researcher `alice` over SSH and runs a first 2-node job from zero worker pods.
# Re-runs skip everything already done, also after `slurmk8s down --purge` (the local volumes are
# given back). Cold: ~35 min (toolchain ~28 min); warm: ~1 min.
#
# Env: QUICKSTART_NAME      the cluster's name (default local; namespace slurm-<name>, volumes of its own)
#      QUICKSTART_VENV      a virtualenv with slurmk8s installed (default .venv, made when missing)
#      QUICKSTART_PREBUILT=1  images, toolchain and the running local cluster are there already (CI, the
#                           e2e test e2e/test_e2e_zz_quickstart.py): build, start and load nothing
set -euo pipefail
cd "$(dirname "$0")"
t0=$SECONDS
step() { echo; echo "=== [quickstart +$((SECONDS - t0))s] $*"; }
name=${QUICKSTART_NAME:-local}
venv=${QUICKSTART_VENV:-.venv}
prebuilt=${QUICKSTART_PREBUILT:-0}

step "Python environment ($venv)"
[ -x "$venv/bin/slurmk8s" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet -e '.[test]'; }

if [ "$prebuilt" != 1 ]; then
  step "Docker engine and images"
  bash images/ensure-docker.sh
  bash images/build.sh

  step "toolchain (Kubernetes, etcd, CoreDNS, kwok, helm, Pulumi CLI + provider; cached)"
  bash provisioner/localk8s/toolchain.sh build
fi
export PATH="/var/cache/slurmk8s/toolchain/bin:$PATH" KUBECONFIG=/var/lib/slurmk8s/localk8s/kubeconfig

if [ "$prebuilt" != 1 ]; then
  step "local Kubernetes cluster"
  "$venv/bin/slurmk8s" cluster status >/dev/null 2>&1 || "$venv/bin/slurmk8s" cluster down >/dev/null 2>&1 || true
  "$venv/bin/slurmk8s" cluster up
  "$venv/bin/slurmk8s" cluster load-image slurmk8s/slurmctld:dev slurmk8s/slurmd:dev slurmk8s/login:dev \
    slurmk8s/slurmdbd:dev slurmk8s/mariadb:dev
fi

step "the researcher's SSH key, the cluster spec and its volumes"
mkdir -p ~/.slurmk8s
key=~/.slurmk8s/quickstart_ed25519
[ -f "$key" ] || ssh-keygen -q -t ed25519 -N '' -C alice@quickstart -f "$key"
if [ "$name" = local ]; then spec=~/.slurmk8s/quickstart.yaml; else spec=~/.slurmk8s/quickstart-$name.yaml; fi
storage=${spec%.yaml}-storage.yaml
KEY="$(cat "$key.pub")" NAME="$name" "$venv/bin/python" - "$spec" "$storage" <<'PY'
import os, sys, yaml
name = os.environ["NAME"]
spec = yaml.safe_load(open("examples/local.yaml"))
spec["name"] = name
spec["users"][0]["ssh_keys"] = [os.environ["KEY"]]
# three small slot nodes, so a 2-node job fits the single local node
spec["pools"] = [{"name": "cpu", "mode": "slots", "cpus": 1, "memory": "1Gi", "domains": [{"name": "local", "count": 3}],
                  "pod_cpu_request": "50m", "pod_memory_request": "128Mi"}]
yaml.safe_dump(spec, open(sys.argv[1], "w"))
# examples/localk8s/storage.yaml: the StorageClass and three volumes reserved for the claims of cluster
# "local"; another name gets volumes of its own (reserved for its namespace, data under volumes/<name>)
docs = list(yaml.safe_load_all(open("examples/localk8s/storage.yaml")))
for doc in docs:
    if doc["kind"] == "PersistentVolume" and name != "local":
        claim = doc["spec"]["claimRef"]["name"]
        doc["metadata"]["name"] = f"slurmk8s-{name}-{claim}"
        doc["spec"]["claimRef"]["namespace"] = f"slurm-{name}"
        doc["spec"]["hostPath"]["path"] = f"/var/lib/slurmk8s/volumes/{name}/{claim}"
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
kubectl apply -f "$storage"

step "slurmk8s up"
"$venv/bin/slurmk8s" up --spec "$spec"

step "a first job, as alice over SSH: sbatch -N2 from zero worker pods"
host=$(kubectl -n "slurm-$name" get service login -o jsonpath='{.spec.clusterIP}')
ssh -i "$key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "alice@$host" '
  echo "worker nodes before: $(sinfo -h -o "%D %T")"
  j=$(sbatch --parsable -N2 -o first-%j.out --wrap "srun hostname")
  echo "submitted job $j"
  while squeue -h -j "$j" | grep -q .; do sleep 1; done
  echo "job $j: $(scontrol show job "$j" | grep -o "JobState=[A-Z]*")"; cat "first-$j.out"'
kubectl -n "slurm-$name" get pods
step "done: ssh -i $key alice@$host   (tear down: $venv/bin/slurmk8s down --spec $spec)"
