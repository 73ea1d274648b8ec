"""`pulumi up` in this directory: the same program `slurmk8s up` runs (spec from config slurmk8s:spec)."""
from provisioner.deploy.program import stack_program

stack_program()
