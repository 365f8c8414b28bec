"""Every example config in configs/ loads, with the loader it is meant for,
and the README names only configs that exist."""
import re
from pathlib import Path

import pytest

from cachepilot.agent.config import load_config as load_agent_config
from cachepilot.controller.config import load_config as load_controller_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_there_are_example_configs():
    names = {p.name for p in CONFIGS}
    assert {"demo.yaml", "controller.yaml", "plan-20.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_loads(path):
    if path.name.startswith("agent-"):
        cfg = load_agent_config(path)
        assert cfg is not None
    else:
        cfg = load_controller_config(path)
        assert cfg.nodes
        known = {n.name for n in cfg.nodes}
        assert all(t.node in known for t in cfg.tenants)


def test_readme_mentions_only_existing_configs():
    readme = (ROOT / "README.md").read_text()
    for name in set(re.findall(r"configs/([\w.-]+\.yaml)", readme)):
        assert (ROOT / "configs" / name).exists(), name
