"""The config foundation both configs stand on (core/config.py): one strict
base, one byte-size type, one path type resolved against the file, one
error formatter and one loader -- and the agent's and the controller's
configs speak alike through them."""
from pathlib import Path

import pytest
from pydantic import Field

from cachepilot.agent.config import load_config as load_agent
from cachepilot.controller.config import load_config as load_controller
from cachepilot.core import config as base
from cachepilot.core.errors import UserError


class Store(base.Strict):
    """A config a later part might add: what it needs comes from the base."""
    path: base.FilePath
    size: base.Bytes = 64 << 20
    keep: int = Field(3, ge=1)


class Top(base.Strict):
    store: Store
    stores: list[Store] = []


def test_a_new_config_gets_sizes_paths_and_errors_from_the_base(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("store: {path: state.db, size: 1GiB}\nstores: [{path: /abs.db}]\n")
    cfg, source = base.load(Top, f)
    assert source == f.resolve()
    assert cfg.store.path == tmp_path.resolve() / "state.db"   # relative to the file
    assert cfg.stores[0].path == Path("/abs.db")
    assert cfg.store.size == 1 << 30
    f.write_text("store: {path: x, keep: 0, sise: 1}\n")
    with pytest.raises(UserError) as err:
        base.load(Top, f)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"{f}: store.keep: expected a number >= 1, got 0" in msg
    assert f"{f}: store.sise: unknown key" in msg


def test_both_configs_word_the_same_mistake_alike(tmp_path):
    agent = tmp_path / "agent.yaml"
    agent.write_text("roots: [/x]\ncgroups: [a]\ninterval_s: -1\nsafety: {floor: lots}\n")
    ctl = tmp_path / "ctl.yaml"
    ctl.write_text("control: {interval_s: -1}\nnodes: [{name: n1, memory_bytes: lots}]\n")
    with pytest.raises(UserError) as a:
        load_agent(agent)
    with pytest.raises(UserError) as c:
        load_controller(ctl)
    assert f"{agent}: interval_s: expected a number > 0, got -1" in str(a.value)
    assert f"{ctl}: control.interval_s: expected a number > 0, got -1" in str(c.value)
    size = 'expected a size such as 4096 or "512MiB"'
    assert f"{agent}: safety.floor: {size}, got 'lots'" in str(a.value)
    assert f"{ctl}: nodes[0].memory_bytes: {size}, got 'lots'" in str(c.value)


def test_the_agents_paths_are_relative_to_its_file(tmp_path):
    agent = tmp_path / "agent.yaml"
    agent.write_text("roots: [/x]\ncache_ext: {policy_dir: pol}\n"
                     "controller: {address: 'h:1', token_file: t, ca_file: /ca.pem,\n"
                     "             cert_file: n.crt, key_file: keys/n.key}\n")
    cfg = load_agent(agent)
    assert cfg.cache_ext.policy_dir == tmp_path.resolve() / "pol"
    assert cfg.controller.token_file == tmp_path.resolve() / "t"
    assert cfg.controller.cert_file == tmp_path.resolve() / "n.crt"
    assert cfg.controller.key_file == tmp_path.resolve() / "keys" / "n.key"
    assert cfg.controller.ca_file == Path("/ca.pem")
    assert cfg.cache_ext.pin_root == Path("/sys/fs/bpf/cachepilot")   # not a file path
