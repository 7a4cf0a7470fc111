"""The planner's tests describe models into a cache of their own, never the user's
(``~/.cache/deepspeed/plan``): a test sees a cold cache unless it warms one itself."""
import pytest


@pytest.fixture(autouse=True)
def _private_plan_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_PLAN_CACHE", str(tmp_path / "plan-cache"))
