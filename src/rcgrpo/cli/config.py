"""`rcgrpo config`: every setting of params.yaml with its value, default, rule and help.

Each field is declared once, in its stage's config dataclass: `ranged(default, "[lo, hi]",
"help")` for a number, `setting(default, "help")` for anything else, a `Literal[...]` annotation
for a choice (rcgrpo.fields). `show` prints that declaration beside the value a run uses: the
params.yaml section, then the preset's layer (`--preset`, default params.yaml pipeline.preset),
the variant's RL fields (`--variant`, default pipeline.variant), then `--set`s, resolved once by
rcgrpo.run_config.resolve as `rcgrpo run`, `rcgrpo stage` and dvc.yaml resolve them (a bad
value fails in the same one line). `comments` writes
the same help into params.yaml as the trailing comment of each field's line (full-line comments,
which say why a value was chosen, are kept); tests/test_config_show.py checks it is up to date.

    rcgrpo config show rl                        # what `make run` and `dvc repro` train with
    rcgrpo config show rollout --preset paper --set rollout.engine=hf
    rcgrpo config show rl --variant rctp+grpo    # what `rcgrpo run --variant rctp+grpo` trains with
    rcgrpo config comments            # rewrite params.yaml's field comments from the help
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="The settings of params.yaml: values, rules, help.")


def rows(cfg) -> list[tuple[str, str, str, str, str]]:
    """(field, value, default, rule, help) of every field of a built config dataclass."""
    from rcgrpo.fields import help_of, rule, show

    hints = typing.get_type_hints(type(cfg))
    out = []
    for f in dataclasses.fields(cfg):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        value = getattr(cfg, f.name)
        mark = "" if value == default else " *"
        value, default = (show(v) if v != "" else '""' for v in (value, default))
        out.append((f.name, value + mark, default, rule(hints[f.name], f), help_of(f)))
    return out


def table(section: str, cfg, width: int = 100) -> str:
    """One section as text: a row of field, value, default and rule per field, its help wrapped
    below it (long values overflow their column rather than wrap)."""
    from rcgrpo.config import SECTIONS

    body = rows(cfg)
    head = ("field", "value", "default", "range / choices")
    sizes = [min(max(len(r[i]) for r in [head, *body]), 28) for i in range(3)]
    lines = [f"{section}:  {SECTIONS[section].replace(':', '.')}  (* = not the default)"]
    for r in [(*head, ""), *body]:
        cells = [c.ljust(n) for c, n in zip(r[:3], sizes, strict=False)]
        lines.append("  " + "  ".join([*cells, r[3]]).rstrip())
        lines.extend(textwrap.wrap(r[4], width, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


@app.command("show")
def show_cmd(
    section: str = typer.Argument("", help="one params.yaml section (default: all of them)"),
    preset: str = typer.Option("", help="this params.yaml preset (e.g. paper) on top"),
    variant: str = typer.Option("", help="this variant's RL fields on top (e.g. rctp+grpo)"),
    set_: list[str] = typer.Option([], "--set", help="section.key=value on top (repeatable)"),
    params: Path = typer.Option(None, help="another params.yaml"),
):
    """Each field: the value a command would use, its default, its range or choices, its help."""
    from rcgrpo.config import SECTIONS, ConfigError, parse_sets, read_params
    from rcgrpo.run_config import resolve

    if section and section not in SECTIONS:
        raise ConfigError(f"config show {section}: no such section; valid: {sorted(SECTIONS)}")
    data = read_params(params)
    sets = parse_sets(set_, sectioned=True, path=params, together=False)
    rc = resolve(data, preset, variant, sets)  # as every front builds it, once
    names = [section] if section else list(SECTIONS)
    typer.echo("\n\n".join(table(s, getattr(rc, s)) for s in names))
    given = [("preset", rc.plan.preset), ("variant", rc.plan.variant), ("--set", " ".join(set_))]
    layers = " + ".join(["params.yaml", *[f"{k} {v}" for k, v in given if v]])
    typer.echo(
        f"\n({layers}: what `rcgrpo run`, `rcgrpo stage` and `dvc repro` run with these options)"
    )


# -- params.yaml comments, written from the help -------------------------------------------------
def _split_comment(rest: str) -> tuple[str, str]:
    """A YAML line's text after `key:` -> (value, comment): the first ` #` outside quotes."""
    quote = ""
    for i, ch in enumerate(rest):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[:i].rstrip(), rest[i:]
    return rest.rstrip(), ""


def with_comments(text: str) -> str:
    """params.yaml `text` with each field line of each section commented by the field's help
    and each section line by its dataclass; every other line is kept as it is."""
    from rcgrpo.config import SECTIONS, section_class
    from rcgrpo.fields import help_of

    out, helps = [], {}
    for line in text.split("\n"):
        key, colon, rest = line.partition(":")
        if colon and key.isidentifier() and line[:1] not in " #":  # a top-level key
            helps = {}
            if key in SECTIONS:
                helps = {f.name: help_of(f) for f in dataclasses.fields(section_class(key))}
                value, _ = _split_comment(rest)
                line = f"{key}:{value}  # {SECTIONS[key].replace(':', '.')}"
        elif colon and line.startswith("  ") and key.strip() in helps and key[2:3] != " ":
            value, _ = _split_comment(rest)
            line = f"{key}:{value}  # {helps[key.strip()]}"
        out.append(line)
    return "\n".join(out)


@app.command("comments")
def comments_cmd(
    check: bool = typer.Option(False, help="only say whether params.yaml is up to date (exit 1)"),
    params: Path = typer.Option(None, help="another params.yaml"),
):
    """Write each field's help as the comment of its params.yaml line."""
    from rcgrpo.config import params_path

    path = Path(params) if params else params_path()
    text = path.read_text()
    new = with_comments(text)
    if check:
        stale = sum(a != b for a, b in zip(text.split("\n"), new.split("\n"), strict=True))
        typer.echo(f"{path}: {stale} comment(s) differ from the help" if stale else "up to date")
        raise typer.Exit(1 if stale else 0)
    if new != text:
        path.write_text(new)
    typer.echo(f"{path}: field comments written from the help")
