"""The ``ovsproxy`` command.

Subcommands live in their own modules and are imported only when used, so ``ovsproxy check``
does not pay for pyroute2 or ovsdbapp, and each command's module is owned by its package.
"""

from __future__ import annotations

import importlib

import click

from ovsproxy import __version__

# command name -> "module:attribute" (a click.Command)
COMMANDS: dict[str, str] = {
    "run": "ovsproxy.cli.run_cmd:run",
    "demo": "ovsproxy.cli.demo_cmd:demo",
    "status": "ovsproxy.cli.status_cmd:status",
    "dump": "ovsproxy.cli.status_cmd:dump",
    "check": "ovsproxy.cli.check_cmd:check",
    "sandbox": "ovsproxy.cli.sandbox_cmd:sandbox",
    "verify": "ovsproxy.cli.verify_cmd:verify",
    "lab": "ovsproxy.cli.lab_cmd:lab",
    "trace": "ovsproxy.cli.trace_cmd:trace",
    "cleanup": "ovsproxy.cli.cleanup_cmd:cleanup",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # command not built yet; real import errors propagate
                return None
            raise
        command: click.Command = getattr(module, attr)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ovsproxy")
def main() -> None:
    """Kubernetes Service proxy for Open vSwitch."""
