"""``python -m provisioner.controltier``: the login pod's agent."""

import sys

from .agent import agent_main

sys.exit(agent_main())
