"""A platform team's own Pulumi program with a Slurm cluster in it (`pulumi up` here).

The Kubernetes provider is the program's own: here from a kubeconfig in the stack config; in a
program that also creates its EKS, GKE or AKS cluster, the provider made from that cluster's
kubeconfig output, e.g. ``k8s.Provider("k8s", kubeconfig=eks_cluster.kubeconfig_json)``. The Slurm
cluster needs nothing else: its keys are made as a resource of this stack, and slurmctld reads the
Kubernetes nodes when it starts, so the cluster may be declared before its nodes exist.
"""

import pulumi
import pulumi_kubernetes as k8s

from provisioner.deploy import SlurmCluster

config = pulumi.Config()

# In place updates of ConfigMaps and Secrets (users, keys, the spec): without these two settings the
# provider deletes and recreates each changed one.
provider = k8s.Provider("k8s", kubeconfig=config.get("kubeconfig") or None,
                        enable_config_map_mutable=True, enable_secret_mutable=True)

research = SlurmCluster("research", config.get("spec") or "cluster.yaml",
                        opts=pulumi.ResourceOptions(provider=provider))

pulumi.export("namespace", research.namespace)
pulumi.export("login_address", research.login_address)
pulumi.export("ssh_host_public_keys", research.login_host_public_keys)
pulumi.export("rest_url", research.rest_url)
