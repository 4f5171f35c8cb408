# Sourced by the device scripts (gpu_smoke.sh, gpu_dataset.sh, gpu_tp4.sh, studies/host/host_probe.sh): NVLink
# multicast off in NCCL, PyTorch symmetric memory and NVSHMEM; this checkout importable; OUT (results, default
# ./.device-out), PY (the Python, default python3), GPUS (the CUDA devices torch sees) and HWID (their hardware
# id, features.hardware.hardware_id_of: h200x4, h100x4, ...; cpux0 without a GPU).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-./.device-out}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
read -r GPUS HWID < <("$PY" -c 'import torch
from ficco.features.hardware import hardware_id_of
n = torch.cuda.device_count()
print(n, hardware_id_of(torch.cuda.get_device_name(0), n) if n else "cpux0")')
