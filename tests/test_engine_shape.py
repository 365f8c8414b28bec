"""The engine's shape as issue 45 fixed it: a dozen tunables, each with its
doc line (function lengths: tests/test_code_shape.py)."""
from pathlib import Path

import pytest

from cachepilot.controller.config import REMOVED_CONTROL, ControlSpec, config_from_dict

ROOT = Path(__file__).resolve().parents[1]
# the service's own settings, which steer no decision
SERVICE = {"interval_s", "mode", "shed_after", "shed_max_rounds", "warmup_intervals",
           "lost_after_intervals", "plan_every_intervals"}


def test_at_most_twelve_tunables_each_with_a_doc_line():
    tunables = set(ControlSpec.model_fields) - SERVICE
    assert len(tunables) <= 12, sorted(tunables)
    source = (ROOT / "controller" / "config.py").read_text()
    body = source[source.index("class ControlSpec"):source.index("class ControllerSpec")]
    lines = body.splitlines()
    for name in tunables:
        at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"{name}:"))
        above, same = lines[at - 1].strip(), lines[at]
        assert above.startswith("#") or "#" in same, f"control.{name} has no doc line"


@pytest.mark.parametrize("field", sorted(REMOVED_CONTROL))
def test_a_removed_field_is_refused_with_what_became_of_it(field):
    with pytest.raises(Exception) as err:
        config_from_dict({"control": {field: 1},
                          "nodes": [{"name": "n", "memory_bytes": "1GiB"}]})
    assert f"control.{field} was removed" in str(err.value)
    assert field not in ControlSpec.model_fields
