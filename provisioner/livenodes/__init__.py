"""Live nodes: the Slurm configuration follows the Kubernetes nodes while the cluster runs.

Pinned pools take their Slurm nodes from labelled Kubernetes nodes. Those nodes are cordoned,
uncordoned, relabelled, added and removed while jobs run; the reconcile loop (second container of
the slurmctld pod) follows them each pass, with no `up` and no restart:

- :mod:`.render` renders slurm.conf, topology.conf, gres.conf(s) and inventory.json from the spec
  and the Kubernetes nodes: the same function for `slurmk8s up`, the pod's render at start (the
  slurmctld container, before slurmctld) and the loop, so the three cannot disagree;
- :mod:`.live` compares that rendering with the files slurmctld runs from (an emptyDir filled at
  start; :mod:`.ready` waits for it), writes what changed and, when more than node availability
  changed, runs `scontrol reconfigure` (Slurm 24.11 re-executes slurmctld with the new files and
  keeps its jobs; a failed reconfigure leaves the old files in place). A Slurm node whose Kubernetes
  node left the pool keeps its place, drained, until its job ends;
- :mod:`.drain` drains the Slurm nodes whose Kubernetes node must not take jobs (cordoned,
  NotReady, leaving) and returns them to service when it may again, never touching a drain set
  by someone else.
"""
