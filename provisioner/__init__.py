"""slurmk8s: ephemeral Slurm clusters on Kubernetes capacity."""

__version__ = "0.1.0"
