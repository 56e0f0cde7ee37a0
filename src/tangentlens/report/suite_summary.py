"""A rich summary of a checkpoint suite: steps, tokens seen, held-out loss per checkpoint."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from tangentlens.models.suites import CatalogueSuite, CheckpointSuite, MiniSuite, SuiteIntegrity
from tangentlens.report.console import console


def _tokens(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def render_suite(
    suite: CheckpointSuite, steps: Sequence[int] | None = None, *, verify: bool = False
) -> None:
    """Print the suite's header facts and a table of its (selected) checkpoints; with
    ``verify``, what :meth:`CheckpointSuite.verify` finds over them and the final checkpoint."""
    steps = list(steps) if steps is not None else list(suite.steps)
    console.rule(f"[bold]{suite.name}[/] · {suite.kind} · {suite.family}")
    facts = [f"{len(suite.steps)} checkpoints ({steps[0]} … {steps[-1]} shown: {len(steps)})"]
    losses: dict[int, float] = {}
    masked: dict[int, float] = {}
    train_losses: dict[int, float | None] = {}
    if isinstance(suite, MiniSuite):
        meta = suite.metadata
        data = meta["data"]
        facts += [
            f"{suite.tokens_per_step} tokens per step; {_tokens(data['train_tokens'])} training "
            f"tokens, {_tokens(data['heldout_tokens'])} held-out tokens "
            f"({data['train_documents']} / {data['heldout_documents']} documents)",
            f"unigram entropy of the corpus: {meta['unigram_entropy']:.3f} nats; "
            f"trained in {meta['training_seconds']:.0f} s; cached at {suite.root}",
        ]
        losses = suite.validation_loss()
        masked = suite.masked_validation_loss()
        train_losses = {int(s): c["train_loss"] for s, c in meta["checkpoints"].items()}
    if isinstance(suite, CatalogueSuite):
        entry = suite.entry
        per_step = entry.tokens_per_step
        facts += [
            f"{'verified' if entry.verified else '[yellow]UNVERIFIED[/]'}: {entry.source}",
            f"loader {entry.loader}; "
            + (f"{per_step:,} tokens per step" if per_step else "tokens per step unknown")
            + f"; revisions {entry.revisions[0][1]} … {entry.revisions[-1][1]}",
        ]
        if entry.note:
            facts.append(f"note: {entry.note}")
    for line in facts:
        console.print(f"  {line}")
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("step", justify="right")
    table.add_column("tokens seen", justify="right")
    revisions = isinstance(suite, CatalogueSuite)
    if revisions:
        table.add_column("revision")
    if losses:
        table.add_column("train loss", justify="right")
        table.add_column("held-out loss", justify="right")
    if masked:
        table.add_column("at [MASK] inputs", justify="right")
    for step in steps:
        row = [str(step), _tokens(suite.tokens_seen(step))]
        if revisions:
            row.append(suite.revision(step))
        if losses:
            train = train_losses.get(step)
            row += ["–" if train is None else f"{train:.3f}", f"{losses[step]:.3f}"]
        if masked:
            row.append(f"{masked[step]:.3f}" if step in masked else "–")
        table.add_row(*row)
    console.print(table)
    if verify:
        report = suite.verify(steps)
        render_integrity(report, published=suite.published_config() is not None)
        if report.problems():
            raise ValueError(f"{len(report.problems())} damaged or inconsistent checkpoint(s)")


def render_integrity(report: SuiteIntegrity, *, published: bool = False) -> None:
    """Identical, damaged and inconsistent checkpoints, configs that are not the published one
    (``published``: the suite has one to compare with), what could not be checked, and what
    was verified — or that nothing was."""
    for dup in report.duplicates:
        console.print(
            f"[yellow]identical checkpoints:[/] steps {dup.previous} and {dup.step} have the same "
            f"weights ({dup.weights_hash[:12]})"
        )
    for line in report.problems():
        console.print(f"[red]{escape(line)}[/]", soft_wrap=True)
    for line in report.warnings():
        console.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)
    if report.not_checked:
        steps = ", ".join(map(str, report.not_checked))
        console.print(f"[dim]not on this machine, not checked: steps {steps}[/]")
    if not report.checked:
        console.print("[yellow]nothing verified:[/] none of these checkpoints is on this machine")
    elif not (report.duplicates or report.problems() or report.warnings()):
        steps = ", ".join(map(str, report.checked))
        as_published = ", each config.json the published one" if published else ""
        console.print(
            f"[green]checkpoints verified[/] (steps {steps}): weights whole, configs "
            f"consistent{as_published}, no duplicates",
            soft_wrap=True,
        )
