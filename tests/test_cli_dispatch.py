"""The dispatcher imports only the module that owns the command run; its
table must name exactly what each module registers."""
import argparse
import importlib
import subprocess
import sys

from cachepilot.main import COMMAND_MODULES


def test_the_table_names_what_each_module_registers():
    for module, commands in COMMAND_MODULES.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="command")
        importlib.import_module(module).register(sub)
        assert set(sub.choices) == set(commands), module


def test_a_small_command_does_not_import_the_engine():
    code = ("import sys; from cachepilot.main import build_parser; "
            "build_parser('exporter'); "
            "print(sorted(m for m in ('numpy', 'grpc', 'cachepilot.models.cli') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
