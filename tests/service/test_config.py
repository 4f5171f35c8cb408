"""Settings from FICCO_* variables, and the reload-token rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ficco.service.core.config import Settings


def test_settings_read_ficco_environment(monkeypatch):
    monkeypatch.setenv("FICCO_MODEL_ROOT", "/srv/models")
    monkeypatch.setenv("FICCO_PORT", "9001")
    monkeypatch.setenv("FICCO_MAX_BATCH", "7")
    monkeypatch.setenv("FICCO_RELOAD_TOKEN", "x" * 20)
    settings = Settings()
    assert (Path("/srv/models"), 9001, 7) == (settings.MODEL_ROOT, settings.PORT, settings.MAX_BATCH)
    assert settings.RELOAD_TOKEN.get_secret_value() == "x" * 20
    assert "x" * 20 not in repr(settings)


def test_settings_defaults(monkeypatch):
    for name in ("FICCO_MODEL_ROOT", "FICCO_RELOAD_TOKEN", "FICCO_HOST", "FICCO_PORT"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert (settings.HOST, settings.PORT, settings.DEFAULT_HARDWARE) == ("127.0.0.1", 8000, "h200x2")
    assert settings.RELOAD_TOKEN is None
    assert settings.MAX_BATCH == 10_000 and settings.MAX_BODY_BYTES == 4 << 20


def test_settings_short_reload_token_names_variable(monkeypatch):
    monkeypatch.setenv("FICCO_RELOAD_TOKEN", "short")
    with pytest.raises(ValidationError, match="FICCO_RELOAD_TOKEN must be at least 16"):
        Settings()


def test_settings_options_override_environment(monkeypatch):
    monkeypatch.setenv("FICCO_PORT", "9001")
    assert Settings(PORT=9002).PORT == 9002
