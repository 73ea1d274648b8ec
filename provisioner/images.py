"""`slurmk8s images ...`: build and list the container images (a thin wrapper of images/build.sh).

The images live in the source checkout (images/), not in the installed package, so these
commands need a checkout: the one this module sits in, or the one named by SLURMK8S_REPO.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import List, Optional

import typer

from .errors import SlurmK8sError
from .settings import Cli

IMAGE_NAMES = ("slurmd", "login", "slurmctld")

images_app = typer.Typer(
    help="Build and list the container images (slurmctld, slurmd, login).",
    no_args_is_help=True,
)


class ImagesError(SlurmK8sError, RuntimeError):
    pass


def build_script() -> Path:
    """images/build.sh of the source checkout (SLURMK8S_REPO, else the one holding this module)."""
    root = Path(Cli.from_env(os.environ).repo)
    script = root / "images" / "build.sh"
    if not script.is_file():
        raise ImagesError(
            f"{script} not found: `slurmk8s images` needs a source checkout "
            "(run it from the repository, or set SLURMK8S_REPO to the checkout's root)"
        )
    return script


def _run(args: List[str], capture: bool = False) -> subprocess.CompletedProcess[str]:
    argv = ["bash", str(build_script()), *args]
    return subprocess.run(argv, check=False, text=True, capture_output=capture)


def image_tags(names: Optional[List[str]] = None) -> dict[str, str]:
    """Content-hash tags the images have (or would have) for the current sources, e.g.
    {"slurmd": "slurmk8s/slurmd:0123abcd4567"}. Builds nothing and needs no Docker engine."""
    proc = _run(["--tags", *(names or [])], capture=True)
    if proc.returncode != 0:
        raise ImagesError(proc.stderr.strip() or f"images/build.sh --tags failed ({proc.returncode})")
    tags: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        name, sep, tag = line.partition("=")
        if sep:
            tags[name.strip()] = tag.strip()
    return tags


def _check_names(names: List[str]) -> None:
    unknown = [n for n in names if n not in IMAGE_NAMES]
    if unknown:
        typer.echo(f"error: unknown image(s) {', '.join(unknown)} (known: {', '.join(IMAGE_NAMES)})", err=True)
        raise typer.Exit(2)


@images_app.command("build")
def build(
    names: List[str] = typer.Argument(None, help="Images to build (default: all)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if the hash-tagged image exists."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not use Docker's layer cache."),
) -> None:
    """Ensure Docker and the base image, then build what is not built yet (output streamed)."""
    names = names or []
    _check_names(names)
    args = [*(["--force"] if force else []), *(["--no-cache"] if no_cache else []), *names]
    try:
        rc = _run(args).returncode
    except ImagesError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(rc)


@images_app.command("list")
def list_(
    names: List[str] = typer.Argument(None, help="Images to list (default: all)."),
) -> None:
    """Each image's content-hash tag, whether it is built, and its size."""
    names = names or []
    _check_names(names)
    try:
        rc = _run(["--list", *names]).returncode
    except ImagesError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(rc)


@images_app.command("tags")
def tags(
    names: List[str] = typer.Argument(None, help="Images (default: all)."),
) -> None:
    """Print name=tag lines for the current sources (machine-readable; no Docker needed)."""
    names = names or []
    _check_names(names)
    try:
        for name, tag in image_tags(names).items():
            typer.echo(f"{name}={tag}")
    except ImagesError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
