"""How the CLI tests call ``worldctl``: in process through click's runner (exceptions
propagate, so a bug is a failing test, not an exit code), and what a refusal must look
like (exit 2, one ``error:`` line on stderr, no traceback)."""

from __future__ import annotations

from click.testing import CliRunner, Result

from worldctl.main import cli


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(cli, list(args), prog_name="worldctl",
                                     catch_exceptions=False)


def refused(result: Result) -> str:
    """The one error line of a refused command."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]
