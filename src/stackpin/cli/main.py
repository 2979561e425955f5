"""The ``stackpin`` entry point: the command group, error-to-exit-code mapping, --debug."""

from __future__ import annotations

import signal
from typing import Any

import click

from stackpin import __version__
from stackpin.cli import registry
from stackpin.errors import EXIT_INTERRUPTED, HostEnvironmentError, StackpinError
from stackpin.untrusted import shown

EXIT_BUG = 1
USAGE = click.UsageError.exit_code  # 2, README: usage


class _Group(click.Group):
    """Maps every error to its exit code and one line on stderr (traceback with --debug).

    A usage error (an unknown option, an argument naming a missing path or a path of the
    wrong kind) is exit 2; StackpinError carries its own code; an OSError the code did not
    expect is the host's (exit 8); anything else is a bug in stackpin (exit 1).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return registry.verbs()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return registry.load(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise  # a bare group: its help is the answer
        except click.UsageError as exc:
            # One line like every other error, naming the argument and where help is.
            where = exc.ctx.command_path if exc.ctx else "stackpin"
            _line(f"stackpin: usage error: {exc.format_message()} (see '{where} --help')")
            ctx.exit(USAGE)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except StackpinError as exc:
            if _debug(ctx):
                raise
            _line(f"stackpin: {exc.kind} error: {exc.message}")
            for line in exc.details[1:] if len(exc.details) > 1 else ():
                _line(f"  {line}")
            ctx.exit(exc.return_code)
        except KeyboardInterrupt:
            _line("stackpin: interrupted; nothing half-written was left behind")
            ctx.exit(EXIT_INTERRUPTED)
        except OSError as exc:
            if _debug(ctx):
                raise
            where = f" {exc.filename}" if exc.filename else ""
            _line(f"stackpin: environment error: {exc.strerror or exc}{where}; check the path, "
                  "its permissions and free space")
            ctx.exit(HostEnvironmentError.return_code)
        except Exception as exc:  # the one place that catches everything
            if _debug(ctx):
                raise
            _line(f"stackpin: internal error: {type(exc).__name__}: {exc}; this is a bug, "
                  "please report it with the command line and the output of --debug")
            ctx.exit(EXIT_BUG)


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.obj and ctx.obj.get("debug"))


def _line(text: str) -> None:
    """One line on stderr, whatever the message holds (controls and newlines escaped)."""
    click.echo(shown(text, limit=4000), err=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stackpin")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Pinned ABI matrices to verified, reproducible images and offline bundles.

    \b
    Typical flow for a cell (see 'stackpin matrix list'):
      stackpin matrix check            consistency of every pinned wheel and label
      stackpin wheels fetch CELL       fill the offline wheelhouse, write the lock
      stackpin build CELL              offline build of the stable/enhanced images
      stackpin verify CELL             run the verification suite in the image
      stackpin bundle export CELL -o DIR   air-gap bundle

    Exit codes: 0 ok, 2 usage, 3 configuration, 4 validation, 5 build,
    6 verification, 7 bundle, 8 host environment, 130 interrupted; 1 is an
    internal error (a bug: please report it).
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _interrupt_on_sigterm() -> None:
    """Treat SIGTERM (timeout, CI cancel, docker stop) like Ctrl-C.

    Python ends on SIGTERM without running ``finally`` blocks, which would leave temp
    folders, containers and half-written files behind; KeyboardInterrupt unwinds them.
    """

    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main() -> None:
    """Console-script entry point."""
    _interrupt_on_sigterm()
    cli(prog_name="stackpin")


if __name__ == "__main__":  # pragma: no cover
    main()
