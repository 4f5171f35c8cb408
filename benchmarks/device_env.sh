# Sourced by the device scripts (gpu_smoke.sh, gpu_dataset.sh, studies/host/host_probe.sh): NVLink multicast off in NCCL,
# PyTorch symmetric memory and NVSHMEM; this checkout importable; OUT (results, default ./.device-out), PY
# (the Python, default python3) and GPUS (the CUDA devices torch sees).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-./.device-out}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
GPUS="$($PY -c 'import torch; print(torch.cuda.device_count())')"
