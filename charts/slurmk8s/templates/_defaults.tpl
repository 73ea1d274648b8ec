{{/*
Generated from the cluster spec (provisioner/config.py) by
`python -m provisioner.chartdefaults > charts/slurmk8s/templates/_defaults.tpl`: do not edit.
The default of every spec field that has one, by model (values.schema.json's $defs), and of the
chart's own settings (`chart`). Use: {{- $d := include "slurmk8s.defaults" . | fromJson -}}
(numbers come back as floats: wrap integers in int64).
*/}}
{{- define "slurmk8s.defaults" -}}
{
  "Account": {
    "description": null,
    "fairshare": 1
  },
  "Accounting": {
    "accounts": [
      {
        "description": null,
        "fairshare": 1,
        "name": "default"
      }
    ],
    "database_buffer_pool": "256Mi",
    "default_account": null,
    "enabled": true,
    "external_database": null
  },
  "ClusterSpec": {
    "accounting": {
      "accounts": [
        {
          "description": null,
          "fairshare": 1,
          "name": "default"
        }
      ],
      "database_buffer_pool": "256Mi",
      "default_account": null,
      "enabled": true,
      "external_database": null
    },
    "elasticity": {
      "fast_start": true,
      "idle_teardown": null,
      "interruption_conditions": [],
      "interruption_taints": [
        "karpenter.sh/disrupted",
        "karpenter.sh/disruption",
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/scheduled-maintenance",
        "aws-node-termination-handler/asg-lifecycle-termination",
        "cloud.google.com/impending-node-termination",
        "ToBeDeletedByClusterAutoscaler"
      ],
      "resume_timeout": 300,
      "suspend_time": 300,
      "suspend_timeout": 15
    },
    "groups": [],
    "health": {
      "enabled": true,
      "gpu": true,
      "interval": 300,
      "min_disk_free": "1Gi",
      "min_memory_fraction": 0.9,
      "min_shm": "64Mi",
      "mpi_loopback": true
    },
    "images": {
      "controller": "slurmk8s/slurmctld:dev",
      "database": "slurmk8s/mariadb:dev",
      "login": "slurmk8s/login:dev",
      "pull_policy": "IfNotPresent",
      "rest": "slurmk8s/slurmrestd:dev",
      "slurmdbd": "slurmk8s/slurmdbd:dev",
      "worker": "slurmk8s/slurmd:dev"
    },
    "login": {
      "enabled": true,
      "node_port": null,
      "service_type": "ClusterIP",
      "sleeps_with_control_tier": false
    },
    "namespace": null,
    "rest": {
      "enabled": false,
      "max_token_lifespan": 86400,
      "node_port": null,
      "service_type": "ClusterIP"
    },
    "slurm": {
      "cluster_name": null,
      "default_partition": null,
      "extra_conf": {},
      "max_time": "UNLIMITED"
    },
    "storage": {
      "controller_state": {
        "access_mode": "ReadWriteOnce",
        "size": "1Gi",
        "storage_class": null
      },
      "database": {
        "access_mode": "ReadWriteOnce",
        "size": "2Gi",
        "storage_class": null
      },
      "home": {
        "access_mode": "ReadWriteMany",
        "size": "10Gi",
        "storage_class": null
      }
    },
    "topology": {
      "block_label": null,
      "block_sizes": [],
      "fallback_block_label": null,
      "levels": [],
      "plugin": "flat",
      "preset": null,
      "switch_names": "global",
      "tier_prefix": null,
      "unlabeled": "group"
    },
    "users": []
  },
  "ContainerJobs": {
    "enabled": false,
    "localhost_profile": null,
    "seccomp": "Unconfined"
  },
  "Elasticity": {
    "fast_start": true,
    "idle_teardown": null,
    "interruption_conditions": [],
    "interruption_taints": [
      "karpenter.sh/disrupted",
      "karpenter.sh/disruption",
      "aws-node-termination-handler/spot-itn",
      "aws-node-termination-handler/scheduled-maintenance",
      "aws-node-termination-handler/asg-lifecycle-termination",
      "cloud.google.com/impending-node-termination",
      "ToBeDeletedByClusterAutoscaler"
    ],
    "resume_timeout": 300,
    "suspend_time": 300,
    "suspend_timeout": 15
  },
  "ExternalDatabase": {
    "database": "slurm_acct_db",
    "port": 3306,
    "user": "slurm"
  },
  "Group": {},
  "Health": {
    "enabled": true,
    "gpu": true,
    "interval": 300,
    "min_disk_free": "1Gi",
    "min_memory_fraction": 0.9,
    "min_shm": "64Mi",
    "mpi_loopback": true
  },
  "Images": {
    "controller": "slurmk8s/slurmctld:dev",
    "database": "slurmk8s/mariadb:dev",
    "login": "slurmk8s/login:dev",
    "pull_policy": "IfNotPresent",
    "rest": "slurmk8s/slurmrestd:dev",
    "slurmdbd": "slurmk8s/slurmdbd:dev",
    "worker": "slurmk8s/slurmd:dev"
  },
  "Login": {
    "enabled": true,
    "node_port": null,
    "service_type": "ClusterIP",
    "sleeps_with_control_tier": false
  },
  "Network": {
    "host_network": false,
    "memlock_unlimited": true,
    "multus_networks": [],
    "nccl_env": {}
  },
  "Pool": {
    "containers": {
      "enabled": false,
      "localhost_profile": null,
      "seccomp": "Unconfined"
    },
    "cpus": null,
    "domain_label": null,
    "domains": [],
    "extra_resources": {},
    "feature_labels": [],
    "features": [],
    "gpu_resource": "nvidia.com/gpu",
    "gpu_type": null,
    "gpu_type_label": "nvidia.com/gpu.product",
    "gpus": 0,
    "image": null,
    "kueue": null,
    "max_nodes": null,
    "memory": null,
    "min_cpus": 1,
    "min_memory": "512Mi",
    "mode": "pinned",
    "name_from": "short",
    "name_prefix": null,
    "network": {
      "host_network": false,
      "memlock_unlimited": true,
      "multus_networks": [],
      "nccl_env": {}
    },
    "node_selector": {},
    "node_start_timeout": null,
    "partition": null,
    "pod_cpu_request": null,
    "pod_memory_request": null,
    "priority_class": null,
    "reserve_cpu": "500m",
    "reserve_memory": "1Gi",
    "shm_size": null,
    "tolerations": [],
    "weight": 1
  },
  "PoolKueue": {
    "priority_class": null
  },
  "Rest": {
    "enabled": false,
    "max_token_lifespan": 86400,
    "node_port": null,
    "service_type": "ClusterIP"
  },
  "SecretRef": {
    "key": "password"
  },
  "SlotDomain": {},
  "Slurm": {
    "cluster_name": null,
    "default_partition": null,
    "extra_conf": {},
    "max_time": "UNLIMITED"
  },
  "Storage": {
    "controller_state": {
      "access_mode": "ReadWriteOnce",
      "size": "1Gi",
      "storage_class": null
    },
    "database": {
      "access_mode": "ReadWriteOnce",
      "size": "2Gi",
      "storage_class": null
    },
    "home": {
      "access_mode": "ReadWriteMany",
      "size": "10Gi",
      "storage_class": null
    }
  },
  "Topology": {
    "block_label": null,
    "block_sizes": [],
    "fallback_block_label": null,
    "levels": [],
    "plugin": "flat",
    "preset": null,
    "switch_names": "global",
    "tier_prefix": null,
    "unlabeled": "group"
  },
  "User": {
    "account": null,
    "gid": null,
    "groups": [],
    "shell": "/bin/bash",
    "ssh_keys": []
  },
  "Volume": {
    "access_mode": "ReadWriteOnce",
    "storage_class": null
  },
  "chart": {
    "clusterDomain": "cluster.local",
    "createSecrets": true,
    "hostNetworkSources": []
  }
}
{{- end -}}
