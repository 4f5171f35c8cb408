"""ficco: a learned schedule predictor for compute/communication overlap, with a copy-engine executor.

The subpackages are ``ficco.features``, ``ficco.executor``, ``ficco.harness``, ``ficco.training`` and
``ficco.service``. An installed wheel holds them under ``ficco/`` (pyproject's ``package-dir`` maps them);
a source checkout keeps them at the repository root, where the README's architecture table puts them, and
this package's search path then includes that root, so ``import ficco.features`` works from a checkout
(tests, torchrun scripts on a GPU machine) without installing anything.
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
