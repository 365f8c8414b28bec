"""The `cachepilot` command: one dispatcher, each component owns its commands.

Every component exposes `register(subparsers)` in its own `cli` module; a
command's handler returns an exit code.  A UserError becomes one line on
stderr and a non-zero exit, never a traceback.
"""
import argparse
import importlib
import sys

from cachepilot.core.errors import UserError

# module path -> registers these commands
# Each component's command module and the commands it registers.
COMMAND_MODULES = {
    "cachepilot.models.cli": ("mrc", "trace"),
    "cachepilot.models.policy_cli": ("policy",),
    "cachepilot.agent.cli": ("agent", "profile"),
    "cachepilot.agent.exporter": ("exporter",),
    "cachepilot.controller.cli": ("controller", "admin"),
    "cachepilot.run": ("run",),
    "cachepilot.controller.plan_cli": ("plan",),
    "cachepilot.controller.replay": ("replay",),
    "cachepilot.doctor": ("doctor",),
    "cachepilot.certs": ("certs",),
}


def build_parser(command: str | None = None):
    """The parser; given the command being run, only the module that owns
    it is imported (a small command such as `exporter` should not pay for
    numpy and gRPC, least of all under emulation), else all of them."""
    parser = argparse.ArgumentParser(
        prog="cachepilot",
        description="An autopilot for the Linux page cache on multi-tenant hosts.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    owners = [m for m, cmds in COMMAND_MODULES.items() if command in cmds]
    for name in owners or COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            # A component still being built; its commands are simply absent.
            if err.name and err.name.startswith("cachepilot"):
                continue
            raise
        module.register(sub)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"cachepilot {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
