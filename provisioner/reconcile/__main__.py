"""``python -m provisioner.reconcile``: the reconcile daemon (``slurmk8s-reconcile``)."""

import sys

from .main import main

sys.exit(main())
