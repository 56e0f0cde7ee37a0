"""The rich console shared by the CLI and the reports."""

from __future__ import annotations

from rich.console import Console

console = Console(highlight=False)
error_console = Console(stderr=True, highlight=False)


def fail(message: str) -> None:
    """One red line on stderr (the CLI exits with code 2 after it)."""
    error_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
