"""The in-cluster reconcile loop: finds workers and Slurm nodes that disagree, fixes them, says why,
and serves the cluster's Prometheus metrics.

How it is run (second container of the slurmctld pod)
-----------------------------------------------------
- command: ``slurmk8s-reconcile --period 10 --metrics-port 9410`` (``--once`` runs one pass and
  exits: tests, debugging; ``--metrics-port 0`` serves no metrics).
- image: the slurmctld image (it has scontrol / squeue, the auth key setup and the provisioner venv).
- user: SlurmUser (``scontrol update`` needs SlurmUser or root), with the same Slurm client config
  and auth key as slurmctld (slurm.conf under /etc/slurm, munge / auth key from the secret).
- env: the elastic programs' settings, read the same way (process environment over
  ``SLURMK8S_ENV_FILE``, default /etc/slurmk8s/elastic.env): ``SLURMK8S_BACKEND=kubernetes``,
  ``SLURMK8S_INVENTORY``, ``SLURMK8S_SPEC`` / ``SLURMK8S_SITE`` / ``SLURMK8S_NAMESPACE``; and
  ``SLURMK8S_LOG`` (this loop logs to ``reconcile.log`` beside it unless ``SLURMK8S_RECONCILE_LOG``),
  ``SLURMK8S_EVENTS`` (default /var/log/slurmk8s/events.jsonl, written by the resume / suspend
  programs, tailed here for metrics), ``SLURMK8S_LEDGER`` (default
  /var/spool/slurmctld/slurmk8s/ledger.json), ``SLURMK8S_USAGE`` (default
  /var/spool/slurmctld/slurmk8s/usage.json: the node-seconds tally since `up`, saved every pass and
  continued after a restart or a wake from sleep), ``SLURMK8S_BACKOFF_FAILURES`` / ``_WINDOW`` /
  ``_COOLOFF`` (3 / 600 / 300).
- volumes: the StateSaveLocation PVC at /var/spool/slurmctld (the failure ledger must survive a
  restart and is shared with ResumeProgram), the same /var/log/slurmk8s volume as the slurmctld
  container (an emptyDir shared by both containers: events file and logs), the slurm config
  (/etc/slurm, with inventory.json), the spec ConfigMap (/etc/slurmk8s/spec), elastic.env, the auth
  key secret, and the ServiceAccount token.
- port: 9410/TCP, name ``metrics``, path ``/metrics`` (Prometheus text format).
- RBAC: the slurmctld ServiceAccount's pod rights in its own namespace; the loop itself uses only
  pods list and watch (the workers are listed once, then followed by a watch:
  :mod:`provisioner.elastic.podwatch`; each pass lists one pod to see the API answer, and the
  nodes about to be set DOWN for a missing worker are asked of the API itself), delete
  (backend.delete, which gets the pod first), and get of its own
  pod once at start (the owning StatefulSet's uid keys the node-seconds tally to this `up`).
- probes: ``/metrics`` answers while the loop runs; ``slurmk8s_reconcile_last_run_timestamp_seconds``
  tells whether passes still complete.

What it does, each period
-------------------------
fetch (workers from the backend first, then ``scontrol show nodes --json``, the inventory, the
failure ledger and ``squeue --json``, whose running jobs tell a worker restarted under its job)
-> :func:`classify` (pure, one :class:`Finding` per disagreement, each with a
:class:`Kind` and a detail) -> the actions of :data:`ACTIONS` for that kind -> one log line per
finding with what was done and why. The pool backoff (``consecutive failures >= N within a window
-> refuse resumes for a cooling-off period``) is computed from the :class:`FailureLedger`, which the
resume / resume-fail programs and this loop all write; the resume program reads it and refuses
nodes of a pool in backoff at once (reason ``backoff``).

With ``elasticity.idle_teardown`` in the spec, each pass also feeds :class:`IdleWatch` (jobs,
workers, the login pod's SSH sessions), which puts the control tier to sleep after that long idle
(:mod:`provisioner.controltier`); sleeps and wakes are also logged to ``SLURMK8S_TIER_LOG``
(default /var/spool/slurmctld/slurmk8s/control-tier.log, on the state volume).

Modules
-------
:mod:`.classify` (pure: findings and the actions for each kind), :mod:`.act` (one pass),
:mod:`.metrics` (the Prometheus metrics and their catalogue), :mod:`.usage` (node-seconds since
``up``), :mod:`.idle` (idle sleep of the control tier) and :mod:`.main` (the daemon). Slurm's JSON is
parsed by :mod:`provisioner.slurm.state` (shared with ``slurmk8s status``); the failure ledger and
the events file are the elasticity programs' own (:mod:`provisioner.elastic.ledger`,
:mod:`provisioner.elastic.events`).
"""
