"""Idle sleep and wake of the control tier (slurmctld, slurmdbd, the database, and the login pod
where the spec lets it sleep).

What is in the tier: every StatefulSet / Deployment of the cluster's namespace labelled
``slurmk8s.io/tier=control``. They sleep in the order login -> slurmctld -> slurmdbd -> database
(anything else labelled last) and wake in the reverse order, each by its
``app.kubernetes.io/component`` label. Sleeping scales them to zero replicas; volumes, Services and
Secrets stay.

Who does what
-------------
- The reconcile loop (slurmctld pod, :mod:`provisioner.reconcile`) decides: with
  ``elasticity.idle_teardown`` set, an :class:`IdleTracker` is fed one :class:`Activity` per pass
  (active jobs, worker pods, SSH sessions on the login pod and the time of the last Slurm command /
  login there); once nothing was active for ``idle_teardown`` it runs :func:`sleep_tier`.
- Wakers: ``slurmk8s submit`` / ``slurmk8s ssh`` (the user's kubeconfig), and the login pod's
  agent (:func:`.agent.agent_main`, a sidecar with its own ServiceAccount that may only scale the tier),
  which a plain ``sbatch`` (and every other Slurm command, and each SSH login) on the login pod asks
  on a Unix socket shared with the login container (callers named by their kernel uid,
  connections capped: :class:`.agent.WakeServer`). Both run :func:`wake_tier`.
- Record: annotations on the ConfigMap slurmk8s-tier-state (``slurmk8s.io/state`` awake|asleep,
  ``slurmk8s.io/state-reason``, ``slurmk8s.io/state-since`` RFC3339), one Kubernetes Event per
  sleep and wake (reason ``ControlTierSleep`` / ``ControlTierWake``; a waker leaves a
  ``WakeRequested`` Event naming who and why, which the woken loop turns into the annotation), and
  the reconcile log.

Kubernetes is reached through :class:`TierApi` (a handful of calls, dicts in and out):
:class:`ClientTierApi` with the official client, an in-memory fake for the unit tests (tests/fakes/tier.py).

Modules: :mod:`.decision` (pure: workloads, order, state, the idle tracker), :mod:`.api` (the
Kubernetes calls), :mod:`.tier` (sleep and wake), :mod:`.agent` (the login pod's sidecar; run as
``python -m provisioner.controltier``).
"""
