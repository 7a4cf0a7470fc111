"""Every test starts with no cached accelerator and no DS_ACCELERATOR, whatever ran before."""
import pytest

from deepspeed.accelerator import reset_accelerator


@pytest.fixture(autouse=True)
def fresh_accelerator(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    reset_accelerator()
    yield
    reset_accelerator()
