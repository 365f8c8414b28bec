"""The `cachepilot` command: one dispatcher, each component owns its commands.

Every component exposes `register(subparsers)` in its own `cli` module; a
command's handler returns an exit code.  A UserError becomes one line on
stderr and a non-zero exit, never a traceback.
"""
import argparse
import importlib
import sys

from cachepilot.errors import UserError

# module path -> registers these commands
COMMAND_MODULES = [
    "cachepilot.models.cli",        # mrc, trace
    "cachepilot.models.policy_cli",  # policy check, policy list, register-tids
    "cachepilot.agent.cli",         # agent, profile
    "cachepilot.agent.exporter",    # exporter
    "cachepilot.controller.cli",    # controller, run, admin
    "cachepilot.controller.plan_cli",  # plan
]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="cachepilot",
        description="An autopilot for the Linux page cache on multi-tenant hosts.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
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
    parser = build_parser()
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
