"""Hardware profiles: the machine a scenario runs on, as the feature vector and the sim backend see it."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ficco.features._roundtrip import JsonRoundTrip
from ficco.features._validate import check_float, check_int


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareProfile(JsonRoundTrip):
    """One multi-GPU machine (a single NVLink / Infinity Fabric domain).

    Rates are per GPU. ``link_gbps`` is what one GPU can send in one direction to its peers in total
    (NVLink 4 on H100/H200: 18 links x 25 GB/s = 450 GB/s).
    """

    id: str = "h200x2"
    """Short identifier, used as the registry key of models and datasets (e.g. ``h200x2``)."""
    gpu_name: str = "NVIDIA H200"
    """The name ``nvidia-smi`` / ``torch.cuda.get_device_name`` reports."""
    gpu_count: int = 2
    """GPUs in the machine; a scenario's world size may not exceed it."""
    interconnect: str = "NVLink4 NV18"
    """How the GPUs are linked, as ``nvidia-smi topo -m`` describes it."""
    peak_bf16_tflops: float = 989.0
    """Dense bf16 tensor-core peak, TFLOP/s (datasheet; fp16 is the same, fp32 uses the tf32 rate / 2)."""
    hbm_gbps: float = 4800.0
    """Device memory bandwidth, GB/s."""
    link_gbps: float = 450.0
    """Per-direction GPU-to-peers bandwidth, GB/s."""
    sm_count: int = 132
    """Streaming multiprocessors (compute units) per GPU."""

    def __post_init__(self) -> None:
        if not self.id or not self.id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(
                "HardwareProfile.id must be a non-empty string of letters, digits, '-' or '_'; "
                f"got {self.id!r}"
            )
        check_int("HardwareProfile", "gpu_count", self.gpu_count, 1, 64)
        check_float("HardwareProfile", "peak_bf16_tflops", self.peak_bf16_tflops, 1.0)
        check_float("HardwareProfile", "hbm_gbps", self.hbm_gbps, 1.0)
        check_float("HardwareProfile", "link_gbps", self.link_gbps, 0.1)
        check_int("HardwareProfile", "sm_count", self.sm_count, 1, 1024)


def _h200(count: int) -> HardwareProfile:
    return HardwareProfile(id=f"h200x{count}", gpu_count=count)


def _h100(count: int) -> HardwareProfile:
    return HardwareProfile(
        id=f"h100x{count}", gpu_name="NVIDIA H100 80GB HBM3", gpu_count=count, hbm_gbps=3350.0
    )


KNOWN_HARDWARE: dict[str, HardwareProfile] = {
    p.id: p
    for p in (
        *map(_h200, (2, 4, 8)),
        *map(_h100, (2, 4, 8)),
        HardwareProfile(
            id="mi300xx8",
            gpu_name="AMD Instinct MI300X",
            gpu_count=8,
            interconnect="Infinity Fabric, fully connected, 7 x 50 GB/s",
            peak_bf16_tflops=1307.0,
            hbm_gbps=5300.0,
            link_gbps=350.0,
            sm_count=304,
        ),
    )
}
"""Built-in profiles (datasheet figures). Measured datasets record their own fingerprint beside these."""

DEFAULT_HARDWARE_ID = "h200x2"
"""The hardware that scenarios, plans, commands and the service default to (the shipped model's)."""


NEW_PROFILE_HINT = "A machine of another id needs its HardwareProfile JSON file first (docs/new-hardware.md)."
"""What to do for hardware of no known profile (the last sentence of every unknown-id error)."""


def did_you_mean(value: str, known: Iterable[str]) -> str:
    """``" (did you mean 'h200x2'?)"`` naming the id of ``known`` closest to ``value`` (``difflib``, case
    ignored), or ``""`` when none is close."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def get_hardware(hardware_id: str) -> HardwareProfile:
    """Return the built-in profile ``hardware_id``; raise ``ValueError`` listing the known ids otherwise."""
    try:
        return KNOWN_HARDWARE[hardware_id]
    except KeyError:
        raise ValueError(
            f"unknown hardware id {hardware_id!r}{did_you_mean(hardware_id, KNOWN_HARDWARE)}; known ids are "
            f"{sorted(KNOWN_HARDWARE)}"
        ) from None


def hardware_of(gpu_name: str, gpu_count: int) -> HardwareProfile | None:
    """The built-in profile of ``gpu_count`` GPUs of the model ``gpu_name`` names (what
    ``torch.cuda.get_device_name`` reports: ``NVIDIA H100 80GB HBM3`` is an H100), or None."""
    model = _gpu_model(gpu_name)
    for profile in KNOWN_HARDWARE.values():
        if profile.gpu_count == gpu_count and model and _gpu_model(profile.gpu_name) == model:
            return profile
    return None


def hardware_id_of(gpu_name: str, gpu_count: int) -> str:
    """The id of ``gpu_count`` GPUs named ``gpu_name`` (as ``torch.cuda.get_device_name`` gives it): the
    built-in profile's (``NVIDIA H100 80GB HBM3`` x 4 -> ``h100x4``), else the GPU model (or the name) as a
    slug with ``x<count>`` (``NVIDIA B200`` x 4 -> ``b200x4``)."""
    profile = hardware_of(gpu_name, gpu_count)
    if profile is not None:
        return profile.id
    model = _gpu_model(gpu_name)
    slug = model.lower() if model else re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return f"{slug or 'gpu'}x{gpu_count}"


def check_gpu_model(profile: HardwareProfile, gpu_name: str) -> None:
    """ValueError where ``gpu_name`` (the GPU found) is another model than ``profile``'s GPUs (measurements
    of one GPU would be filed under another's id); names the id that fits. Names without a model pass."""
    found, named = _gpu_model(gpu_name), _gpu_model(profile.gpu_name)
    if found and named and found != named:
        fits = hardware_id_of(gpu_name, profile.gpu_count)
        raise ValueError(
            f"hardware {profile.id} is a profile of {profile.gpu_name} GPUs, not of this machine's "
            f"{gpu_name}: use hardware {fits} (a profile JSON file registers one not built in)"
        )


def _gpu_model(name: str) -> str:
    """The model in a GPU's name: ``NVIDIA H200`` -> ``H200``, ``AMD Instinct MI300X`` -> ``MI300X``; ''."""
    found = re.search(r"\b[A-Z]+\d{2,}[A-Z]*\b", name)
    return found.group(0) if found else ""


PROFILE_FILE = "hardware.json"
"""A custom profile registered under a registry root: ``<root>/<hardware_id>/hardware.json``."""


def registered_profile(root: str | Path, hardware_id: str) -> HardwareProfile | None:
    """The custom profile registered as ``hardware_id`` under ``root`` (``register_profile``), or None."""
    path = Path(root) / hardware_id / PROFILE_FILE
    if not path.is_file():
        return None
    return HardwareProfile.from_json(path.read_text())


def register_profile(root: str | Path, profile: HardwareProfile) -> HardwareProfile:
    """Record a custom ``profile`` under ``root`` so that its id names it in every command; return it.

    A built-in id is not recorded (a what-if of it, with other figures, is used as given but not by id).
    ValueError when the id is already registered with other figures.
    """
    from ficco.files import write_text_atomic

    if profile.id in KNOWN_HARDWARE:
        return profile
    existing = registered_profile(root, profile.id)
    if existing is not None and existing != profile:
        raise ValueError(
            f"hardware id {profile.id!r} is registered under {root} with other figures ({existing}); give "
            f"this profile another id, or remove {Path(root) / profile.id / PROFILE_FILE}"
        )
    if existing is None:
        path = Path(root) / profile.id / PROFILE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, profile.to_json() + "\n", mode=0o644)
    return profile


def registered_profiles(root: str | Path) -> dict[str, HardwareProfile]:
    """Every custom profile registered under ``root`` (``register_profile``), by id; one that cannot be read
    is left out (the command naming it says why)."""
    found = {}
    for path in sorted(Path(root).glob(f"*/{PROFILE_FILE}")):
        try:
            found[path.parent.name] = HardwareProfile.from_json(path.read_text())
        except (OSError, ValueError, TypeError):
            continue
    return found


def find_hardware(hardware_id: str, root: str | Path) -> HardwareProfile:
    """The built-in profile ``hardware_id``, else the custom one registered under ``root``; ValueError
    naming both kinds of known ids otherwise."""
    if hardware_id in KNOWN_HARDWARE:
        return KNOWN_HARDWARE[hardware_id]
    custom = registered_profile(root, hardware_id)
    if custom is not None:
        return custom
    registered = sorted(registered_profiles(root))
    raise ValueError(
        f"unknown hardware id {hardware_id!r}{did_you_mean(hardware_id, [*KNOWN_HARDWARE, *registered])}; "
        f"built-in ids are {sorted(KNOWN_HARDWARE)}, custom ones registered under {root} are {registered} (a "
        f"profile JSON file given as --hardware registers its id). {NEW_PROFILE_HINT}"
    )


def load_hardware(value: str, root: str | Path | None = None) -> HardwareProfile:
    """The profile ``value`` names: a built-in id, a custom id registered under the model registry ``root``
    (default: ``ficco.files.model_root()``), or a JSON file holding a ``HardwareProfile`` (what-if hardware),
    which registers its id there for the other commands. ``ValueError`` naming what is wrong and what is
    allowed otherwise (a registry id of simulated models, an unknown id, a file that cannot be read)."""
    from ficco.features.provenance import MEASURED, is_sim_id, registry_id

    if is_sim_id(value):
        raise ValueError(
            f"{value!r} is the registry id of simulated models; name the hardware itself, "
            f"{registry_id(value, MEASURED)!r} (with --backend sim for a simulated sweep)"
        )
    if root is None:
        from ficco.files import model_root

        root = model_root()
    try:
        if value.endswith(".json"):
            return register_profile(root, HardwareProfile.from_json(Path(value).read_text()))
        return find_hardware(value, root)
    except OSError as err:
        raise ValueError(str(err)) from None
