"""The `slurmk8s` command line. Thin: parses arguments, calls the layers below, prints results."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="slurmk8s",
    help="Ephemeral Slurm clusters on Kubernetes capacity.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# Sub-command groups are registered below, one line each (keep this list sorted by name).
# --- sub-apps ---
# --- end sub-apps ---


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
