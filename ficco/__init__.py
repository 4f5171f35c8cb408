"""ficco: a learned schedule predictor for compute/communication overlap, with a copy-engine executor.

An installed wheel holds the subpackages (``ficco.features``, ``ficco.executor``, ``ficco.harness``,
``ficco.training``, ``ficco.service``, ``ficco.runtime``) under ``ficco/``; a source checkout keeps them at
the repository root, which this package's search path then includes, so ``import ficco.features`` works
uninstalled.
"""

from pathlib import Path

__version__ = "0.1.0"

_ROOT = Path(__file__).resolve().parent.parent
CHECKOUT: Path | None = (
    _ROOT if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "features" / "__init__.py").is_file() else None
)
"""The source checkout this package runs from (an editable install included), or None when installed."""
if CHECKOUT is not None:
    __path__.append(str(CHECKOUT))
