"""Deploying a cluster with Pulumi: the program (``program``), its generated keys (``secrets``), the
Automation API driver behind ``slurmk8s up | preview | down | outputs`` (``automation``) and those
commands (``commands``). Importing this package imports none of them."""
