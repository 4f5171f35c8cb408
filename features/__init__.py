"""ficco's shared vocabulary: scenarios, schedules, hardware profiles and the feature vector.

Imports with nothing but the standard library and numpy: it runs on the GPU machine's image as well.
"""

from ficco.features.hardware import DEFAULT_HARDWARE_ID, KNOWN_HARDWARE, HardwareProfile, get_hardware
from ficco.features.ops import OP_SPECS, OpSpec
from ficco.features.routing import Routing
from ficco.features.scenario import DENSE_OPS, DTYPE_BYTES, DTYPES, MODES, MOE_OPS, OPS, Mode, Scenario
from ficco.features.schedule import (
    SCHEDULE_FAMILIES,
    SCHEDULE_INDEX,
    SCHEDULES,
    SERIAL,
    Schedule,
    ScheduleTable,
    all_schedules,
    candidates,
    parse_schedule_table,
)
from ficco.features.vector import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FEATURE_SCHEMAS,
    feature_dict,
    feature_matrix,
    feature_vector,
    roofline_comm_us,
    roofline_gemm_us,
)

__all__ = [
    "DEFAULT_HARDWARE_ID",
    "DENSE_OPS",
    "DTYPES",
    "DTYPE_BYTES",
    "FEATURE_NAMES",
    "FEATURE_SCHEMAS",
    "FEATURE_SCHEMA_VERSION",
    "KNOWN_HARDWARE",
    "MODES",
    "MOE_OPS",
    "OPS",
    "OP_SPECS",
    "SCHEDULES",
    "SCHEDULE_FAMILIES",
    "SCHEDULE_INDEX",
    "SERIAL",
    "HardwareProfile",
    "Mode",
    "OpSpec",
    "Routing",
    "Scenario",
    "Schedule",
    "ScheduleTable",
    "all_schedules",
    "candidates",
    "feature_dict",
    "feature_matrix",
    "feature_vector",
    "get_hardware",
    "parse_schedule_table",
    "roofline_comm_us",
    "roofline_gemm_us",
]
