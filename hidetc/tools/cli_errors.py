"""How every command reports a user-caused error: `handle_errors` turns a `HidetcError`
into one line `hidetc: error: ...` and exit code 2 (a sanitizer's hazards: one line
each), an interrupt into `hidetc: interrupted` and 130; `--debug` (the root command's
option) shows the traceback instead. Its own module so that every command module
imports it without importing the command group."""
from __future__ import annotations

import functools
import sys

import click

from hidetc.backends.runtime.emulated import SanitizerError
from hidetc.errors import HidetcError


def debugging() -> bool:
    """Whether the root command was given --debug (False outside a click context)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().params.get("debug", False))


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debug = debugging()
        try:
            return fn(*args, **kwargs)
        except SanitizerError as exc:
            if debug:
                raise
            for hazard in exc.hazards:
                click.echo(f"hidetc: hazard: {hazard}", err=True)
            sys.exit(2)
        except HidetcError as exc:
            if debug:
                raise
            click.echo(f"hidetc: error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("hidetc: interrupted", err=True)
            sys.exit(130)
    return wrapper
